//! How a drive stops: paused for a person, or finished (completed, failed, cancelled), each a
//! save that carries its audit entries and its announcements.

use super::{Changes, Engine, StepError, results_message};
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::events::Event;
use countersign_model::run::{CallOutcome, CallResult, Run, RunId, RunStatus};
use countersign_runtime::names::msg_id;
use countersign_store::{Announcement, Execution, Indexes, Save, StoreError};
use tracing::{info, warn};

impl Engine {
    /// Pauses the run with what this drive did and has not saved yet (`earlier`, emptied
    /// once saved).
    #[tracing::instrument(name = "run.pause", skip_all)]
    pub(super) async fn pause(&self, mut run: Run, earlier: &mut Changes) -> Result<(), StepError> {
        let requested: Vec<AuditEntry> = run
            .held_calls()
            .map(|p| {
                let mut detail = serde_json::json!({
                    "tool": p.tool, "input": p.input, "summary": p.summary, "reason": p.reason,
                    "approvers": p.reviewers.approvers, "deciders": p.deciders,
                    "quorum": p.reviewers.quorum, "deadline": p.deadline, "turn": run.turns,
                });
                if let Some(risk) = p.risk {
                    detail["risk"] = serde_json::json!(risk);
                }
                if let Some(stage) = &p.stage {
                    detail["stage"] = serde_json::json!(stage);
                }
                let mut entry = self.entry(&run, AuditKind::Requested, Some(p), detail);
                // The agent asks for a person, not the worker process that ran its turn.
                entry.actor = Some(run.agent.clone());
                entry
            })
            .collect();
        let mut changes = earlier.clone();
        changes.announce.push(self.pause_announcement(&run));
        changes.audits.extend(requested.iter().cloned());
        // The save lists the run in the inbox index and sets its timers (see `Store::save`).
        self.save(&mut run, Save::Pause, &changes).await?;
        *earlier = Changes::default();
        let metrics = &self.metrics;
        metrics.run("paused");
        metrics.calls("held", requested.len());
        metrics.paused_after(run.updated_at - run.created_at);
        info!(
            turn = run.turns,
            pending = requested.len(),
            "paused for approval"
        );
        Ok(())
    }

    /// Finishes the run with its answer or error, and what this drive did and has not saved
    /// yet (`earlier`, emptied once saved).
    pub(super) async fn finish(
        &self,
        mut run: Run,
        result: Result<String, String>,
        earlier: &mut Changes,
    ) -> Result<(), StepError> {
        let (status, kind, detail) = match result {
            Ok(answer) => {
                let detail = serde_json::json!({"answer": answer});
                run.answer = Some(answer);
                (RunStatus::Completed, AuditKind::Completed, detail)
            }
            Err(error) => {
                warn!(%error, "run failed");
                let detail = serde_json::json!({"error": error});
                run.error = Some(error);
                (RunStatus::Failed, AuditKind::Failed, detail)
            }
        };
        let mut changes = earlier.clone();
        changes.audits.push(self.entry(&run, kind, None, detail));
        changes.announce.push(self.end_announcement(&run, status));
        self.end(run, status, &changes).await?;
        *earlier = Changes::default();
        Ok(())
    }

    /// Finishes a run someone cancelled, from its last stored state, and announces
    /// `run.cancelled`. Its held calls were closed, and their channels told, by the script
    /// that recorded the cancel. What the drive that found the cancel did and could not save
    /// (`unsaved`) is saved now, and whatever else ran of the stored turn is recorded (see
    /// [`Engine::close_turn`]): no call starts once the cancel is accepted, but one started
    /// before it may have finished since.
    pub(super) async fn cancel(&self, id: &RunId, unsaved: Changes) -> Result<(), StepError> {
        let Some(mut run) = self.store.load(id).await? else {
            return Ok(());
        };
        let Some(cancel) = run.cancel.clone() else {
            return Err(StoreError::Corrupt("cancelled without a cancellation".into()).into());
        };
        let Changes {
            mut audits,
            mut announce,
            index,
        } = unsaved;
        let audited: Vec<String> = audits
            .iter()
            .filter(|a| a.kind == AuditKind::Executed)
            .filter_map(|a| a.call_id.clone())
            .collect();
        audits.extend(self.close_turn(&mut run, &audited).await?);
        announce.push(self.end_announcement(&run, RunStatus::Cancelled));
        let detail = serde_json::json!({"by": cancel.by, "reason": cancel.reason});
        audits.push(self.entry(&run, AuditKind::Cancelled, None, detail));
        let index = index.then(Indexes::resumed(&run));
        let changes = Changes {
            audits,
            announce,
            index,
        };
        self.end(run, RunStatus::Cancelled, &changes).await
    }

    /// Closes the stored turn of a run that goes no further: each call without a result
    /// gets the one its execution record holds (audited as executed), `unknown` if it was
    /// started and never finished (audited, and a person told), or else a result saying it
    /// did not run; the results are appended, so every call the model asked for is answered
    /// in the record. Returns the audit entries, but for the calls `audited` already.
    async fn close_turn(
        &self,
        run: &mut Run,
        audited: &[String],
    ) -> Result<Vec<AuditEntry>, StepError> {
        let open: Vec<&str> = run
            .paused_turn
            .iter()
            .filter(|c| c.result.is_none())
            .map(|c| c.call_id.as_str())
            .collect();
        if open.is_empty() {
            return Ok(Vec::new());
        }
        let found = self.store.executions(&run.run_id, &open).await?;
        let mut found = found.into_iter();
        let mut audits = Vec::new();
        let mut turn = std::mem::take(&mut run.paused_turn);
        for call in turn.iter_mut().filter(|c| c.result.is_none()) {
            let result = match found.next().flatten() {
                None => CallResult {
                    outcome: CallOutcome::Cancelled,
                    is_error: true,
                    content: "The run was cancelled before this call started, so it did not run."
                        .into(),
                    images: Vec::new(),
                    mcp: None,
                },
                Some(Execution::Finished(result)) => result,
                Some(Execution::Started) => {
                    let reason = format!(
                        "The outcome of this {} call is unknown: it was started, and the run was cancelled before its result was recorded. A person should check whether it took effect.",
                        call.tool
                    );
                    let about = (call.call_id.as_str(), call.tool.as_str(), &call.input);
                    self.reported_unknown(&run.run_id, about, reason).await
                }
            };
            if result.outcome == CallOutcome::Cancelled
                && let Some(held) = &call.held
            {
                self.give_back(&held.windows).await?;
            }
            if result.outcome != CallOutcome::Cancelled && !audited.contains(&call.call_id) {
                audits.push(self.executed(run, call, None, &result));
            }
            call.result = Some(result);
        }
        run.messages.push(results_message(&turn));
        run.paused_turn = turn;
        Ok(audits)
    }

    pub(super) async fn end(
        &self,
        mut run: Run,
        status: RunStatus,
        changes: &Changes,
    ) -> Result<(), StepError> {
        let retention = self.settings.retention;
        self.save(&mut run, Save::Finish { status, retention }, changes)
            .await?;
        self.metrics.run(status.as_str());
        info!(status = status.as_str(), "run finished");
        Ok(())
    }

    pub(super) fn pause_announcement(&self, run: &Run) -> Announcement {
        let names = &self.bus.names;
        // A turn paused again on calls held anew is announced anew.
        let id = match run.held_calls().find(|c| c.recheck.is_some()) {
            Some(again) => msg_id::requested_again(&run.run_id, &again.call_id),
            None => msg_id::requested(&run.run_id, run.turns),
        };
        let mut event = Event::approval_requested(run);
        if !event.fit(self.bus.event_limit()) {
            warn!(
                limit = self.bus.event_limit(),
                "the pause's announcement does not fit the payload limit even cut"
            );
        }
        Announcement::new(id, names.approval_requested(&run.run_id), event)
    }

    pub(super) fn end_announcement(&self, run: &Run, status: RunStatus) -> Announcement {
        let names = &self.bus.names;
        let id = run.run_id.clone();
        let (subject, event) = match status {
            RunStatus::Cancelled => {
                let cancel = run.cancel.clone();
                (
                    names.run_cancelled(&id),
                    Event::RunCancelled {
                        run_id: id.clone(),
                        cancelled_by: cancel.as_ref().map(|c| c.by.clone()).unwrap_or_default(),
                        reason: cancel.and_then(|c| c.reason),
                    },
                )
            }
            RunStatus::Completed => (
                names.run_completed(&id),
                Event::RunCompleted {
                    run_id: id.clone(),
                    answer: run.answer.clone().unwrap_or_default(),
                    failed_calls: run.failed_calls(),
                },
            ),
            _ => (
                names.run_failed(&id),
                Event::RunFailed {
                    run_id: id.clone(),
                    error: run.error.clone().unwrap_or_default(),
                },
            ),
        };
        Announcement::new(msg_id::end(&id), subject, event)
    }
}
