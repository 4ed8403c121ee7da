//! The tool loop. A worker that has claimed a run drives it turn by turn: ask the model, run
//! the calls that need nobody, hold the ones that need a person, and either pause (the run is
//! stored and `approval.requested` published) or give all results of the turn back in one
//! message. A claimed paused run is resumed from its stored turn: decided calls run or are
//! refused, and the loop carries on.
//!
//! Every write goes through the lease, so a worker that lost its run (it stalled and another
//! took over) stops at its next write. Each write carries the audit entries of what changed
//! and the announcements others must hear of, queued in the run's outbox by the same script
//! and published from there (see [`countersign_store::relay`]).
//!
//! Here: claiming and the turn loop. `calls`: what becomes of each call of a turn.
//! `hold`: a call held for a person, new or asked about again.
//! `recheck`: a decided call whose policy changed since it was held. `shadow`: a candidate
//! policy watched next to the live one.
//! `execute`: the execution record. `ending`: pausing and finishing. `timers`: reminders,
//! deadlines and escalation.

mod calls;
mod ending;
mod execute;
mod hold;
mod live;
mod recheck;
mod reviewer;
mod shadow;
mod stages;
mod timers;
mod windows;

use crate::agents::{Agents, RunnableAgent};
use countersign_llm::{ModelError, ModelRequest};
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::live::LiveEvent;
use countersign_model::now_ms;
use countersign_model::people::Directory;
use countersign_model::run::{
    Block, CallResult, Decision, HeldCall, Message, Run, RunId, RunStatus, Speaker, TurnCall,
};
use countersign_runtime::bus::{Bus, BusError};
use countersign_runtime::metrics::Metrics;
use countersign_runtime::trace_context;
use countersign_runtime::work::{Outcome, Source};
use countersign_store::relay::Relay;
use countersign_store::{
    Announcement, Changes, Claim, Claimed, Closing, DecideOutcome, Indexes, Proposal, Save,
    StoreError, WorkerStore,
};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, info, warn};

/// Which shared consumer's message brought a step of work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Job {
    /// `runs.start`: a run the gateway stored, or the nudge of a cancel.
    Start,
    /// `approval.decided.<run_id>`.
    Decided,
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

/// How resuming a paused turn ended.
enum Resumed {
    /// Every call has its result, appended for the model; the last decision was made then.
    Turn { last_decided: i64 },
    /// A call's policy changed and asks a person again: the run pauses on it.
    HeldAgain,
}

pub(crate) struct EngineSettings {
    /// This worker's name in leases.
    pub owner: String,
    pub lease: Duration,
    pub max_attempts: u64,
    pub retention: Duration,
    /// How long a held call waits for a person when its policy sets no `timeout`.
    pub approval_timeout: Duration,
}

pub(crate) struct Engine {
    store: WorkerStore,
    bus: Bus,
    outbox: Relay,
    /// The agents as last loaded; see [`Engine::agents`].
    agents: std::sync::RwLock<Arc<Agents>>,
    people: Directory,
    http: reqwest::Client,
    settings: EngineSettings,
    metrics: Metrics,
}

impl Engine {
    pub(crate) fn new(
        store: WorkerStore,
        bus: Bus,
        agents: Arc<Agents>,
        people: Directory,
        settings: EngineSettings,
        metrics: Metrics,
    ) -> Self {
        Self {
            outbox: Relay::new(&store, bus.clone(), metrics.clone()),
            metrics,
            store,
            bus,
            agents: std::sync::RwLock::new(agents),
            people,
            http: reqwest::Client::new(),
            settings,
        }
    }

    /// The agents as last loaded. A step keeps the set it started with.
    pub(crate) fn agents(&self) -> Arc<Agents> {
        self.agents.read().expect("agents lock").clone()
    }

    /// Puts a reloaded set of agents in place for the steps that start from now.
    pub(crate) fn replace_agents(&self, agents: Agents) {
        *self.agents.write().expect("agents lock") = Arc::new(agents);
    }

    /// This worker's figures.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// One step of work for a run, brought by a `runs.start` job or an `approval.decided`
    /// event: claim the run and drive it as far as it goes. Safe to call for any message any
    /// number of times: what is already done is not done again. The step is a span of the
    /// trace `parent` (the message's `traceparent`) names.
    ///
    /// A message never creates a run: runs are stored by the gateway, with the requester its
    /// door established, before their `runs.start` is published. A message naming a run that
    /// is not stored (whoever could publish it chose its requester) is counted, logged and
    /// acked, and changes nothing.
    pub(crate) async fn process(
        &self,
        id: &RunId,
        job: Job,
        attempt: u64,
        parent: Option<&str>,
    ) -> Outcome {
        let span = tracing::info_span!("run.step", run_id = %id, attempt);
        trace_context::adopt(&span, parent);
        self.step(id, job, attempt).instrument(span).await
    }

    async fn step(&self, id: &RunId, job: Job, attempt: u64) -> Outcome {
        match self.try_process(id, job, attempt).await {
            Ok(next) => next,
            Err(e) if e.worth_retrying() => {
                warn!(error = %e, "step failed; the message will be delivered again");
                Outcome::Retry(backoff(attempt))
            }
            Err(e) => {
                self.give_up(id, &e).await;
                Outcome::Ack
            }
        }
    }

    /// Leaves a run whose stored state cannot be read to a person: trying again would read
    /// the same. Its lease is released and `run.attention` published; the message is acked.
    async fn give_up(&self, id: &RunId, e: &StepError) {
        warn!(error = %e, "the run's stored state cannot be read; a person must look");
        let _ = self.store.release(id, &self.settings.owner).await;
        let reason =
            format!("The run's stored state cannot be read ({e}), so no worker goes on with it.");
        self.attention(id, None, reason).await;
    }

    async fn try_process(&self, id: &RunId, job: Job, attempt: u64) -> Result<Outcome, StepError> {
        let owner = &self.settings.owner;
        match self.store.claim(id, owner, self.settings.lease).await? {
            Claim::Missing => {
                self.metrics().unknown_run(job.stream());
                warn!(
                    stream = job.stream(),
                    "a message names a run that is not stored; acked, nothing created"
                );
                Ok(Outcome::Ack)
            }
            Claim::Busy(left) => Ok(Outcome::Retry(left + Duration::from_millis(250))),
            // The pause's announcement is in the outbox, and its listing and timers were
            // written with it (or, under Cluster, just before).
            Claim::Waiting | Claim::Finished(_) => Ok(Outcome::Ack),
            Claim::Claimed(claimed) => {
                let mut unsaved = Changes::default();
                match self.drive_with_lease(*claimed, attempt, &mut unsaved).await {
                    Ok(()) | Err(StepError::Store(StoreError::LostLease(_))) => Ok(Outcome::Ack),
                    // What the drive did and could not save, refused for the cancel, goes
                    // with the save that ends the run.
                    Err(StepError::Store(StoreError::Cancelled)) => {
                        self.cancel(id, unsaved).await?;
                        Ok(Outcome::Ack)
                    }
                    Err(e) => {
                        // Let the next delivery claim it at once instead of after the lease.
                        let _ = self.store.release(id, owner).await;
                        Err(e)
                    }
                }
            }
        }
    }

    /// Drives the run while renewing the lease every third of its length; what the drive did
    /// and has not saved when it stops is left in `unsaved`.
    async fn drive_with_lease(
        &self,
        claimed: Claimed,
        attempt: u64,
        unsaved: &mut Changes,
    ) -> Result<(), StepError> {
        let id = claimed.run.run_id.clone();
        let id = &id;
        let drive = self.drive(claimed, attempt, unsaved);
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

    async fn drive(
        &self,
        claimed: Claimed,
        attempt: u64,
        unsaved: &mut Changes,
    ) -> Result<(), StepError> {
        let Claimed { mut run, decisions } = claimed;
        if run.cancel.is_some() {
            return Err(StoreError::Cancelled.into());
        }
        let agents = self.agents();
        let Some(agent) = agents.get(&run.agent) else {
            let error = format!("agent {:?} is not defined", run.agent);
            return self.finish(run, Err(error), unsaved).await;
        };
        // When the decisions this drive resumes from were made, until the model is called.
        let mut resumed_from = None;
        // `unsaved`: audit entries and announcements of calls run or checked again, written
        // with the drive's next save and emptied by it: the execution records hold the
        // results meanwhile, so a drive that stops before it resumes the turn again from them
        // and finds the same entries, and a save is saved.
        if !run.paused_turn.is_empty() && run.status == RunStatus::Running {
            // A turn an earlier attempt stored and did not finish: its calls, as stored, run
            // through their execution records (what ran is not run again).
            info!(turn = run.turns, "taking over a stored turn");
            match self.play_turn(run, agent, false, unsaved).await? {
                Some(next) => run = next,
                None => return Ok(()),
            }
        } else if !run.paused_turn.is_empty() {
            match self.resume(&mut run, agent, &decisions, unsaved).await? {
                Resumed::Turn { last_decided } => resumed_from = Some(last_decided),
                Resumed::HeldAgain => return self.pause(run, unsaved).await,
            }
        }
        loop {
            let max_turns = agent.agent.def.max_turns;
            if run.turns >= max_turns {
                let error = format!("the agent used all {max_turns} turns without a final answer");
                return self.finish(run, Err(error), unsaved).await;
            }
            if let Some(decided) = resumed_from.take() {
                self.metrics.resumed_after(now_ms() - decided);
            }
            let blocks = match self.ask_model(&run, agent).await {
                Ok(blocks) => blocks,
                Err(e @ ModelError::Retryable(_)) if attempt < self.settings.max_attempts => {
                    return Err(StepError::Model(e));
                }
                Err(e) => return self.finish(run, Err(e.to_string()), unsaved).await,
            };
            run.turns += 1;
            let calls = run.calls_asked(&blocks);
            let reply = Message {
                role: Speaker::Assistant,
                content: blocks,
            };
            if calls.is_empty() {
                let answer = reply.text();
                run.messages.push(reply);
                return self.finish(run, Ok(answer), unsaved).await;
            }
            run.messages.push(reply);
            run.paused_turn = self.gate(&run, agent, calls, unsaved).await?;
            self.review(&mut run, agent, unsaved).await;
            let marked = run.paused_turn.iter().any(TurnCall::runs_now);
            if marked {
                self.store_turn(&mut run, unsaved).await?;
            }
            match self.play_turn(run, agent, marked, unsaved).await? {
                Some(next) => run = next,
                None => return Ok(()),
            }
        }
    }

    /// Takes up a paused run from its decisions: says it resumed (to the live stream, and
    /// with the drive's next save to the shard's indexes) and plays what was decided of its
    /// stored turn.
    async fn resume(
        &self,
        run: &mut Run,
        agent: &RunnableAgent,
        decisions: &std::collections::HashMap<String, Decision>,
        unsaved: &mut Changes,
    ) -> Result<Resumed, StepError> {
        let id = &run.run_id.clone();
        unsaved.index = std::mem::take(&mut unsaved.index).then(Indexes::resumed(run));
        info!(turn = run.turns, "resuming");
        let resumed = LiveEvent::RunResumed {
            run_id: id.clone(),
            turn: run.turns,
        };
        self.live(id, resumed).await;
        let resumed = self.resume_turn(run, agent, decisions, unsaved).await?;
        if let Resumed::Turn { .. } = resumed {
            self.metrics.run("resumed");
        }
        Ok(resumed)
    }

    /// Asks the model for the run's next turn, publishing its text live as it comes and
    /// timing the call.
    async fn ask_model(&self, run: &Run, agent: &RunnableAgent) -> Result<Vec<Block>, ModelError> {
        let id = &run.run_id;
        let def = &agent.agent.def;
        let request = ModelRequest {
            model: &def.model.name,
            max_tokens: def.model.max_tokens,
            system: &def.system,
            messages: &run.messages,
            tools: &def.tools,
            metadata: &run.metadata,
        };
        let turn = run.turns + 1;
        self.live(
            id,
            LiveEvent::TurnStarted {
                run_id: id.clone(),
                turn,
            },
        )
        .await;
        let started = std::time::Instant::now();
        // The text goes out as it comes, while the model is still writing; the senders
        // go with the call, so the text's publishing ends with it.
        let (deltas, text) = tokio::sync::mpsc::unbounded_channel();
        let call = async move { agent.model.complete(&self.http, &request, &deltas).await };
        let (completion, ()) = tokio::join!(
            call.instrument(tracing::info_span!("model.call", model = %def.model.name, turn)),
            self.live_text(id, turn, text)
        );
        let provider = def.model.provider.as_str();
        self.metrics.model_call(provider, started.elapsed());
        completion.map(|c| {
            let usage = c.usage;
            self.metrics
                .model_tokens(provider, usage.input_tokens, usage.output_tokens);
            c.blocks
        })
    }

    /// Stores the turn before any of its calls runs, with the calls to run marked started in
    /// the same step: a worker that takes over finds these calls and their execution records,
    /// not the model's next answer. The drive's unsaved entries go with it.
    async fn store_turn(&self, run: &mut Run, unsaved: &mut Changes) -> Result<(), StepError> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        self.save(run, Save::Turn { token }, unsaved).await?;
        *unsaved = Changes::default();
        Ok(())
    }

    /// Plays the turn in `run.paused_turn`: runs its free calls (`marked` started when the
    /// turn was stored), then pauses on its held ones (`None`: the drive is over) or appends
    /// every result for the model and gives the run back for its next turn. Nothing is saved
    /// then: the stored turn and the execution records have all of it, and the next save (the
    /// next turn, a pause, the end) carries the executions' audit entries.
    async fn play_turn(
        &self,
        mut run: Run,
        agent: &RunnableAgent,
        marked: bool,
        unsaved: &mut Changes,
    ) -> Result<Option<Run>, StepError> {
        let mut turn = std::mem::take(&mut run.paused_turn);
        self.run_free(&run, agent, &mut turn, marked, unsaved)
            .await?;
        if turn.iter().any(|c| c.held.is_some()) {
            run.paused_turn = turn;
            self.pause(run, unsaved).await?;
            return Ok(None);
        }
        run.messages.push(results_message(&turn));
        Ok(Some(run))
    }

    /// Closes the held call `(call_id, digest)` undecided, as `(actor, reason)` say, by what
    /// `by` names (an expiry, a policy change: no person), through the decision script, with
    /// its audit `entry`.
    async fn close_unattended(
        &self,
        run: &RunId,
        (call_id, digest): (&str, &str),
        (actor, reason): (&str, &str),
        entry: AuditEntry,
        by: Closing,
    ) -> Result<DecideOutcome, StoreError> {
        let at = self.store.time_ms().await?;
        let mut decision = Decision::closing(call_id, digest, actor, by.door(), reason, at);
        decision.expired = by == Closing::Deadline;
        decision.superseded = by == Closing::Policy;
        let proposal = Proposal {
            decision,
            checked_digest: None,
            entry,
            receipt_for: String::new(),
        };
        self.store.close(run, by, actor, vec![proposal]).await
    }

    /// Publishes what a script queued; what fails waits in the outbox for a sweeper.
    async fn publish(&self, run: &RunId, queued: &[Announcement]) {
        if let Err(e) = self.outbox.publish(run, queued).await {
            warn!(run_id = %run, error = %e, "announcements wait in the outbox");
        }
    }

    /// An audit entry by this worker.
    fn entry(
        &self,
        run: &Run,
        kind: AuditKind,
        call: Option<&HeldCall>,
        detail: Value,
    ) -> AuditEntry {
        let mut entry = AuditEntry::new(&run.run_id, kind);
        entry.actor = Some(self.settings.owner.clone());
        entry.call_id = call.map(|c| c.call_id.clone());
        entry.digest = call.map(|c| c.digest.clone());
        entry.detail = detail;
        entry
    }

    /// Stores the run with its changes, then publishes what that queued (what NATS does not
    /// take now, the outbox sweepers send). The caller empties what it saved once saved: a
    /// save refused for a cancel leaves them for the save that ends the run.
    async fn save(&self, run: &mut Run, how: Save, changes: &Changes) -> Result<(), StoreError> {
        run.updated_at = now_ms();
        run.status = how.status();
        let queued = self
            .store
            .save(run, &self.settings.owner, self.settings.lease, how, changes)
            .await?;
        if let Err(e) = self.outbox.publish(&run.run_id, &queued).await {
            warn!(error = %e, "announcements wait in the outbox");
        }
        Ok(())
    }
}

/// The one message that answers a turn: a result per call, in the model's order.
fn results_message(calls: &[TurnCall]) -> Message {
    Message {
        role: Speaker::User,
        content: calls
            .iter()
            .map(|c| {
                let result = c
                    .result
                    .clone()
                    .unwrap_or_else(|| CallResult::failed("No result.".into()));
                Block::ToolResult {
                    tool_use_id: c.model_id().to_string(),
                    content: result.content,
                    is_error: result.is_error,
                    outcome: Some(result.outcome),
                    images: result.images,
                    mcp: result.mcp,
                }
            })
            .collect(),
    }
}

/// 1 s, 2 s, 4 s … up to a minute between attempts.
fn backoff(attempt: u64) -> Duration {
    Duration::from_secs(1 << attempt.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}
