//! The outbox index: which runs may hold announcements JetStream has not acknowledged. A run
//! is marked (scored with Redis's time) by any script that may queue something for it, in the
//! same step on one server; under Cluster, where the index is in another slot than the run,
//! just before, and then that script refuses to write if its mark is older than two seconds; so a sweeper that
//! finds a mark older than its grace period and the run's outbox empty knows nothing is still
//! on its way, and may drop the mark if nobody marked the run again since.

use super::{Announcement, Store, StoreError};
use crate::keys::Shard;
use crate::script;
use crate::timers::member;
use countersign_model::run::{HeldCall, Run, RunId};

/// What a step on a run changes in its shard's indexes besides the outbox mark: the paused
/// runs and the held calls' timers (see `lua/shard.lua`). On one server the step's own script
/// makes these changes; under Cluster the script that marks the run, just before.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Indexes {
    /// Lists the run as paused (true) or takes it off (false); `None` leaves it.
    #[serde(skip_serializing_if = "Option::is_none")]
    awaiting: Option<bool>,
    /// Timers taken off (`run_id|call_id|digest`), before any is put on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unlist: Vec<String>,
    /// Deadlines put on: (when, in ms, as text; member).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    deadlines: Vec<(String, String)>,
    /// Reminders put on, the same way.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    reminders: Vec<(String, String)>,
}

impl Indexes {
    /// A run pausing: listed as paused, with its held calls' deadlines and reminders.
    pub fn paused(run: &Run) -> Self {
        let timers = |pick: fn(&HeldCall) -> Option<i64>| {
            run.held_calls()
                .filter_map(|p| Some(timer(&run.run_id, p, pick(p)?)))
                .collect()
        };
        Self {
            awaiting: Some(true),
            unlist: Vec::new(),
            deadlines: timers(|p| p.deadline),
            reminders: timers(|p| p.remind_at),
        }
    }

    /// A held call of run `run` whose deadline moved (an escalation): its new deadline.
    pub fn deadline_moved(run: &RunId, call: &HeldCall) -> Self {
        Self {
            deadlines: call
                .deadline
                .map(|at| timer(run, call, at))
                .into_iter()
                .collect(),
            ..Self::default()
        }
    }

    /// A paused run resuming, or ending: off the paused runs, and the timers of its held
    /// calls gone, so decided calls do not wait in the sweepers' sets until their deadline.
    pub fn resumed(run: &Run) -> Self {
        let calls = run
            .held_calls()
            .map(|p| (p.call_id.as_str(), p.digest.as_str()));
        Self::unlisting(&run.run_id, calls)
    }

    /// Run `run` off the paused runs, with the timers of `calls` (`(call_id, digest)`).
    fn unlisting<'a>(run: &RunId, calls: impl Iterator<Item = (&'a str, &'a str)>) -> Self {
        Self {
            awaiting: Some(false),
            unlist: calls
                .map(|(call, digest)| member(run, call, digest))
                .collect(),
            ..Self::default()
        }
    }

    /// These changes, then `later`'s.
    pub fn then(mut self, later: Indexes) -> Self {
        self.awaiting = later.awaiting.or(self.awaiting);
        self.unlist.extend(later.unlist);
        self.deadlines.extend(later.deadlines);
        self.reminders.extend(later.reminders);
        self
    }

    /// The scripts' argument: '' when nothing changes.
    pub(crate) fn arg(&self) -> String {
        if *self == Self::default() {
            return String::new();
        }
        serde_json::to_string(self).expect("indexes serialize")
    }
}

/// A held call's timer entry at `at` (ms), as the scripts take it.
fn timer(run: &RunId, call: &HeldCall, at: i64) -> (String, String) {
    (at.to_string(), member(run, &call.call_id, &call.digest))
}

impl Store {
    /// Marks the run in the outbox index, with what `index` (see [`Indexes::arg`]) changes in
    /// the shard's other indexes in the same step; returns the mark.
    pub(super) async fn mark(&self, id: &RunId, index: &str) -> Result<i64, StoreError> {
        let mut invocation = script::OUTBOX_MARK.invocation(
            None,
            &script::Mark {
                run: id.as_str(),
                index,
            },
        );
        for key in self.keys.shard_keys(Shard::of(id)) {
            invocation.key(key);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_that_changes_no_index_sends_nothing_for_the_scripts_to_read() {
        assert_eq!(Indexes::default().arg(), "");
        let run = RunId::parse("run_1").unwrap();
        assert_eq!(
            Indexes::unlisting(&run, std::iter::empty()).arg(),
            r#"{"awaiting":false}"#
        );
    }

    #[test]
    fn later_changes_go_after_earlier_ones_and_the_last_listing_wins() {
        let run = RunId::parse("run_1").unwrap();
        let resumed = Indexes::unlisting(&run, [("call_1", "sha256:a")].into_iter());
        let paused = Indexes {
            awaiting: Some(true),
            deadlines: vec![("1000".into(), "run_1|call_2|sha256:b".into())],
            ..Indexes::default()
        };
        let both = resumed.then(paused);
        assert_eq!(
            both.arg(),
            r#"{"awaiting":true,"unlist":["run_1|call_1|sha256:a"],"deadlines":[["1000","run_1|call_2|sha256:b"]]}"#
        );
    }
}
