//! Records of one key each, kept outside the run scripts: where a channel's message about a
//! call is, email link tokens (in the run's slot: the decision script spends them),
//! idempotency keys of started runs (with the hash of the request that started each), and the `webhook-id`s of signed requests.

use super::{GatewayStore, Store, StoreError};
use countersign_model::run::RunId;
use std::collections::HashMap;
use std::time::Duration;

impl Store {
    /// What channel `channel` recorded about call `call_id` (where its message is, or that it
    /// was sent); `None` if nothing was recorded.
    pub async fn channel_ref(
        &self,
        id: &RunId,
        call_id: &str,
        channel: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(redis::cmd("HGET")
            .arg(self.keys.refs_key(id))
            .arg(format!("{call_id}|{channel}"))
            .query_async(&mut self.conn.clone())
            .await?)
    }
    /// Who has approved `call_id` so far, of a call that needs several approvals.
    pub async fn voters(&self, id: &RunId, call_id: &str) -> Result<Vec<String>, StoreError> {
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg(self.keys.votes_key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        let prefix = format!("{call_id}|");
        Ok(fields
            .iter()
            .filter_map(|f| f.strip_prefix(&prefix).map(str::to_string))
            .collect())
    }

    /// The approvals counted so far of a call that needs several, as recorded.
    pub async fn votes(
        &self,
        id: &RunId,
        call_id: &str,
    ) -> Result<Vec<countersign_model::run::Decision>, StoreError> {
        let fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.keys.votes_key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        let prefix = format!("{call_id}|");
        fields
            .iter()
            .filter(|(field, _)| field.starts_with(&prefix))
            .map(|(_, vote)| super::from_json(vote))
            .collect()
    }

    /// What a link token may do, without using it up (the decision script spends it: a
    /// spent token reads `spent:` and its grant until it expires).
    pub async fn peek_link_token(
        &self,
        run: &RunId,
        token_hash: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(redis::cmd("GET")
            .arg(self.keys.link_token_key(run, token_hash))
            .query_async(&mut self.conn.clone())
            .await?)
    }
}

/// What an idempotency key is bound to: the run it started and the hash of that request
/// (stored as `{run_id} {request_hash}`).
#[derive(Debug, PartialEq)]
pub struct IdempotencyRecord {
    /// The run the key started.
    pub run: RunId,
    /// `None` for a record stored by a version that kept the run id alone.
    pub request_hash: Option<String>,
}

impl IdempotencyRecord {
    fn parse(stored: &str) -> Result<Self, StoreError> {
        let (run, hash) = match stored.split_once(' ') {
            Some((run, hash)) => (run, Some(hash.to_string())),
            None => (stored, None),
        };
        let run = RunId::parse(run)
            .ok_or_else(|| StoreError::Corrupt(format!("idempotency record {stored:?}")))?;
        Ok(Self {
            run,
            request_hash: hash,
        })
    }

    /// Whether the record was made by a request with this hash (an old record, which has
    /// none, is taken to be).
    pub fn made_by(&self, request_hash: &str) -> bool {
        self.request_hash
            .as_deref()
            .is_none_or(|h| h == request_hash)
    }
}

impl GatewayStore {
    /// Remembers where a channel's message about a call is.
    pub async fn set_channel_ref(
        &self,
        id: &RunId,
        call_id: &str,
        channel: &str,
        reference: &str,
    ) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("HSET")
            .arg(self.keys.refs_key(id))
            .arg(format!("{call_id}|{channel}"))
            .arg(reference)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Stores what a single-use link token may do, under the token's hash, for `ttl`.
    pub async fn put_link_token(
        &self,
        run: &RunId,
        token_hash: &str,
        grant: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let _: () = redis::cmd("SET")
            .arg(self.keys.link_token_key(run, token_hash))
            .arg(grant)
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Binds an idempotency key to a run id and the hash of the request that started it,
    /// unless the key is bound already; returns what it was bound to before, if anything.
    pub async fn bind_idempotency_key(
        &self,
        key_digest: &str,
        run: &RunId,
        request_hash: &str,
        ttl: Duration,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let previous: Option<String> = redis::cmd("SET")
            .arg(self.keys.idempotency_key(key_digest))
            .arg(format!("{run} {request_hash}"))
            .arg("NX")
            .arg("GET")
            .arg("EX")
            .arg(ttl.as_secs().max(1))
            .query_async(&mut self.conn.clone())
            .await?;
        previous.map(|p| IdempotencyRecord::parse(&p)).transpose()
    }

    /// Remembers a signed request's `webhook-id` (per sender) with the hash of its body, for
    /// `ttl`; returns the body hash it was first seen with, if it was seen before.
    pub async fn remember_webhook_id(
        &self,
        sender: &str,
        webhook_id: &str,
        body_hash: &str,
        ttl: Duration,
    ) -> Result<Option<String>, StoreError> {
        Ok(redis::cmd("SET")
            .arg(self.keys.webhook_id_key(sender, webhook_id))
            .arg(body_hash)
            .arg("NX")
            .arg("GET")
            .arg("EX")
            .arg(ttl.as_secs().max(1))
            .query_async(&mut self.conn.clone())
            .await?)
    }
}
