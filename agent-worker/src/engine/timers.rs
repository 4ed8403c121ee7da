//! Timers of held calls, swept by every worker: reminders before a deadline, and deadlines,
//! which escalate a call once when its policy says so and otherwise expire it. Each set is
//! read only at its due front, so a sweep costs the same however many calls wait. An expiry
//! is recorded through the decide script (first decision wins), so it fires once across
//! workers and never for a call already decided; a reminder is claimed by removing it.

use super::{Engine, StepError};
use countersign_shared::agent::{OnExpiry, ToolDef};
use countersign_shared::audit::{AuditEntry, AuditKind};
use countersign_shared::events::Event;
use countersign_shared::now_ms;
use countersign_shared::run::{Action, Decision, PendingCall, Run};
use countersign_shared::store::{DecideOutcome, DueTimer, StoreError, Timer};
use std::time::Duration;
use tracing::{info, warn};

/// Timers one sweep handles at most per set; the rest wait for the next sweep.
const SWEEP_BATCH: usize = 100;
/// Who expiries, escalations and reminders are recorded as.
const SYSTEM_ACTOR: &str = "countersign";

impl Engine {
    pub(super) fn approval_timeout(&self, tool: &ToolDef) -> Duration {
        tool.approval_timeout()
            .unwrap_or(self.settings.approval_timeout)
    }

    pub(super) async fn schedule_timers(&self, run: &Run) -> Result<(), StoreError> {
        let at = |pick: fn(&PendingCall) -> Option<i64>| -> Vec<(&str, &str, i64)> {
            run.pending()
                .filter_map(|p| Some((p.call_id.as_str(), p.digest.as_str(), pick(p)?)))
                .collect()
        };
        self.store
            .schedule(Timer::Deadline, &run.run_id, &at(|p| p.deadline))
            .await?;
        self.store
            .schedule(Timer::Reminder, &run.run_id, &at(|p| p.remind_at))
            .await
    }

    /// Handles the reminders and deadlines that are due; returns how many.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        let now = now_ms();
        let reminders = self.store.due(Timer::Reminder, now, SWEEP_BATCH).await?;
        for due in &reminders {
            if let Err(e) = self.remind(due).await {
                warn!(run_id = %due.run_id, call_id = %due.call_id, error = %e, "could not send a reminder");
            }
        }
        let deadlines = self.store.due(Timer::Deadline, now, SWEEP_BATCH).await?;
        for due in &deadlines {
            if let Err(e) = self.deadline_passed(due).await {
                warn!(run_id = %due.run_id, call_id = %due.call_id, error = %e, "could not expire a call");
            }
        }
        Ok(reminders.len() + deadlines.len())
    }

    /// The call if its run still waits on it undecided.
    async fn still_waiting(
        &self,
        due: &DueTimer,
    ) -> Result<Option<(Run, PendingCall)>, StoreError> {
        let Some(run) = self.store.load(&due.run_id).await? else {
            return Ok(None);
        };
        let Some(call) = run.pending().find(|p| p.call_id == due.call_id).cloned() else {
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
        // Removing it claims it: one worker reminds.
        if !self.store.drop_timer(Timer::Reminder, &due.member).await? {
            return Ok(());
        }
        let Some((run, call)) = self.still_waiting(due).await? else {
            return Ok(());
        };
        self.audit_timer(&run, &call, AuditKind::Reminded).await?;
        self.announce_reminder(&run, call, false).await
    }

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
    async fn escalate(&self, run: &Run, call: PendingCall) -> Result<(), StepError> {
        let Some((mut run, version)) = self.store.load_versioned(&run.run_id).await? else {
            return Ok(());
        };
        let tool = self
            .agents
            .get(&run.agent)
            .and_then(|a| a.agent.tool(&call.tool).cloned());
        let extension = tool
            .as_ref()
            .map_or(self.settings.approval_timeout, |t| self.approval_timeout(t));
        let Some(held) = run
            .held
            .iter_mut()
            .filter_map(|c| c.pending.as_mut())
            .find(|p| p.call_id == call.call_id)
        else {
            return Ok(());
        };
        held.escalated = true;
        held.deadline = Some(now_ms() + extension.as_millis() as i64);
        for approver in &held.reviewers.escalate_to {
            if !held.reviewers.approvers.contains(approver) {
                held.reviewers.approvers.push(approver.clone());
            }
        }
        let escalated = held.clone();
        if !self
            .store
            .replace_paused(&run, &version, &call.call_id)
            .await?
        {
            return Ok(()); // decided or changed meanwhile: the next sweep looks again
        }
        self.store
            .schedule(
                Timer::Deadline,
                &run.run_id,
                &[(
                    &escalated.call_id,
                    &escalated.digest,
                    escalated.deadline.unwrap_or_default(),
                )],
            )
            .await?;
        info!(run_id = %run.run_id, call_id = %call.call_id, "call escalated");
        self.audit_timer(&run, &escalated, AuditKind::Escalated)
            .await?;
        self.announce_reminder(&run, escalated, true).await
    }

    async fn expire(&self, due: &DueTimer) -> Result<(), StepError> {
        let run = self.store.load(&due.run_id).await?;
        let pending = run
            .as_ref()
            .and_then(|r| r.pending().find(|p| p.call_id == due.call_id).cloned());
        let reason = "nobody decided before the deadline";
        let decision = Decision {
            call_id: due.call_id.clone(),
            digest: due.digest.clone(),
            action: Action::Reject,
            input: None,
            note: None,
            reason: Some(reason.into()),
            decided_by: SYSTEM_ACTOR.into(),
            channel: "deadline".into(),
            decided_at: now_ms(),
            fingerprint: Decision::fingerprint_of(Action::Reject, None, None, Some(reason)),
            expired: true,
        };
        let deadline = pending
            .as_ref()
            .and_then(|p| p.deadline)
            .unwrap_or(decision.decided_at);
        let announce = match self.store.decide(&due.run_id, &decision, 1).await? {
            DecideOutcome::Recorded { .. } => {
                if let (Some(run), Some(call)) = (&run, &pending) {
                    self.audit_timer(run, call, AuditKind::Expired).await?;
                }
                info!(run_id = %due.run_id, call_id = %due.call_id, "call expired");
                true
            }
            // Recorded by an attempt that stopped before announcing it.
            DecideOutcome::Duplicate(existing) => existing.expired,
            // Decided by a person first, or the run moved on: nothing expires.
            _ => false,
        };
        if announce {
            let names = &self.bus.names;
            let expired = Event::ApprovalExpired {
                run_id: due.run_id.clone(),
                call_id: due.call_id.clone(),
                deadline,
                channels: pending.map(|p| p.reviewers.channels).unwrap_or_default(),
            };
            let id = format!("{}:{}", due.run_id, due.call_id);
            self.bus
                .publish(
                    names.approval_expired(&due.run_id),
                    &format!("expired:{id}"),
                    expired,
                )
                .await?;
            let decided = Event::ApprovalDecided {
                run_id: due.run_id.clone(),
                call_id: due.call_id.clone(),
                action: Action::Reject,
                decided_by: SYSTEM_ACTOR.into(),
                all_decided: true,
                channels: Vec::new(),
            };
            self.bus
                .publish(
                    names.approval_decided(&due.run_id),
                    &format!("decided:{id}"),
                    decided,
                )
                .await?;
        }
        self.store.drop_timer(Timer::Deadline, &due.member).await?;
        Ok(())
    }

    async fn audit_timer(
        &self,
        run: &Run,
        call: &PendingCall,
        kind: AuditKind,
    ) -> Result<(), StoreError> {
        let mut entry = AuditEntry::new(&run.run_id, kind);
        entry.actor = Some(SYSTEM_ACTOR.into());
        entry.call_id = Some(call.call_id.clone());
        entry.digest = Some(call.digest.clone());
        entry.detail =
            serde_json::json!({"deadline": call.deadline, "approvers": call.reviewers.approvers});
        self.store.audit(&entry).await
    }

    async fn announce_reminder(
        &self,
        run: &Run,
        call: PendingCall,
        escalated: bool,
    ) -> Result<(), StepError> {
        let kind = if escalated { "escalated" } else { "reminder" };
        let msg_id = format!("{kind}:{}:{}", run.run_id, call.call_id);
        let event = Event::ApprovalReminder {
            run_id: run.run_id.clone(),
            agent: run.agent.clone(),
            text: run.held_turn_text(),
            call: Box::new(call),
            escalated,
            requested_by: run.requested_by.clone(),
        };
        self.bus
            .publish(
                self.bus.names.approval_reminder(&run.run_id),
                &msg_id,
                event,
            )
            .await?;
        Ok(())
    }
}
