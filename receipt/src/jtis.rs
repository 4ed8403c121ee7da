//! A receipt runs once, and a retry of the same request is recognised as one. The first use
//! of a receipt's `jti` records the `Idempotency-Key` of its request (empty when it had none)
//! until the receipt could no longer verify anyway. A later request with the same `jti` is
//! [`Seen::Again`] when it carries that same, non-empty key: the worker sending the same call
//! again after a crash, which the tool answers as it answers any repeated `Idempotency-Key`,
//! running nothing twice. Anything else is [`Seen::Reused`], and refused.
//!
//! A tool that may restart must remember across restarts: [`SeenJtis`] forgets every receipt
//! it ran when its process ends, and one sent again after that would run again. Use
//! [`FileJtis`] on one host, `RedisJtis` on several.

mod file;
#[cfg(feature = "redis")]
mod redis;

pub use self::file::FileJtis;

#[cfg(feature = "redis")]
pub use self::redis::RedisJtis;

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// What a jti store knows of a receipt's `jti`.
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
#[error("the jti store failed: {0}")]
pub struct JtiStoreError(pub Box<dyn std::error::Error + Send + Sync>);

/// Remembers the receipts a tool has run: in memory for one process that never restarts
/// ([`SeenJtis`]), in a file for one host ([`FileJtis`]), in Redis for many (`RedisJtis`,
/// with the `redis` feature).
pub trait JtiStore: Send + Sync {
    /// Records `jti` as used by the request with `idempotency_key` ("" for none) unless it
    /// was used before; `until` (seconds since the epoch) is when the receipt no longer
    /// verifies, after which it need not be remembered.
    fn first_use(
        &self,
        jti: &str,
        idempotency_key: &str,
        until: i64,
    ) -> impl Future<Output = Result<Seen, JtiStoreError>> + Send;
}

/// A second use of a receipt whose first use was by the request with `recorded`.
fn used_before(recorded: &str, idempotency_key: &str) -> Seen {
    if !idempotency_key.is_empty() && recorded == idempotency_key {
        Seen::Again
    } else {
        Seen::Reused
    }
}

/// [`JtiStore`] in memory, for one process: what it remembers is gone when the process ends,
/// so a receipt it ran runs again after a restart (use [`FileJtis`] or `RedisJtis` for a
/// tool that restarts). Entries are dropped once expired, oldest first, as new ones come:
/// each use costs the same however many receipts are remembered.
#[derive(Default)]
pub struct SeenJtis(Mutex<Remembered>);

#[derive(Default)]
struct Remembered {
    /// Each receipt's first idempotency key and when it stops counting.
    by_jti: HashMap<String, (String, i64)>,
    /// The same receipts by when they stop counting.
    by_expiry: BTreeSet<(i64, String)>,
}

impl Remembered {
    /// Forgets the receipts that stopped counting before `now`.
    fn forget_before(&mut self, now: i64) {
        while let Some((expiry, _)) = self.by_expiry.first()
            && *expiry < now
        {
            if let Some((_, gone)) = self.by_expiry.pop_first() {
                self.by_jti.remove(&gone);
            }
        }
    }

    /// What is known of `jti` for a request with `idempotency_key`; None if it was not used.
    fn seen(&self, jti: &str, idempotency_key: &str) -> Option<Seen> {
        self.by_jti
            .get(jti)
            .map(|(recorded, _)| used_before(recorded, idempotency_key))
    }

    fn record(&mut self, jti: &str, idempotency_key: &str, until: i64) {
        if let Entry::Vacant(entry) = self.by_jti.entry(jti.to_string()) {
            self.by_expiry.insert((until, jti.to_string()));
            entry.insert((idempotency_key.to_string(), until));
        }
    }
}

impl JtiStore for SeenJtis {
    async fn first_use(
        &self,
        jti: &str,
        idempotency_key: &str,
        until: i64,
    ) -> Result<Seen, JtiStoreError> {
        let mut remembered = self.0.lock().expect("lock poisoned");
        remembered.forget_before(jsonwebtoken::get_current_timestamp() as i64);
        if let Some(seen) = remembered.seen(jti, idempotency_key) {
            return Ok(seen);
        }
        remembered.record(jti, idempotency_key, until);
        Ok(Seen::First)
    }
}
