//! A receipt runs once, and a retry of the same request is recognised as one. The first use
//! of a receipt's `jti` records the `Idempotency-Key` of its request (empty when it had none)
//! until the receipt could no longer verify anyway. A later request with the same `jti` is
//! [`Seen::Again`] when it carries that same, non-empty key: the worker sending the same call
//! again after a crash, which the tool answers as it answers any repeated `Idempotency-Key`,
//! running nothing twice. Anything else is [`Seen::Reused`], and refused.

#[cfg(feature = "redis")]
mod redis;

#[cfg(feature = "redis")]
pub use self::redis::RedisReplay;

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// What a replay store knows of a receipt's `jti`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not used before; now recorded.
    First,
    /// Used before by a request with the same `Idempotency-Key`.
    Again,
    /// Used before by another request.
    Reused,
}

/// The store could not answer; the receipt must not be taken as unused.
#[derive(Debug, thiserror::Error)]
#[error("the replay store failed: {0}")]
pub struct ReplayError(pub Box<dyn std::error::Error + Send + Sync>);

/// Remembers the receipts a tool has run: in memory for one process ([`SeenJtis`]), in Redis
/// for many (`RedisReplay`, with the `redis` feature).
pub trait Replay: Send + Sync {
    /// Records `jti` as used by the request with `idempotency_key` ("" for none) unless it
    /// was used before; `until` (seconds since the epoch) is when the receipt no longer
    /// verifies, after which it need not be remembered.
    fn first_use(
        &self,
        jti: &str,
        idempotency_key: &str,
        until: i64,
    ) -> impl Future<Output = Result<Seen, ReplayError>> + Send;
}

/// A second use of a receipt whose first use was by the request with `recorded`.
fn used_before(recorded: &str, idempotency_key: &str) -> Seen {
    if !idempotency_key.is_empty() && recorded == idempotency_key {
        Seen::Again
    } else {
        Seen::Reused
    }
}

/// [`Replay`] in memory, for one process. Entries are dropped once expired, oldest first, as
/// new ones come: each use costs the same however many receipts are remembered.
#[derive(Default)]
pub struct SeenJtis(Mutex<Remembered>);

#[derive(Default)]
struct Remembered {
    /// Each receipt's first idempotency key and when it stops counting.
    by_jti: HashMap<String, (String, i64)>,
    /// The same receipts by when they stop counting.
    by_expiry: BTreeSet<(i64, String)>,
}

impl Replay for SeenJtis {
    async fn first_use(
        &self,
        jti: &str,
        idempotency_key: &str,
        until: i64,
    ) -> Result<Seen, ReplayError> {
        let mut guard = self.0.lock().expect("lock poisoned");
        let now = jsonwebtoken::get_current_timestamp() as i64;
        let Remembered { by_jti, by_expiry } = &mut *guard;
        while let Some((expiry, _)) = by_expiry.first()
            && *expiry < now
        {
            if let Some((_, gone)) = by_expiry.pop_first() {
                by_jti.remove(&gone);
            }
        }
        Ok(match by_jti.entry(jti.to_string()) {
            Entry::Occupied(first) => used_before(&first.get().0, idempotency_key),
            Entry::Vacant(entry) => {
                by_expiry.insert((until, jti.to_string()));
                entry.insert((idempotency_key.to_string(), until));
                Seen::First
            }
        })
    }
}
