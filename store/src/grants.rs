//! Standing grants (see `countersign_model::grant`): made once an approval that carries grant
//! terms is recorded, used by the gateway for each later held call they cover, revoked at
//! once. All their keys share one Cluster slot, so counting a use and revoking are atomic
//! against each other (`lua/grant_*.lua`).

use super::{GatewayStore, Store, StoreError, from_json, to_json};
use crate::script;
use countersign_model::grant::{Grant, GrantUse, Revocation};
use std::time::Duration;

/// How long an ended grant is kept to be listed.
pub const KEEP_ENDED: Duration = Duration::from_secs(7 * 86400);

/// What asking a grant for a use answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UseOutcome {
    /// Counted: the call may be decided under the grant.
    Counted,
    /// This call's use was counted before (a redelivery): decide it again.
    Again,
    /// The grant approves nothing more, or not this call: its total has no room for it.
    Ended,
}

impl Store {
    /// The grant `id` as it stands, if it is kept.
    pub async fn grant(&self, id: &str) -> Result<Option<Grant>, StoreError> {
        Ok(self.grants(&[id.to_string()]).await?.pop())
    }

    /// The calls grant `id` approved, oldest first.
    pub async fn grant_uses(&self, id: &str) -> Result<Vec<GrantUse>, StoreError> {
        let raw: Vec<String> = redis::cmd("HVALS")
            .arg(self.keys.grant_uses_key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        let mut uses = raw
            .iter()
            .map(|u| from_json(u))
            .collect::<Result<Vec<GrantUse>, _>>()?;
        uses.sort_by_key(|u| u.at);
        Ok(uses)
    }

    /// The grants on `agent`'s `tool` that have not expired (revoked and used-up ones
    /// included: the use script has the last word).
    pub async fn grants_for(&self, agent: &str, tool: &str) -> Result<Vec<Grant>, StoreError> {
        let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(self.keys.grants_for_key(agent, tool))
            .arg(countersign_model::now_ms())
            .arg("+inf")
            .query_async(&mut self.conn.clone())
            .await?;
        self.grants(&ids).await
    }

    /// The grants kept, newest first, at most `limit`.
    pub async fn recent_grants(&self, limit: usize) -> Result<Vec<Grant>, StoreError> {
        let ids: Vec<String> = redis::cmd("ZREVRANGE")
            .arg(self.keys.grants_key())
            .arg(0)
            .arg(limit.saturating_sub(1))
            .query_async(&mut self.conn.clone())
            .await?;
        self.grants(&ids).await
    }

    /// The grants `ids` name that are still kept, in that order.
    async fn grants(&self, ids: &[String]) -> Result<Vec<Grant>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("HMGET")
                .arg(self.keys.grant_key(id))
                .arg("def")
                .arg("uses")
                .arg("revoked")
                .arg("spent");
        }
        let rows: Vec<Vec<Option<String>>> = pipe.query_async(&mut self.conn.clone()).await?;
        rows.into_iter()
            .filter(|row| row.first().is_some_and(Option::is_some))
            .map(|row| {
                let fields: Vec<String> = row.into_iter().map(Option::unwrap_or_default).collect();
                read_grant(&fields)
            })
            .collect()
    }
}

fn use_key(used: &GrantUse) -> String {
    format!("{}|{}", used.run_id, used.call_id)
}

/// A grant from its stored `def`, `uses`, `revoked` (empty if not) and `spent` (absent or
/// empty: nothing).
fn read_grant(fields: &[String]) -> Result<Grant, StoreError> {
    let [def, uses, revoked, rest @ ..] = fields else {
        return Err(StoreError::Corrupt(format!("a grant read as {fields:?}")));
    };
    let mut grant: Grant = from_json(def)?;
    grant.uses = uses.parse().unwrap_or(0);
    grant.spent = rest.first().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    grant.revoked = match revoked.as_str() {
        "" => None,
        r => Some(from_json(r)?),
    };
    Ok(grant)
}

impl GatewayStore {
    /// Makes `grant` (its `created_at` and `expires_at` set on Redis's clock, `expires_in`
    /// from now), or answers it as it stands if it was made before; true if made now.
    pub async fn create_grant(
        &self,
        grant: &Grant,
        expires_in: Duration,
    ) -> Result<(Grant, bool), StoreError> {
        let args = script::GrantCreate {
            id: &grant.id,
            def: &to_json(grant)?,
            expires_in_ms: expires_in.as_millis() as u64,
            keep_ms: KEEP_ENDED.as_millis() as u64,
        };
        let reply: Vec<String> = script::GRANT_CREATE
            .invocation(None, &args)
            .key(self.keys.grant_key(&grant.id))
            .key(self.keys.grant_uses_key(&grant.id))
            .key(self.keys.grants_key())
            .key(self.keys.grants_for_key(&grant.agent, &grant.tool))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok((read_grant(&reply[1..])?, reply[0] == "created"))
    }

    /// Counts a use of grant `id` by `used` (a held call), if the grant still stands.
    pub async fn use_grant(&self, id: &str, used: &GrantUse) -> Result<UseOutcome, StoreError> {
        let args = script::GrantUse {
            use_key: &use_key(used),
            use_json: &to_json(used)?,
        };
        let reply: Vec<String> = script::GRANT_USE
            .invocation(None, &args)
            .key(self.keys.grant_key(id))
            .key(self.keys.grant_uses_key(id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(match reply[0].as_str() {
            "ok" => UseOutcome::Counted,
            "again" => UseOutcome::Again,
            _ => UseOutcome::Ended,
        })
    }

    /// Gives back the use `used` took, its decision having been refused.
    pub async fn release_grant_use(&self, id: &str, used: &GrantUse) -> Result<(), StoreError> {
        let args = script::GrantRelease {
            use_key: &use_key(used),
        };
        let _: i64 = script::GRANT_RELEASE
            .invocation(None, &args)
            .key(self.keys.grant_key(id))
            .key(self.keys.grant_uses_key(id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Revokes grant `id`; the grant as it now stands (revoked before, it keeps that
    /// revocation) and whether this revoked it, or None if there is no such grant.
    pub async fn revoke_grant(
        &self,
        id: &str,
        revocation: &Revocation,
    ) -> Result<Option<(Grant, bool)>, StoreError> {
        let args = script::GrantRevoke {
            revocation: &to_json(revocation)?,
        };
        let reply: Vec<String> = script::GRANT_REVOKE
            .invocation(None, &args)
            .key(self.keys.grant_key(id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        match reply[0].as_str() {
            "missing" => Ok(None),
            now => Ok(Some((read_grant(&reply[1..])?, now == "revoked"))),
        }
    }
}
