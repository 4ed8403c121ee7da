//! The timers of held calls: sorted sets of `run_id|call_id|digest` scored by when they are
//! due (deadlines, reminders), one per index [`Shard`], each read only at its due front and
//! only by the sweeper holding the shard's short lease, so a sweep costs what is due, however
//! many calls wait and however many workers sweep.

use super::{StoreError, WorkerStore};
use crate::keys::Shard;
use crate::script;
use countersign_model::run::RunId;
use std::time::Duration;

/// What is due in a shard.
#[derive(Debug, Default)]
pub struct Due {
    /// Held calls whose reminder is due.
    pub reminders: Vec<DueTimer>,
    /// Held calls whose deadline has passed.
    pub deadlines: Vec<DueTimer>,
}

/// A held call's entry in the timer sets.
pub(crate) fn member(id: &RunId, call_id: &str, digest: &str) -> String {
    format!("{id}|{call_id}|{digest}")
}

/// The timers kept per held call.
#[derive(Clone, Copy, Debug)]
pub enum Timer {
    /// When the call expires (or escalates) if nobody decided.
    Deadline,
    /// When its approvers are reminded.
    Reminder,
}

/// A timer that is due.
#[derive(Debug, Clone)]
pub struct DueTimer {
    /// Its entry in the timer set, `run_id|call_id|digest`, by which it is taken off.
    pub member: String,
    /// The run of the held call.
    pub run_id: RunId,
    /// The held call.
    pub call_id: String,
    /// The call's digest when its timer was set.
    pub digest: String,
}

impl WorkerStore {
    /// The shard's reminders and deadlines that are due, oldest first, at most `limit` of
    /// each, if this sweeper (`owner`) holds the shard's lease, which this takes or renews
    /// for `lease`; `None` while another does. Only the due front of each set is read,
    /// however many calls wait.
    pub async fn due(
        &self,
        shard: Shard,
        owner: &str,
        lease: Duration,
        limit: usize,
    ) -> Result<Option<Due>, StoreError> {
        let args = script::TimersDue {
            sweeper: owner,
            lease_ms: lease.as_millis().max(1) as u64,
            limit,
        };
        let due: Option<(Vec<String>, Vec<String>)> = script::TIMERS_DUE
            .invocation(None, &args)
            .key(self.keys.sweep_lease_key(shard))
            .key(self.keys.reminders_key(shard))
            .key(self.keys.deadlines_key(shard))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(due.map(|(reminders, deadlines)| Due {
            reminders: parse_members(reminders),
            deadlines: parse_members(deadlines),
        }))
    }

    /// Removes a handled timer; true for the one caller that removed it.
    pub async fn drop_timer(&self, timer: Timer, due: &DueTimer) -> Result<bool, StoreError> {
        let removed: i64 = redis::cmd("ZREM")
            .arg(self.timer_key(timer, Shard::of(&due.run_id)))
            .arg(&due.member)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(removed == 1)
    }
    fn timer_key(&self, timer: Timer, shard: Shard) -> String {
        match timer {
            Timer::Deadline => self.keys.deadlines_key(shard),
            Timer::Reminder => self.keys.reminders_key(shard),
        }
    }
}

/// Due timers from their members; a member that does not parse is skipped.
fn parse_members(members: Vec<String>) -> Vec<DueTimer> {
    members
        .into_iter()
        .filter_map(|member| {
            // Neither a run id nor a digest holds `|`, and no call id does either (see
            // `Run::calls_asked`); the call is what lies between them all the same.
            let (run_id, rest) = member.split_once('|')?;
            let (call_id, digest) = rest.rsplit_once('|')?;
            Some(DueTimer {
                run_id: RunId::parse(run_id)?,
                call_id: call_id.to_string(),
                digest: digest.to_string(),
                member,
            })
        })
        .collect()
}
