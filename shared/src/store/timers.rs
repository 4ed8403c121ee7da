//! The timers of held calls: sorted sets of `run_id|call_id|digest` scored by when they are
//! due (deadlines, reminders), read only at their due front.

use super::{Store, StoreError};
use crate::run::RunId;

/// The timers kept per held call.
#[derive(Clone, Copy, Debug)]
pub enum Timer {
    Deadline,
    Reminder,
}

/// A timer that is due.
#[derive(Debug, Clone)]
pub struct DueTimer {
    pub member: String,
    pub run_id: RunId,
    pub call_id: String,
    pub digest: String,
}

impl Store {
    /// Puts held calls' timers where the sweepers look. Idempotent: a member already there
    /// gets the new time.
    pub async fn schedule(
        &self,
        timer: Timer,
        id: &RunId,
        calls: &[(&str, &str, i64)],
    ) -> Result<(), StoreError> {
        if calls.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(self.timer_key(timer));
        for (call_id, digest, at) in calls {
            cmd.arg(*at).arg(format!("{id}|{call_id}|{digest}"));
        }
        let _: i64 = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }
    /// Timers that are due, oldest first, at most `limit`. Only the due front of the set is
    /// read, however many calls wait.
    pub async fn due(
        &self,
        timer: Timer,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<DueTimer>, StoreError> {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.timer_key(timer))
            .arg("-inf")
            .arg(now_ms)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(members
            .into_iter()
            .filter_map(|member| {
                let mut parts = member.splitn(3, '|');
                let run_id = RunId::parse(parts.next()?)?;
                let call_id = parts.next()?.to_string();
                let digest = parts.next()?.to_string();
                Some(DueTimer {
                    member,
                    run_id,
                    call_id,
                    digest,
                })
            })
            .collect())
    }
    /// Removes a handled timer; true for the one caller that removed it.
    pub async fn drop_timer(&self, timer: Timer, member: &str) -> Result<bool, StoreError> {
        let removed: i64 = redis::cmd("ZREM")
            .arg(self.timer_key(timer))
            .arg(member)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(removed == 1)
    }
    fn timer_key(&self, timer: Timer) -> String {
        match timer {
            Timer::Deadline => self.names.deadlines_key(),
            Timer::Reminder => self.names.reminders_key(),
        }
    }
}
