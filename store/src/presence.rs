//! Who has a request's page open: a sorted set per call of the principals whose pages asked
//! lately, scored by when (ms). Each page's poll adds its reviewer and drops those not heard
//! from within the TTL; the key expires with the TTL too, so nothing is left once everyone
//! has gone. A hint for reviewers, never a lock: nothing is decided by it.

use super::{GatewayStore, StoreError};
use countersign_model::run::RunId;
use std::time::Duration;

impl GatewayStore {
    /// Notes `principal` looking at `run`'s `call_id` now and returns the others who did
    /// within `ttl`, in name order.
    pub async fn present(
        &self,
        run: &RunId,
        call_id: &str,
        principal: &str,
        ttl: Duration,
    ) -> Result<Vec<String>, StoreError> {
        let key = self.keys.presence_key(run, call_id);
        let now = countersign_model::now_ms();
        let ttl_ms = ttl.as_millis().max(1) as i64;
        let (present,): (Vec<String>,) = redis::pipe()
            .atomic()
            .cmd("ZADD")
            .arg(&key)
            .arg(now)
            .arg(principal)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(now - ttl_ms)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(ttl_ms)
            .ignore()
            .cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn.clone())
            .await?;
        let mut others: Vec<String> = present.into_iter().filter(|p| p != principal).collect();
        others.sort();
        Ok(others)
    }
}
