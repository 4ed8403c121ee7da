//! The outbox index: which runs may hold announcements JetStream has not acknowledged. A run
//! is marked (scored with Redis's time) before any script that may queue something for it,
//! and that script refuses to write if its mark is older than two seconds; so a sweeper that
//! finds a mark older than its grace period and the run's outbox empty knows nothing is still
//! on its way, and may drop the mark if nobody marked the run again since.

use super::{Announcement, Store, StoreError};
use crate::keys::Shard;
use crate::script;
use countersign_model::run::RunId;

impl Store {
    /// Marks the run in the outbox index; returns the mark. With `pausing`, the same step
    /// lists it as paused in the inbox index (both are in the run's shard): listed before the
    /// pause is saved, so a run seen paused is always found in the inbox (which re-checks
    /// each run's status).
    pub(super) async fn mark(&self, id: &RunId, pausing: bool) -> Result<i64, StoreError> {
        let shard = Shard::of(id);
        let mut invocation =
            script::OUTBOX_MARK.invocation(None, &script::Mark { run: id.as_str() });
        invocation.key(self.keys.outbox_index_key(shard));
        if pausing {
            invocation.key(self.keys.awaiting_key(shard));
        }
        Ok(invocation.invoke_async(&mut self.conn.clone()).await?)
    }

    /// Runs of the shard marked more than `grace` ago, with their marks, at most `limit`.
    pub async fn outbox_due(
        &self,
        shard: Shard,
        grace: std::time::Duration,
        limit: usize,
    ) -> Result<Vec<(RunId, i64)>, StoreError> {
        let args = script::OutboxDue {
            grace_ms: grace.as_millis() as i64,
            limit,
        };
        let flat: Vec<String> = script::OUTBOX_DUE
            .invocation(None, &args)
            .key(self.keys.outbox_index_key(shard))
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
        self.if_marked(&script::OUTBOX_TAKE, id, mark).await
    }

    /// Drops the run's mark if it is still `mark`.
    pub async fn drop_outbox_mark(&self, id: &RunId, mark: i64) -> Result<(), StoreError> {
        let _: i64 = self.if_marked(&script::OUTBOX_DROP, id, mark).await?;
        Ok(())
    }

    /// Runs `script`, which acts only if the run's mark is still `mark`.
    async fn if_marked<T: redis::FromRedisValue>(
        &self,
        script: &script::Lua<script::Marked<'_>>,
        id: &RunId,
        mark: i64,
    ) -> Result<T, StoreError> {
        let args = script::Marked {
            run: id.as_str(),
            mark,
        };
        Ok(script
            .invocation(None, &args)
            .key(self.keys.outbox_index_key(Shard::of(id)))
            .invoke_async(&mut self.conn.clone())
            .await?)
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
