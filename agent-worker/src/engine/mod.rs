//! The tool loop. A worker that has claimed a run drives it turn by turn: ask the model, run
//! the calls that need nobody, hold the ones that need a person, and either pause (the run is
//! stored and `approval.requested` published) or give all results of the turn back in one
//! message. A claimed paused run is resumed from its stored turn: decided calls run or are
//! refused, and the loop carries on.
//!
//! Every write goes through the lease, so a worker that lost its run (it stalled and another
//! took over) stops at its next write. Each write carries the audit entries of what changed
//! and the announcements others must hear of, queued in the run's outbox by the same script
//! and published from there (see [`countersign_shared::outbox`]). Approved calls pass through an execution record
//! (`started` before the side effect, the result after), so a call whose worker died mid-way
//! is re-sent only to a tool declared idempotent and is otherwise reported as `unknown`.

mod timers;

use crate::agents::{Agents, RunnableAgent};
use crate::model::{ModelError, ModelRequest};
use crate::policy::Gate;
use crate::tools;
use countersign_shared::agent::ToolDef;
use countersign_shared::audit::{AuditEntry, AuditKind};
use countersign_shared::bus::{Bus, BusError};
use countersign_shared::digest::call_digest;
use countersign_shared::events::{Event, Evidence};
use countersign_shared::now_ms;
use countersign_shared::outbox::Outbox;
use countersign_shared::people::Directory;
use countersign_shared::run::{
    Action, Block, CallResult, Message, Outcome, PendingCall, Role, Run, RunId, RunStatus, TurnCall,
};
use countersign_shared::store::{Announcement, Claim, ExecBegin, Save, Store, StoreError};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// What to do with the message that brought the work.
#[derive(Debug, PartialEq)]
pub enum Next {
    Ack,
    /// Hand it back to be delivered again after this long.
    Retry(Duration),
}

#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Model(ModelError),
}

impl StepError {
    /// Whether delivering the message again can help: an outage can pass; a stored run or a
    /// script reply that cannot be read will read the same next time.
    fn worth_retrying(&self) -> bool {
        !matches!(self, Self::Store(StoreError::Corrupt(_)))
    }
}

pub struct EngineSettings {
    /// This worker's name in leases.
    pub owner: String,
    pub lease: Duration,
    pub max_attempts: u64,
    pub retention: Duration,
    /// How long a held call waits for a person when its policy sets no `timeout`.
    pub approval_timeout: Duration,
}

pub struct Engine {
    store: Store,
    bus: Bus,
    outbox: Outbox,
    agents: Arc<Agents>,
    people: Directory,
    http: reqwest::Client,
    settings: EngineSettings,
}

impl Engine {
    pub fn new(
        store: Store,
        bus: Bus,
        agents: Arc<Agents>,
        people: Directory,
        settings: EngineSettings,
    ) -> Self {
        Self {
            outbox: Outbox::new(store.clone(), bus.clone()),
            store,
            bus,
            agents,
            people,
            http: reqwest::Client::new(),
            settings,
        }
    }

    /// One step of work for a run, brought by a `runs.start` job (`start`) or an
    /// `approval.decided` event: claim the run and drive it as far as it goes. Safe to call
    /// for any message any number of times: what is already done is not done again.
    #[tracing::instrument(skip_all, fields(run_id = %id, attempt))]
    pub async fn process(&self, id: &RunId, start: Option<&Event>, attempt: u64) -> Next {
        match self.try_process(id, start, attempt).await {
            Ok(next) => next,
            Err(e) if e.worth_retrying() => {
                warn!(error = %e, "step failed; the message will be delivered again");
                Next::Retry(backoff(attempt))
            }
            Err(e) => {
                self.give_up(id, &e).await;
                Next::Ack
            }
        }
    }

    /// Leaves a run whose stored state cannot be read to a person: trying again would read
    /// the same. Its lease is released and `run.attention` published; the message is acked.
    async fn give_up(&self, id: &RunId, e: &StepError) {
        warn!(error = %e, "the run's stored state cannot be read; a person must look");
        let _ = self.store.release(id, &self.settings.owner).await;
        let attention = Event::RunAttention {
            run_id: id.clone(),
            call_id: None,
            tool: None,
            input: Value::Null,
            reason: format!(
                "The run's stored state cannot be read ({e}), so no worker goes on with it."
            ),
        };
        let published = self
            .bus
            .publish(
                self.bus.names.run_attention(id),
                &format!("attention:{id}"),
                attention,
            )
            .await;
        if let Err(e) = published {
            warn!(error = %e, "could not publish run.attention");
        }
    }

    async fn try_process(
        &self,
        id: &RunId,
        start: Option<&Event>,
        attempt: u64,
    ) -> Result<Next, StepError> {
        let owner = &self.settings.owner;
        let mut claim = self.store.claim(id, owner, self.settings.lease).await?;
        if claim == Claim::Missing
            && let Some(run) = self.new_run(start)
        {
            self.store.create(&run).await?;
            claim = self.store.claim(id, owner, self.settings.lease).await?;
        }
        match claim {
            Claim::Missing => {
                warn!("no such run; message dropped");
                Ok(Next::Ack)
            }
            Claim::Busy(left) => Ok(Next::Retry(left + Duration::from_millis(250))),
            // The pause's announcement is in the outbox; its indexes are outside the script,
            // so they are written again for a worker that died before it wrote them.
            Claim::Waiting => {
                if let Some(run) = self.store.load(id).await? {
                    self.index_pause(&run).await?;
                }
                Ok(Next::Ack)
            }
            Claim::Finished(_) => Ok(Next::Ack),
            Claim::Claimed(_) => match self.drive_with_lease(id, attempt).await {
                Ok(()) | Err(StepError::Store(StoreError::LostLease(_))) => Ok(Next::Ack),
                Err(StepError::Store(StoreError::Cancelled)) => {
                    self.cancel(id).await?;
                    Ok(Next::Ack)
                }
                Err(e) => {
                    // Let the next delivery claim it at once instead of after the lease.
                    let _ = self.store.release(id, owner).await;
                    Err(e)
                }
            },
        }
    }

    fn new_run(&self, start: Option<&Event>) -> Option<Run> {
        let Some(Event::RunStart {
            run_id,
            agent,
            input,
            requested_by,
            metadata,
        }) = start
        else {
            return None;
        };
        let version = self
            .agents
            .get(agent)
            .map(|a| a.agent.version.clone())
            .unwrap_or_default();
        Some(Run::new(
            run_id.clone(),
            agent.clone(),
            version,
            input.clone(),
            requested_by.clone(),
            metadata.clone(),
        ))
    }

    /// Drives the run while renewing the lease every third of its length.
    async fn drive_with_lease(&self, id: &RunId, attempt: u64) -> Result<(), StepError> {
        let drive = self.drive(id, attempt);
        tokio::pin!(drive);
        let mut renew = tokio::time::interval(self.settings.lease / 3);
        renew.tick().await;
        loop {
            tokio::select! {
                result = &mut drive => return result,
                _ = renew.tick() => {
                    if let Err(e) = self.store.renew(id, &self.settings.owner, self.settings.lease).await {
                        warn!(error = %e, "could not renew the lease");
                    }
                }
            }
        }
    }

    async fn drive(&self, id: &RunId, attempt: u64) -> Result<(), StepError> {
        let Some(mut run) = self.store.load(id).await? else {
            return Err(StoreError::LostLease("missing".into()).into());
        };
        if run.cancel.is_some() {
            return Err(StoreError::Cancelled.into());
        }
        let Some(agent) = self.agents.get(&run.agent) else {
            let error = format!("agent {:?} is not defined", run.agent);
            return self.finish(run, Err(error)).await;
        };
        if !run.held.is_empty() {
            self.store.index_awaiting(id, false).await?;
            info!(turn = run.turns, "resuming");
            let executed = self.resume_turn(&mut run, agent).await?;
            self.save(&mut run, Save::Progress, &executed, &[]).await?;
        }
        loop {
            let max_turns = agent.agent.def.max_turns;
            if run.turns >= max_turns {
                let error = format!("the agent used all {max_turns} turns without a final answer");
                return self.finish(run, Err(error)).await;
            }
            let def = &agent.agent.def;
            let request = ModelRequest {
                model: &def.model.name,
                max_tokens: def.model.max_tokens,
                system: &def.system,
                messages: &run.messages,
                tools: &def.tools,
            };
            let blocks = match agent.model.complete(&self.http, &request).await {
                Ok(blocks) => blocks,
                Err(e @ ModelError::Retryable(_)) if attempt < self.settings.max_attempts => {
                    return Err(StepError::Model(e));
                }
                Err(e) => return self.finish(run, Err(e.to_string())).await,
            };
            run.turns += 1;
            let calls: Vec<(String, String, Value)> = blocks
                .iter()
                .filter_map(|b| match b {
                    Block::ToolUse { id, name, input } => {
                        Some((id.clone(), name.clone(), input.clone()))
                    }
                    _ => None,
                })
                .collect();
            let reply = Message {
                role: Role::Assistant,
                content: blocks,
            };
            if calls.is_empty() {
                let answer = reply.text();
                run.messages.push(reply);
                return self.finish(run, Ok(answer)).await;
            }
            run.messages.push(reply);
            let held = self.gate_and_run(&run, agent, calls).await?;
            if held.iter().any(|c| c.pending.is_some()) {
                run.held = held;
                return self.pause(run).await;
            }
            run.messages.push(results_message(&held));
            self.save(&mut run, Save::Progress, &[], &[]).await?;
        }
    }

    /// Sorts one turn's calls: refused outright (unknown tool, bad input), held for a
    /// person, or run now. The free ones run together; their results are kept in order.
    async fn gate_and_run(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        calls: Vec<(String, String, Value)>,
    ) -> Result<Vec<TurnCall>, StepError> {
        let mut held = Vec::with_capacity(calls.len());
        let mut free = Vec::new();
        // Deadlines are on Redis's clock, which the sweepers and the decision script read.
        let mut now = None;
        for (call_id, name, input) in calls {
            let mut call = TurnCall {
                call_id,
                tool: name,
                input,
                result: None,
                pending: None,
            };
            match agent.agent.tool(&call.tool) {
                None => {
                    call.result = Some(failed(format!("There is no tool named {:?}.", call.tool)));
                }
                Some(tool) => match agent.agent.validate_input(&tool.name, &call.input) {
                    Err(errors) => {
                        call.result = Some(failed(format!(
                            "The input does not match the schema of {}: {}",
                            tool.name,
                            errors.join("; ")
                        )));
                    }
                    Ok(()) => match agent.policies[&tool.name].gate(&call.input, &run.metadata) {
                        Gate::Run => free.push((held.len(), tool)),
                        Gate::Ask { reason, summary } => {
                            let now = match now {
                                Some(now) => now,
                                None => *now.insert(self.store.time_ms().await?),
                            };
                            let deadline = now + self.approval_timeout(tool).as_millis() as i64;
                            let reviewers = tool.reviewers();
                            call.pending = Some(PendingCall {
                                call_id: call.call_id.clone(),
                                tool: tool.name.clone(),
                                digest: call_digest(
                                    run.run_id.as_str(),
                                    &tool.name,
                                    &call.input,
                                    &tool.policy_version(),
                                ),
                                input: call.input.clone(),
                                summary,
                                reason,
                                deciders: self.people.resolve(&reviewers.approvers),
                                reviewers,
                                deadline: Some(deadline),
                                remind_at: tool
                                    .remind_before()
                                    .map(|before| deadline - before.as_millis() as i64)
                                    .filter(|at| *at > now),
                                escalated: false,
                            });
                        }
                    },
                },
            }
            held.push(call);
        }
        let results = futures::future::join_all(free.iter().map(|&(i, tool)| {
            let call = &held[i];
            self.execute(
                &run.run_id,
                tool,
                &call.call_id,
                &call.input,
                Outcome::Executed,
            )
        }))
        .await;
        for ((i, _), result) in free.iter().zip(results) {
            held[*i].result = Some(result?);
        }
        Ok(held)
    }

    /// Turns each decision of the held turn into a result and appends the turn's results;
    /// returns the audit entries of the calls it ran or refused.
    async fn resume_turn(
        &self,
        run: &mut Run,
        agent: &RunnableAgent,
    ) -> Result<Vec<AuditEntry>, StepError> {
        let decisions = self.store.decisions(&run.run_id).await?;
        let mut held = std::mem::take(&mut run.held);
        let mut executed = Vec::new();
        for call in held.iter_mut().filter(|c| c.result.is_none()) {
            let Some(decision) = decisions.get(&call.call_id) else {
                return Err(
                    StoreError::Corrupt(format!("call {} has no decision", call.call_id)).into(),
                );
            };
            let Some(tool) = agent.agent.tool(&call.tool) else {
                call.result = Some(failed(format!("The tool {} no longer exists.", call.tool)));
                continue;
            };
            let by = &decision.decided_by;
            let result = match decision.action {
                _ if decision.expired => CallResult {
                    outcome: Outcome::Expired,
                    is_error: true,
                    content: format!(
                        "Nobody decided on this call before its deadline ({}), so it did not run. This is not a rejection: no one reviewed it.",
                        chrono::DateTime::from_timestamp_millis(decision.decided_at)
                            .unwrap_or_default()
                            .to_rfc3339()
                    ),
                },
                Action::Approve => {
                    self.execute(
                        &run.run_id,
                        tool,
                        &call.call_id,
                        &call.input,
                        Outcome::Approved,
                    )
                    .await?
                }
                Action::Reject => CallResult {
                    outcome: Outcome::Rejected,
                    is_error: true,
                    content: format!(
                        "A reviewer ({by}) rejected this call, so it did not run. Their reason: {}",
                        decision.reason.as_deref().unwrap_or("none given")
                    ),
                },
                Action::Edit => {
                    let input = decision.input.clone().unwrap_or(Value::Null);
                    let mut result = match agent.agent.validate_input(&tool.name, &input) {
                        Err(errors) => failed(format!(
                            "The reviewer's edited input does not match the schema: {}",
                            errors.join("; ")
                        )),
                        Ok(()) => {
                            self.execute(&run.run_id, tool, &call.call_id, &input, Outcome::Edited)
                                .await?
                        }
                    };
                    result.content = format!(
                        "A reviewer ({by}) edited this call before it ran.\nYou asked for: {}\nIt ran with: {}\nTheir note: {}\nResult: {}",
                        call.input,
                        input,
                        decision.note.as_deref().unwrap_or("none given"),
                        result.content
                    );
                    result
                }
            };
            if let Some(pending) = &call.pending {
                let detail = serde_json::json!({
                    "action": decision.action, "decided_by": by,
                    "outcome": result.outcome, "is_error": result.is_error,
                });
                executed.push(self.entry(run, AuditKind::Executed, Some(pending), detail));
            }
            call.result = Some(result);
        }
        run.messages.push(results_message(&held));
        Ok(executed)
    }

    /// Runs one call through its execution record, so it never runs twice silently.
    async fn execute(
        &self,
        run: &RunId,
        tool: &ToolDef,
        call_id: &str,
        input: &Value,
        outcome: Outcome,
    ) -> Result<CallResult, StoreError> {
        match self.store.exec_begin(run, call_id).await? {
            ExecBegin::Done(result) => return Ok(result),
            ExecBegin::InterruptedBefore if !tool.idempotent => {
                warn!(call_id, tool = %tool.name, "call outcome unknown after a crash");
                let reason = format!(
                    "The outcome of this {} call is unknown: it was started, but the worker running it stopped before recording the result. It was not sent again because the tool is not idempotent. A person should check whether it took effect.",
                    tool.name
                );
                let attention = Event::RunAttention {
                    run_id: run.clone(),
                    call_id: Some(call_id.to_string()),
                    tool: Some(tool.name.clone()),
                    input: input.clone(),
                    reason: reason.clone(),
                };
                let msg_id = format!("attention:{run}:{call_id}");
                if let Err(e) = self
                    .bus
                    .publish(self.bus.names.run_attention(run), &msg_id, attention)
                    .await
                {
                    // Still recorded below and told to the model; the audit trail has it too.
                    warn!(error = %e, "could not publish run.attention");
                }
                let result = CallResult {
                    outcome: Outcome::Unknown,
                    is_error: true,
                    content: reason,
                };
                self.store.exec_finish(run, call_id, &result).await?;
                return Ok(result);
            }
            ExecBegin::InterruptedBefore | ExecBegin::Run => {}
        }
        let result = tools::call_http(&self.http, tool, run, call_id, input, outcome).await;
        self.store.exec_finish(run, call_id, &result).await?;
        Ok(result)
    }

    /// An audit entry by this worker.
    fn entry(
        &self,
        run: &Run,
        kind: AuditKind,
        call: Option<&PendingCall>,
        detail: Value,
    ) -> AuditEntry {
        let mut entry = AuditEntry::new(&run.run_id, kind);
        entry.actor = Some(self.settings.owner.clone());
        entry.call_id = call.map(|c| c.call_id.clone());
        entry.digest = call.map(|c| c.digest.clone());
        entry.detail = detail;
        entry
    }

    /// Stores the run with the audit entries of what changed and its announcements, then
    /// publishes what that queued (what NATS does not take now, the outbox sweepers send).
    async fn save(
        &self,
        run: &mut Run,
        how: Save,
        audits: &[AuditEntry],
        announce: &[Announcement],
    ) -> Result<(), StoreError> {
        run.updated_at = now_ms();
        run.status = how.status();
        let queued = self
            .store
            .save(
                run,
                &self.settings.owner,
                self.settings.lease,
                how,
                audits,
                announce,
            )
            .await?;
        if let Err(e) = self.outbox.publish(&run.run_id, &queued).await {
            warn!(error = %e, "announcements wait in the outbox");
        }
        Ok(())
    }

    async fn pause(&self, mut run: Run) -> Result<(), StepError> {
        let requested: Vec<AuditEntry> = run
            .pending()
            .map(|p| {
                let detail = serde_json::json!({
                    "tool": p.tool, "input": p.input, "summary": p.summary, "reason": p.reason,
                    "approvers": p.reviewers.approvers, "deciders": p.deciders,
                    "quorum": p.reviewers.quorum, "deadline": p.deadline,
                });
                self.entry(&run, AuditKind::Requested, Some(p), detail)
            })
            .collect();
        let announce = self.pause_announcement(&run);
        self.save(&mut run, Save::Pause, &requested, &[announce])
            .await?;
        self.index_pause(&run).await?;
        info!(
            turn = run.turns,
            pending = requested.len(),
            "paused for approval"
        );
        Ok(())
    }

    /// Lists a paused run in the inbox and puts its timers where the sweepers look.
    async fn index_pause(&self, run: &Run) -> Result<(), StoreError> {
        self.store.index_awaiting(&run.run_id, true).await?;
        self.schedule_timers(run).await
    }

    async fn finish(&self, mut run: Run, result: Result<String, String>) -> Result<(), StepError> {
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
        let entry = self.entry(&run, kind, None, detail);
        let announce = self.end_announcement(&run, status);
        self.end(run, status, entry, vec![announce]).await
    }

    /// Finishes a run someone cancelled, from its last stored state: its undecided held calls
    /// are closed (their channels are told) and `run.cancelled` is announced.
    async fn cancel(&self, id: &RunId) -> Result<(), StepError> {
        let Some(run) = self.store.load(id).await? else {
            return Ok(());
        };
        let Some(cancel) = run.cancel.clone() else {
            return Err(StoreError::Corrupt("cancelled without a cancellation".into()).into());
        };
        let names = &self.bus.names;
        let decisions = self.store.decisions(id).await?;
        let mut announce: Vec<Announcement> = run
            .pending()
            .filter(|p| !decisions.contains_key(&p.call_id))
            .map(|p| {
                let event = Event::ApprovalCancelled {
                    run_id: id.clone(),
                    call_id: p.call_id.clone(),
                    cancelled_by: cancel.by.clone(),
                    channels: p.reviewers.channels.clone(),
                };
                let msg_id = format!("cancelled:{id}:{}", p.call_id);
                Announcement::new(msg_id, names.approval_cancelled(id), event)
            })
            .collect();
        announce.push(self.end_announcement(&run, RunStatus::Cancelled));
        let detail = serde_json::json!({"by": cancel.by, "reason": cancel.reason});
        let entry = self.entry(&run, AuditKind::Cancelled, None, detail);
        self.store.index_awaiting(id, false).await?;
        self.end(run, RunStatus::Cancelled, entry, announce).await
    }

    async fn end(
        &self,
        mut run: Run,
        status: RunStatus,
        entry: AuditEntry,
        announce: Vec<Announcement>,
    ) -> Result<(), StepError> {
        let retention = self.settings.retention;
        self.save(
            &mut run,
            Save::Finish { status, retention },
            &[entry],
            &announce,
        )
        .await?;
        info!(status = status.as_str(), "run finished");
        Ok(())
    }

    fn pause_announcement(&self, run: &Run) -> Announcement {
        let names = &self.bus.names;
        let event = Event::ApprovalRequested {
            run_id: run.run_id.clone(),
            agent: run.agent.clone(),
            turn: run.turns,
            text: run.held_turn_text(),
            calls: run.pending().cloned().collect(),
            evidence: run
                .held
                .iter()
                .filter_map(|c| {
                    let result = c.result.as_ref()?;
                    Some(Evidence {
                        call_id: c.call_id.clone(),
                        tool: c.tool.clone(),
                        input: c.input.clone(),
                        content: result.content.clone(),
                        is_error: result.is_error,
                    })
                })
                .collect(),
            requested_by: run.requested_by.clone(),
        };
        Announcement::new(
            format!("requested:{}:{}", run.run_id, run.turns),
            names.approval_requested(&run.run_id),
            event,
        )
    }

    fn end_announcement(&self, run: &Run, status: RunStatus) -> Announcement {
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
        Announcement::new(format!("end:{id}"), subject, event)
    }
}

fn failed(content: String) -> CallResult {
    CallResult {
        outcome: Outcome::Failed,
        content,
        is_error: true,
    }
}

/// The one message that answers a turn: a result per call, in the model's order.
fn results_message(calls: &[TurnCall]) -> Message {
    Message {
        role: Role::User,
        content: calls
            .iter()
            .map(|c| {
                let result = c
                    .result
                    .clone()
                    .unwrap_or_else(|| failed("No result.".into()));
                Block::ToolResult {
                    tool_use_id: c.call_id.clone(),
                    content: result.content,
                    is_error: result.is_error,
                }
            })
            .collect(),
    }
}

/// 1 s, 2 s, 4 s … up to a minute between attempts.
fn backoff(attempt: u64) -> Duration {
    Duration::from_secs(1 << attempt.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}
