//! The outbox index: which runs may hold announcements JetStream has not acknowledged. A run
//! is marked (scored with Redis's time) before any script that may queue something for it,
//! and that script refuses to write if its mark is older than two seconds; so a sweeper that
//! finds a mark older than its grace period and the run's outbox empty knows nothing is still
//! on its way, and may drop the mark if nobody marked the run again since.

use super::{Announcement, Store, StoreError};
use crate::keys::Shard;
use countersign_model::run::RunId;
use std::sync::LazyLock;

/// Scores a run (ARGV[1]) in the outbox index (KEYS[1]) with Redis's time, later than any
/// earlier mark, as `now`.
const MARK_NOW: &str = "local now = now_ms()
     local old = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
     if old and old >= now then now = old + 1 end
     redis.call('ZADD', KEYS[1], now, ARGV[1])";

/// Marks the run; returns the mark.
static MARK: LazyLock<redis::Script> =
    LazyLock::new(|| super::script(&format!("{MARK_NOW}\nreturn now")));

/// Marks the run and lists it in the paused-runs index (KEYS[2], the same shard) at that
/// time: a pause's one step before its save. Returns the mark.
static MARK_PAUSED: LazyLock<redis::Script> = LazyLock::new(|| {
    super::script(&format!(
        "{MARK_NOW}\nredis.call('ZADD', KEYS[2], now, ARGV[1])\nreturn now"
    ))
});

/// Marks older than ARGV[1] ms, at most ARGV[2], as a flat run, score list.
static DUE: LazyLock<redis::Script> = LazyLock::new(|| {
    super::script(
        "return redis.call('ZRANGE', KEYS[1], '-inf', now_ms() - tonumber(ARGV[1]),
           'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]), 'WITHSCORES')",
    )
});

/// Re-marks a run (ARGV[1]) only if its mark is still ARGV[2]: one sweeper takes it for a
/// grace period. Returns the new mark, or false.
static TAKE: LazyLock<redis::Script> = LazyLock::new(|| {
    super::script(
        "if redis.call('ZSCORE', KEYS[1], ARGV[1]) ~= ARGV[2] then return false end
         local now = now_ms()
         if now <= tonumber(ARGV[2]) then now = tonumber(ARGV[2]) + 1 end
         redis.call('ZADD', KEYS[1], now, ARGV[1])
         return now",
    )
});

/// Drops a run's mark (ARGV[1]) if it is still ARGV[2].
static DROP: LazyLock<redis::Script> = LazyLock::new(|| {
    super::script(
        "if redis.call('ZSCORE', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
         return redis.call('ZREM', KEYS[1], ARGV[1])",
    )
});

impl Store {
    /// Marks the run in the outbox index; returns the mark.
    pub(super) async fn mark_outbox(&self, id: &RunId) -> Result<i64, StoreError> {
        Ok(MARK
            .key(self.keys.outbox_index_key(Shard::of(id)))
            .arg(id.as_str())
            .invoke_async(&mut self.conn.clone())
            .await?)
    }

    /// Marks the run in the outbox index and lists it as paused in the inbox index, in one
    /// step (both are in the run's shard); returns the mark. Listed before the pause is saved,
    /// so a run seen paused is always found in the inbox (which re-checks each run's status).
    pub(super) async fn mark_paused(&self, id: &RunId) -> Result<i64, StoreError> {
        let shard = Shard::of(id);
        Ok(MARK_PAUSED
            .key(self.keys.outbox_index_key(shard))
            .key(self.keys.awaiting_key(shard))
            .arg(id.as_str())
            .invoke_async(&mut self.conn.clone())
            .await?)
    }

    /// Runs of the shard marked more than `grace` ago, with their marks, at most `limit`.
    pub async fn outbox_due(
        &self,
        shard: Shard,
        grace: std::time::Duration,
        limit: usize,
    ) -> Result<Vec<(RunId, i64)>, StoreError> {
        let flat: Vec<String> = DUE
            .key(self.keys.outbox_index_key(shard))
            .arg(grace.as_millis() as i64)
            .arg(limit)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(flat
            .chunks(2)
            .filter_map(|pair| match pair {
                [id, score] => Some((RunId::parse(id)?, score.parse().ok()?)),
                _ => None,
            })
            .collect())
    }

    /// Takes a due run for this sweeper; the new mark, or None if another took it.
    pub async fn take_outbox(&self, id: &RunId, mark: i64) -> Result<Option<i64>, StoreError> {
        Ok(TAKE
            .key(self.keys.outbox_index_key(Shard::of(id)))
            .arg(id.as_str())
            .arg(mark)
            .invoke_async(&mut self.conn.clone())
            .await?)
    }

    /// Drops the run's mark if it is still `mark`.
    pub async fn drop_outbox_mark(&self, id: &RunId, mark: i64) -> Result<(), StoreError> {
        let _: i64 = DROP
            .key(self.keys.outbox_index_key(Shard::of(id)))
            .arg(id.as_str())
            .arg(mark)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// What the run's outbox holds.
    pub async fn outbox_entries(&self, id: &RunId) -> Result<Vec<Announcement>, StoreError> {
        let flat: Vec<String> = redis::cmd("HGETALL")
            .arg(self.keys.outbox_key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        Announcement::from_pairs(&flat)
    }

    /// Removes acknowledged entries; returns how many are left.
    pub async fn outbox_done(&self, id: &RunId, msg_ids: &[&str]) -> Result<usize, StoreError> {
        let key = self.keys.outbox_key(id);
        let mut pipe = redis::pipe();
        if !msg_ids.is_empty() {
            pipe.cmd("HDEL").arg(&key).arg(msg_ids).ignore();
        }
        pipe.cmd("HLEN").arg(&key);
        let (left,): (usize,) = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(left)
    }
}
