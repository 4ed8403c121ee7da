//! The index of paused runs (`awaiting`, scored by when they paused), which the inbox pages
//! through; it lives outside the runs' slots, so readers re-check each run's status. It is
//! split into [`Shard`]s like every deployment-wide index; a page merges theirs.

use super::{Store, StoreError, WorkerStore};
use crate::keys::Shard;
use countersign_model::run::RunId;
use futures::future::try_join_all;

/// A run's place in the index of paused runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Awaiting {
    /// The paused run.
    pub run_id: RunId,
    /// When it paused (ms since the epoch): its score in the index.
    pub since_ms: i64,
}

impl Store {
    /// At most `limit` runs of the paused index strictly after `after` (from the start when
    /// `None`), oldest first, runs that paused in the same millisecond in order of id, as
    /// Redis keeps them. Only that slice is read, however many runs wait. Some may have moved
    /// on since: re-check them.
    pub async fn awaiting(
        &self,
        after: Option<&Awaiting>,
        limit: usize,
    ) -> Result<Vec<Awaiting>, StoreError> {
        let pages =
            try_join_all(Shard::all().map(|shard| self.awaiting_in(shard, after, limit))).await?;
        let mut page: Vec<Awaiting> = pages.into_iter().flatten().collect();
        page.sort_by(|a, b| (a.since_ms, a.run_id.as_str()).cmp(&(b.since_ms, b.run_id.as_str())));
        page.truncate(limit);
        Ok(page)
    }

    /// Every run of the paused index, oldest first, read a page at a time (some may have
    /// moved on since: re-check them).
    pub async fn all_awaiting(&self) -> Result<Vec<RunId>, StoreError> {
        const PAGE: usize = 500;
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let page = self.awaiting(after.as_ref(), PAGE).await?;
            let last = page.last().cloned();
            let full = page.len() == PAGE;
            all.extend(page.into_iter().map(|a| a.run_id));
            if !full {
                return Ok(all);
            }
            after = last;
        }
    }

    /// [`Store::awaiting`] in one shard.
    async fn awaiting_in(
        &self,
        shard: Shard,
        after: Option<&Awaiting>,
        limit: usize,
    ) -> Result<Vec<Awaiting>, StoreError> {
        let key = self.keys.awaiting_key(shard);
        let mut page = Vec::new();
        let mut min = "-inf".to_string();
        if let Some(after) = after {
            // Runs that paused in the cursor's millisecond: the few after it by id come first.
            let tied: Vec<String> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(after.since_ms)
                .arg(after.since_ms)
                .arg("BYSCORE")
                .query_async(&mut self.conn.clone())
                .await?;
            page.extend(
                tied.iter()
                    .filter(|id| id.as_str() > after.run_id.as_str())
                    .filter_map(|id| RunId::parse(id))
                    .take(limit)
                    .map(|run_id| Awaiting {
                        run_id,
                        since_ms: after.since_ms,
                    }),
            );
            min = format!("({}", after.since_ms);
        }
        if page.len() < limit {
            let rest: Vec<String> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(min)
                .arg("+inf")
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(0)
                .arg(limit - page.len())
                .arg("WITHSCORES")
                .query_async(&mut self.conn.clone())
                .await?;
            for pair in rest.chunks_exact(2) {
                let since_ms = pair[1]
                    .parse::<f64>()
                    .map_err(|_| StoreError::Corrupt(format!("awaiting score {:?}", pair[1])))?;
                if let Some(run_id) = RunId::parse(&pair[0]) {
                    page.push(Awaiting {
                        run_id,
                        since_ms: since_ms as i64,
                    });
                }
            }
        }
        Ok(page)
    }
}

impl WorkerStore {
    /// Whether `worker` is the first to take on checking the calls that wait under earlier
    /// versions of `agent` than `version`: one worker does it per version, for `ttl`.
    pub async fn take_recheck(
        &self,
        agent: &str,
        version: &str,
        worker: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let set: Option<String> = redis::cmd("SET")
            .arg(self.keys.recheck_key(agent, version))
            .arg(worker)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(set.is_some())
    }
}
