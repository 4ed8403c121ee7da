//! Starting and cancelling runs: what is stored, audited and announced. Runs are created
//! only here, with the requester the caller's door established: a run is stored queued
//! before `runs.start` is published (a worker creates no run from a message). A repeated
//! start (the same `Idempotency-Key` and request) finds its run stored and announces it
//! again only while it is still queued; the key with another request is refused. A cancel is recorded, audited and its nudge queued in one script; a
//! worker then finishes the run as `cancelled` at its next step.

pub(crate) mod wait;

use crate::state::AppState;
use countersign_model::agent::Agent;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::digest::{canonical_json, sha256_hex};
use countersign_model::events::Event;
use countersign_model::run::{Cancellation, HeldCall, Run, RunId, RunStatus};
use countersign_runtime::names::msg_id;
use countersign_runtime::trace_context;
use countersign_store::{Announcement, CancelOutcome, StoreError};
use serde_json::{Value, json};
use std::time::Duration;
use tracing::Instrument;

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error("{0}")]
    NoRun(String),
    /// The run finished before it could be cancelled.
    #[error("{0}")]
    Finished(String),
    /// The idempotency key started another request's run.
    #[error("{0}")]
    IdempotencyKeyReused(String),
    /// Redis or NATS failed.
    #[error("{0}")]
    Backend(String),
}

impl From<countersign_store::StoreError> for RunError {
    fn from(e: countersign_store::StoreError) -> Self {
        Self::Backend(e.to_string())
    }
}

impl From<countersign_runtime::bus::BusError> for RunError {
    fn from(e: countersign_runtime::bus::BusError) -> Self {
        Self::Backend(e.to_string())
    }
}

/// A paused run and those of its held calls that still wait for a decision; `None` once
/// the run is gone or has moved on (the inbox index may still list it for a moment).
pub(crate) async fn awaiting_decision(
    state: &AppState,
    id: &RunId,
) -> Result<Option<(Run, Vec<HeldCall>)>, StoreError> {
    let Some(run) = state.store.load(id).await? else {
        return Ok(None);
    };
    if run.status != RunStatus::AwaitingApproval || run.cancel.is_some() {
        return Ok(None);
    }
    let decisions = state.store.decisions(id).await?;
    let calls = run
        .held_calls()
        .filter(|c| !decisions.contains_key(&c.call_id))
        .cloned()
        .collect();
    Ok(Some((run, calls)))
}

/// A run to start, checked already.
pub(crate) struct NewRun<'a> {
    pub(crate) agent: &'a Agent,
    /// The user's request, the first message of the conversation.
    pub(crate) input: String,
    pub(crate) requested_by: String,
    pub(crate) metadata: Value,
    /// The caller's idempotency key, scoped to the caller: a retry gets the same run.
    pub(crate) idempotency: Option<Idempotency>,
}

/// An idempotency key as stored, and the request it came with.
pub(crate) struct Idempotency {
    /// The key's hash, scoped to the caller.
    pub(crate) key_digest: String,
    /// The hash of the request's canonical JSON, so the same key with another request is
    /// refused rather than answered with the first request's run.
    pub(crate) request_hash: String,
}

impl Idempotency {
    /// Client `principal`'s `key`, sent with `request` (as it will be stored). Keys are per
    /// caller, so two clients cannot collide on the same key; the request is hashed in its
    /// canonical JSON, so the same JSON written otherwise is the same request.
    pub(crate) fn new(principal: &str, key: &str, request: &Value) -> Self {
        Self {
            key_digest: sha256_hex(format!("{principal}\n{key}")),
            request_hash: sha256_hex(canonical_json(request)),
        }
    }
}

/// Stores the run and announces it; the run's id and its status now.
pub(crate) async fn start(
    state: &AppState,
    new: NewRun<'_>,
) -> Result<(RunId, RunStatus), RunError> {
    let mut run_id = RunId::new();
    if let Some(key) = &new.idempotency {
        let ttl = Duration::from_secs(state.config.idempotency_ttl_secs);
        let bound = state
            .store
            .bind_idempotency_key(&key.key_digest, &run_id, &key.request_hash, ttl)
            .await?;
        if let Some(existing) = bound {
            if !existing.made_by(&key.request_hash) {
                return Err(RunError::IdempotencyKeyReused(format!(
                    "this Idempotency-Key started run {} with another request; \
                     use a new key for a new request",
                    existing.run
                )));
            }
            run_id = existing.run;
        }
    }
    let mut run = Run::new(
        run_id.clone(),
        new.agent.def.name.clone(),
        new.agent.version.clone(),
        new.input,
        Some(new.requested_by),
        new.metadata.clone(),
    );
    // Every later span of the run, on any gateway or worker, joins this request's trace.
    run.trace = countersign_runtime::trace_context::current();
    // A repeated key finds its run already stored; it is announced again only while still
    // queued, in case the first attempt stopped between storing and publishing.
    let status = if state.store.create(&run).await? {
        state.metrics.run("started");
        RunStatus::Queued
    } else {
        match state.store.load(&run_id).await? {
            Some(existing) => existing.status,
            None => return Err(StoreError::Corrupt(format!("run {run_id} vanished")).into()),
        }
    };
    if status == RunStatus::Queued {
        let event = Event::RunStart {
            run_id: run_id.clone(),
            agent: run.agent,
            input: run.input,
            requested_by: run.requested_by,
            metadata: new.metadata,
        };
        let names = &state.bus.names;
        state
            .bus
            .publish(names.runs_start(), &msg_id::start(&run_id), event)
            .await?;
    }
    Ok((run_id, status))
}

/// Asks `run` to stop, as `by` asked through `via` (`api`, `mcp`) with `reason`: a span of the
/// run's trace.
pub(crate) async fn cancel(
    state: &AppState,
    run: &Run,
    (by, via): (String, &str),
    reason: Option<String>,
) -> Result<(), RunError> {
    let span = tracing::info_span!("run.cancel", run_id = %run.run_id, by = %by, via);
    trace_context::adopt(&span, run.trace.as_deref());
    request_cancel(state, run, (by, via), reason)
        .instrument(span)
        .await
}

async fn request_cancel(
    state: &AppState,
    run: &Run,
    (by, via): (String, &str),
    reason: Option<String>,
) -> Result<(), RunError> {
    let cancel = Cancellation {
        by: by.clone(),
        reason: reason.clone(),
        at: countersign_model::now_ms(),
    };
    let mut entry = AuditEntry::new(&run.run_id, AuditKind::CancelRequested);
    entry.actor = Some(by);
    entry.via = Some(via.into());
    entry.detail = json!({"reason": reason});
    let names = &state.bus.names;
    // The job that brings a worker to the run, which finishes it as cancelled.
    let nudge = Announcement::new(
        msg_id::cancel(&run.run_id),
        names.runs_start(),
        Event::RunStart {
            run_id: run.run_id.clone(),
            agent: run.agent.clone(),
            input: run.input.clone(),
            requested_by: run.requested_by.clone(),
            metadata: run.metadata.clone(),
        },
    );
    let run_id = run.run_id.as_str();
    match state
        .store
        .cancel(&run.run_id, &cancel, &entry, &nudge)
        .await?
    {
        CancelOutcome::Requested(_, queued) => {
            if let Err(e) = state.outbox.publish(&run.run_id, &queued).await {
                tracing::warn!(error = %e, "cancel recorded; its nudge waits in the outbox");
            }
            Ok(())
        }
        CancelOutcome::Finished(status) => Err(RunError::Finished(format!(
            "run {run_id:?} is {} and cannot be cancelled",
            status.as_str()
        ))),
        CancelOutcome::NoRun => Err(RunError::NoRun(format!("no run {run_id:?}"))),
    }
}
