//! Delegations (see `countersign_model::delegation`): made, used for each decision taken under
//! one, and ended early. All their keys share one Cluster slot, so taking a use and ending
//! are atomic against each other (`lua/delegation_*.lua`).

use super::{GatewayStore, Store, StoreError, from_json, to_json};
use crate::grants::UseOutcome;
use crate::script;
use countersign_model::delegation::{Delegation, DelegationUse, Ended};
use std::time::Duration;

/// How long an ended delegation is kept to be listed.
const KEEP_ENDED: Duration = Duration::from_secs(30 * 86400);

/// The most delegations a listing reads.
const MAX_LISTED: usize = 1000;

fn use_key(used: &DelegationUse) -> String {
    format!("{}|{}", used.run_id, used.call_id)
}

impl Store {
    /// The delegations kept, newest first, at most [`MAX_LISTED`].
    pub async fn delegations(&self) -> Result<Vec<Delegation>, StoreError> {
        let ids: Vec<String> = redis::cmd("ZREVRANGE")
            .arg(self.keys.delegations_key())
            .arg(0)
            .arg(MAX_LISTED - 1)
            .query_async(&mut self.conn.clone())
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET")
                .arg(self.keys.delegation_key(id))
                .arg("def")
                .arg("ended");
        }
        let rows: Vec<(Option<String>, Option<String>)> =
            pipe.query_async(&mut self.conn.clone()).await?;
        rows.into_iter()
            .filter_map(|(def, ended)| Some(read(&def?, ended.as_deref())))
            .collect()
    }

    /// The delegation `id`, if it is kept.
    pub async fn delegation(&self, id: &str) -> Result<Option<Delegation>, StoreError> {
        let (def, ended): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys.delegation_key(id))
            .arg("def")
            .arg("ended")
            .query_async(&mut self.conn.clone())
            .await?;
        def.map(|def| read(&def, ended.as_deref())).transpose()
    }

    /// The decisions taken under delegation `id`, oldest first.
    pub async fn delegation_uses(&self, id: &str) -> Result<Vec<DelegationUse>, StoreError> {
        let raw: Vec<String> = redis::cmd("HVALS")
            .arg(self.keys.delegation_uses_key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        let mut uses = raw
            .iter()
            .map(|u| from_json(u))
            .collect::<Result<Vec<DelegationUse>, _>>()?;
        uses.sort_by_key(|u| u.at);
        Ok(uses)
    }
}

/// A delegation from its stored `def` and `ended`.
fn read(def: &str, ended: Option<&str>) -> Result<Delegation, StoreError> {
    let mut delegation: Delegation = from_json(def)?;
    delegation.ended = ended.map(from_json).transpose()?;
    Ok(delegation)
}

impl GatewayStore {
    /// Makes `delegation`, starting now (Redis's clock) and lasting `lasts`; as stored.
    pub async fn create_delegation(
        &self,
        delegation: &Delegation,
        lasts: Duration,
    ) -> Result<Delegation, StoreError> {
        let args = script::DelegationCreate {
            id: &delegation.id,
            def: &to_json(delegation)?,
            lasts_ms: lasts.as_millis() as u64,
            keep_ms: KEEP_ENDED.as_millis() as u64,
        };
        let stored: String = script::DELEGATION_CREATE
            .invocation(None, &args)
            .key(self.keys.delegation_key(&delegation.id))
            .key(self.keys.delegations_key())
            .invoke_async(&mut self.conn.clone())
            .await?;
        from_json(&stored)
    }

    /// Takes a use of delegation `id` for the decision `used`, if it still stands.
    pub async fn use_delegation(
        &self,
        id: &str,
        used: &DelegationUse,
    ) -> Result<UseOutcome, StoreError> {
        let args = script::GrantUse {
            use_key: &use_key(used),
            use_json: &to_json(used)?,
        };
        let reply: String = script::DELEGATION_USE
            .invocation(None, &args)
            .key(self.keys.delegation_key(id))
            .key(self.keys.delegation_uses_key(id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(match reply.as_str() {
            "ok" => UseOutcome::Counted,
            "again" => UseOutcome::Again,
            _ => UseOutcome::Ended,
        })
    }

    /// Gives back the use `used` took, its decision having been refused.
    pub async fn release_delegation_use(
        &self,
        id: &str,
        used: &DelegationUse,
    ) -> Result<(), StoreError> {
        let args = script::GrantRelease {
            use_key: &use_key(used),
        };
        let _: i64 = script::DELEGATION_RELEASE
            .invocation(None, &args)
            .key(self.keys.delegation_key(id))
            .key(self.keys.delegation_uses_key(id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Ends delegation `id` early; it as it now stands (ended before, it keeps that end) and
    /// whether this ended it, or None if there is no such delegation.
    pub async fn end_delegation(
        &self,
        id: &str,
        ending: &Ended,
    ) -> Result<Option<(Delegation, bool)>, StoreError> {
        let args = script::DelegationEnd {
            ending: &to_json(ending)?,
        };
        let reply: Vec<String> = script::DELEGATION_END
            .invocation(None, &args)
            .key(self.keys.delegation_key(id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        match reply[0].as_str() {
            "missing" => Ok(None),
            now => Ok(Some((read(&reply[1], Some(&reply[2]))?, now == "ended"))),
        }
    }
}
