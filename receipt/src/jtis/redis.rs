//! [`JtiStore`] in Redis, shared by every instance of a tool. One string per used receipt,
//! `{prefix}{jti}` = the first request's `Idempotency-Key` ("" for none), written with
//! `SET NX` so exactly one of concurrent first uses wins, and expiring when the receipt stops
//! verifying. On a conflict the recorded key is read to tell a retry from a reuse. A Redis
//! error is an error: a receipt is never taken as unused because its store did not answer.

use super::{JtiStore, JtiStoreError, Seen, used_before};
use redis::aio::ConnectionLike;
use redis::{AsyncCommands, ExistenceCheck, SetExpiry, SetOptions};

/// [`JtiStore`] in Redis over `C`: a `ConnectionManager`, a `MultiplexedConnection`, a cluster
/// connection, any cheap-to-clone async connection.
pub struct RedisJtis<C> {
    conn: C,
    prefix: String,
}

impl<C> RedisJtis<C> {
    /// Keys are `prefix` followed by the receipt's `jti`.
    pub fn new(conn: C, prefix: impl Into<String>) -> Self {
        Self {
            conn,
            prefix: prefix.into(),
        }
    }
}

impl<C> JtiStore for RedisJtis<C>
where
    C: ConnectionLike + Clone + Send + Sync,
{
    async fn first_use(
        &self,
        jti: &str,
        idempotency_key: &str,
        until: i64,
    ) -> Result<Seen, JtiStoreError> {
        let mut conn = self.conn.clone();
        let key = format!("{}{jti}", self.prefix);
        // A lifetime rather than an instant: `until` is on this tool's clock, which decided
        // that the receipt verifies, not on Redis's.
        let now = jsonwebtoken::get_current_timestamp() as i64;
        let ttl_ms = (until - now).max(1) as u64 * 1000;
        let options = SetOptions::default()
            .conditional_set(ExistenceCheck::NX)
            .with_expiration(SetExpiry::PX(ttl_ms));
        let set: Option<String> = conn
            .set_options(&key, idempotency_key, options)
            .await
            .map_err(|e| JtiStoreError(e.into()))?;
        if set.is_some() {
            return Ok(Seen::First);
        }
        let recorded: Option<String> = conn.get(&key).await.map_err(|e| JtiStoreError(e.into()))?;
        // Gone between the two commands: it expired, so the receipt is at the end of its
        // life; refusing it is the safe answer.
        Ok(recorded.map_or(Seen::Reused, |recorded| {
            used_before(&recorded, idempotency_key)
        }))
    }
}
