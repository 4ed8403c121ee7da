//! Timers of held calls, swept by every worker on Redis's clock: reminders before a deadline,
//! and deadlines, which escalate a call once when its policy says so and otherwise expire it.
//! Each set is read only at its due front, so a sweep costs the same however many calls wait.
//! An expiry is recorded through the decision script (first decision wins), so it fires once
//! across workers and never for a call already decided; a reminder and an escalation are each
//! a script that fires once too. Each writes its audit entry and queues its announcements in
//! the same step, and a timer is removed only after that, so a crash repeats nothing and
//! loses nothing.

use super::{Engine, StepError};
use countersign_model::agent::ToolDef;
use countersign_model::approval::OnExpiry;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::events::Event;
use countersign_model::run::{HeldCall, Run};
use countersign_runtime::names::msg_id;
use countersign_store::keys::Shard;
use countersign_store::{Announcement, Closing, DecideOutcome, DueTimer, StoreError, Timer};
use std::time::Duration;
use tracing::{info, warn};

/// Timers one sweep handles at most per set; the rest wait for the next sweep.
const SWEEP_BATCH: usize = 100;
/// Who expiries, escalations and reminders are recorded as.
const SYSTEM_ACTOR: &str = "countersign";

impl Engine {
    pub(super) fn approval_timeout(&self, tool: &ToolDef, stage: u32) -> Duration {
        tool.approval_timeout(stage)
            .unwrap_or(self.settings.approval_timeout)
    }

    /// Handles the reminders and deadlines that are due in the shards whose sweep lease this
    /// worker holds or can take (for `lease`); returns how many.
    pub(crate) async fn sweep(&self, lease: Duration) -> Result<usize, StoreError> {
        let owner = &self.settings.owner;
        let mut handled = 0;
        for shard in Shard::all() {
            let Some(due) = self.store.due(shard, owner, lease, SWEEP_BATCH).await? else {
                continue; // another worker sweeps this shard
            };
            for timer in &due.reminders {
                if let Err(e) = self.remind(timer).await {
                    warn!(run_id = %timer.run_id, call_id = %timer.call_id, error = %e, "could not send a reminder");
                }
            }
            for timer in &due.deadlines {
                if let Err(e) = self.deadline_passed(timer).await {
                    warn!(run_id = %timer.run_id, call_id = %timer.call_id, error = %e, "could not expire a call");
                }
            }
            handled += due.reminders.len() + due.deadlines.len();
        }
        Ok(handled)
    }

    /// The call if its run still waits on it undecided.
    async fn still_waiting(&self, due: &DueTimer) -> Result<Option<(Run, HeldCall)>, StoreError> {
        let Some(run) = self.store.load(&due.run_id).await? else {
            return Ok(None);
        };
        let Some(call) = run.held_calls().find(|p| p.call_id == due.call_id).cloned() else {
            return Ok(None);
        };
        if self
            .store
            .decisions(&due.run_id)
            .await?
            .contains_key(&due.call_id)
        {
            return Ok(None);
        }
        Ok(Some((run, call)))
    }

    async fn remind(&self, due: &DueTimer) -> Result<(), StepError> {
        if let Some((run, call)) = self.still_waiting(due).await? {
            let entry = self.timer_entry(&run, &call, AuditKind::Reminded);
            let announce = self.reminder(&run, call, false);
            let queued = self
                .store
                .remind(&run.run_id, &due.call_id, &entry, &announce)
                .await?;
            self.publish(&run.run_id, &queued).await;
        }
        self.store.drop_timer(Timer::Reminder, due).await?;
        Ok(())
    }

    /// Publishes what a timer's script queued; what NATS does not take now waits in the
    /// outbox for the sweepers.
    async fn deadline_passed(&self, due: &DueTimer) -> Result<(), StepError> {
        if let Some((run, call)) = self.still_waiting(due).await?
            && call.reviewers.on_expiry == OnExpiry::Escalate
            && !call.escalated
        {
            // Until it is escalated the deadline stays, so a failed attempt is tried again.
            return self.escalate(&run, call).await;
        }
        self.expire(due).await
    }

    /// Widens the approvers, moves the deadline once, and asks again.
    async fn escalate(&self, run: &Run, call: HeldCall) -> Result<(), StepError> {
        let Some((mut run, version)) = self.store.load_versioned(&run.run_id).await? else {
            return Ok(());
        };
        let tool = self
            .agents()
            .get(&run.agent)
            .and_then(|a| a.agent.tool(&call.tool).cloned());
        let extension = tool.as_ref().map_or(self.settings.approval_timeout, |t| {
            let stage = call.stage.as_ref().map_or(1, |s| s.number);
            self.approval_timeout(t, stage)
        });
        let now = self.store.time_ms().await?;
        let Some(held) = run
            .paused_turn
            .iter_mut()
            .filter_map(|c| c.held.as_mut())
            .find(|p| p.call_id == call.call_id)
        else {
            return Ok(());
        };
        held.escalated = true;
        held.deadline = Some(now + extension.as_millis() as i64);
        // A call anyone whose role decides may decide stays so: the people escalated to are
        // asked too (the reminder names them), and nobody is taken away.
        if !held.reviewers.approvers.is_empty() {
            for approver in &held.reviewers.escalate_to {
                if !held.reviewers.approvers.contains(approver) {
                    held.reviewers.approvers.push(approver.clone());
                }
            }
            held.deciders = self.people.resolve(&held.reviewers.approvers);
        }
        let escalated = held.clone();
        let entry = self.timer_entry(&run, &escalated, AuditKind::Escalated);
        let announce = self.reminder(&run, escalated.clone(), true);
        let Some(queued) = self
            .store
            .escalate(
                &run,
                &version,
                &call.call_id,
                &escalated.terms(run.turns),
                &entry,
                &announce,
            )
            .await?
        else {
            return Ok(()); // decided or changed meanwhile: the next sweep looks again
        };
        self.metrics.calls("escalated", 1);
        self.publish(&run.run_id, &queued).await;
        info!(run_id = %run.run_id, call_id = %call.call_id, "call escalated");
        Ok(())
    }

    async fn expire(&self, due: &DueTimer) -> Result<(), StepError> {
        let reason = "nobody decided before the deadline";
        let mut entry = AuditEntry::new(&due.run_id, AuditKind::Expired);
        entry.actor = Some(SYSTEM_ACTOR.into());
        entry.call_id = Some(due.call_id.clone());
        entry.digest = Some(due.digest.clone());
        entry.detail = serde_json::json!({"reason": reason});
        let closed = self
            .close_unattended(
                &due.run_id,
                (&due.call_id, &due.digest),
                (SYSTEM_ACTOR, reason),
                entry,
                Closing::Deadline,
            )
            .await?;
        match closed {
            DecideOutcome::Decided { queued, .. } => {
                info!(run_id = %due.run_id, call_id = %due.call_id, "call expired");
                self.metrics.calls("expired", 1);
                self.publish(&due.run_id, &queued).await;
            }
            // The deadline moved (an escalation) after this sweep read it: keep the timer.
            DecideOutcome::NotDue => return Ok(()),
            // Decided by a person first, or the run moved on: nothing expires.
            DecideOutcome::Settled(_) | DecideOutcome::Refused(_) | DecideOutcome::NoRun => {}
        }
        self.store.drop_timer(Timer::Deadline, due).await?;
        Ok(())
    }

    fn timer_entry(&self, run: &Run, call: &HeldCall, kind: AuditKind) -> AuditEntry {
        let mut entry = AuditEntry::new(&run.run_id, kind);
        entry.actor = Some(SYSTEM_ACTOR.into());
        entry.call_id = Some(call.call_id.clone());
        entry.digest = Some(call.digest.clone());
        entry.detail = serde_json::json!({
            "deadline": call.deadline, "approvers": call.reviewers.approvers,
            "deciders": call.deciders,
        });
        entry
    }

    fn reminder(&self, run: &Run, call: HeldCall, escalated: bool) -> Announcement {
        let msg_id = msg_id::reminder(&run.run_id, &call.call_id, escalated);
        let mut event = Event::ApprovalReminder {
            run_id: run.run_id.clone(),
            agent: run.agent.clone(),
            text: run.paused_turn_text(),
            call: Box::new(call),
            escalated,
            requested_by: run.requested_by.clone(),
        };
        event.fit(self.bus.event_limit());
        Announcement::new(msg_id, self.bus.names.approval_reminder(&run.run_id), event)
    }
}
