//! Deciding a held call, whatever channel the decision came through: check its shape, the
//! edit against the tool's schema, and that the person may decide; record it atomically
//! (first decision per call wins; a quorum collects one approval per person); audit it,
//! accepted or refused; and announce it on `approval.decided.<run_id>`.

use crate::error::ApiError;
use crate::state::AppState;
use axum::http::StatusCode;
use countersign_shared::audit::{AuditEntry, AuditKind};
use countersign_shared::events::Event;
use countersign_shared::now_ms;
use countersign_shared::run::{Action, Decision, PendingCall, Run};
use countersign_shared::store::DecideOutcome;
use serde::Deserialize;
use serde_json::{Value, json};

/// A decision as a reviewer submits it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Proposed {
    pub call_id: String,
    pub digest: Option<String>,
    pub action: Action,
    pub input: Option<Value>,
    pub note: Option<String>,
    pub reason: Option<String>,
}

/// A decision that passed every check, ready to record.
pub struct Checked {
    pub decision: Decision,
    pub quorum: u32,
    /// Where the call was sent, to be told the outcome.
    pub channels: Vec<String>,
}

/// How a recorded decision stands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Recorded {
    Recorded {
        all_decided: bool,
    },
    /// One approval of several needed.
    Vote {
        approvals: u32,
        quorum: u32,
    },
    AlreadyRecorded,
    /// This person's approval was counted before; the quorum is still short.
    AlreadyVoted,
}

impl Recorded {
    pub fn label(self) -> &'static str {
        match self {
            Self::Recorded { .. } => "recorded",
            Self::Vote { .. } => "approval_recorded",
            Self::AlreadyRecorded | Self::AlreadyVoted => "already_recorded",
        }
    }
}

/// Checks one decision by `principal` through `channel`. An authorization refusal is
/// written to the audit trail before it is returned.
pub async fn check(
    state: &AppState,
    run: &Run,
    proposed: Proposed,
    principal: &str,
    channel: &str,
) -> Result<Checked, ApiError> {
    let call = proposed.call_id.as_str();
    let digest = proposed
        .digest
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "the decision for call {call:?} has no digest: quote the digest of the call you were shown"
            ))
        })?;
    let blank = |s: &Option<String>| s.as_deref().is_none_or(|s| s.trim().is_empty());
    match proposed.action {
        Action::Reject if blank(&proposed.reason) => {
            return Err(ApiError::bad_request(format!(
                "rejecting call {call:?} needs a reason"
            )));
        }
        Action::Edit if proposed.input.is_none() => {
            return Err(ApiError::bad_request(format!(
                "editing call {call:?} needs an input"
            )));
        }
        Action::Approve | Action::Reject if proposed.input.is_some() => {
            return Err(ApiError::bad_request(format!(
                "only an edit carries an input (call {call:?})"
            )));
        }
        _ => {}
    }
    // A call no longer pending is left to the store, which knows whether it was decided.
    let pending = run.pending().find(|p| p.call_id == call);
    let quorum = pending.map_or(1, |p| p.reviewers.quorum);
    if let Some(pending) = pending {
        if let Err(why) = state.people.may_decide(
            principal,
            proposed.action,
            &pending.reviewers,
            run.requested_by.as_deref(),
        ) {
            audit_refusal(state, run, &proposed, &digest, principal, channel, &why).await?;
            return Err(ApiError::new(StatusCode::FORBIDDEN, "not_an_approver", why));
        }
        check_edit(state, run, pending, &proposed)?;
    }
    let fingerprint = Decision::fingerprint_of(
        proposed.action,
        proposed.input.as_ref(),
        proposed.note.as_deref(),
        proposed.reason.as_deref(),
    );
    Ok(Checked {
        quorum,
        channels: pending
            .map(|p| p.reviewers.channels.clone())
            .unwrap_or_default(),
        decision: Decision {
            call_id: proposed.call_id,
            digest,
            action: proposed.action,
            input: proposed.input,
            note: proposed.note,
            reason: proposed.reason,
            decided_by: principal.to_string(),
            channel: channel.to_string(),
            decided_at: now_ms(),
            fingerprint,
            expired: false,
        },
    })
}

fn check_edit(
    state: &AppState,
    run: &Run,
    pending: &PendingCall,
    proposed: &Proposed,
) -> Result<(), ApiError> {
    let (Action::Edit, Some(input)) = (proposed.action, &proposed.input) else {
        return Ok(());
    };
    if pending.reviewers.quorum > 1 {
        return Err(ApiError::bad_request(format!(
            "call {:?} needs {} approvals, and an edit cannot be approved by several people at once: approve it as it is, or reject it with a reason",
            pending.call_id, pending.reviewers.quorum
        )));
    }
    if let Some(agent) = state.catalog.get(&run.agent)
        && let Err(errors) = agent.validate_input(&pending.tool, input)
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            format!(
                "the edited input for call {:?} does not match the schema of {}",
                pending.call_id, pending.tool
            ),
        )
        .with_details(json!({ "errors": errors })));
    }
    Ok(())
}

/// Checks and records one decision on a run, as a channel other than the API makes it.
pub async fn decide_one(
    state: &AppState,
    run_id: &str,
    proposed: Proposed,
    principal: &str,
    channel: &str,
) -> Result<Recorded, ApiError> {
    let run = crate::routes::load_run(state, run_id).await?;
    let checked = check(state, &run, proposed, principal, channel).await?;
    record(state, &run, checked).await
}

/// Records a checked decision, audits it, and announces it.
pub async fn record(state: &AppState, run: &Run, checked: Checked) -> Result<Recorded, ApiError> {
    let Checked {
        decision,
        quorum,
        channels,
    } = checked;
    let id = &run.run_id;
    let outcome = state.store.decide(id, &decision, quorum).await?;
    let recorded = match outcome {
        DecideOutcome::Recorded { all_decided } => Recorded::Recorded { all_decided },
        DecideOutcome::Vote { approvals } => Recorded::Vote { approvals, quorum },
        // Announced again below in case the first attempt stopped before publishing.
        DecideOutcome::Duplicate(_) => Recorded::AlreadyRecorded,
        DecideOutcome::DuplicateVote => Recorded::AlreadyVoted,
        refused => {
            let error = refusal(id.as_str(), &decision.call_id, refused);
            audit_decision(
                state,
                run,
                &decision,
                AuditKind::Refused,
                json!({"why": error.message}),
            )
            .await?;
            return Err(error);
        }
    };
    if matches!(recorded, Recorded::Recorded { .. } | Recorded::Vote { .. }) {
        let detail = json!({
            "action": decision.action, "input": decision.input, "note": decision.note,
            "reason": decision.reason, "quorum": quorum,
            "approvals": match recorded { Recorded::Vote { approvals, .. } => approvals, _ => quorum },
        });
        audit_decision(state, run, &decision, AuditKind::Decided, detail).await?;
    }
    // Only a final decision is announced: it is what workers act on, and its message id
    // is the call's, so nothing else may take that id first.
    if matches!(
        recorded,
        Recorded::Recorded { .. } | Recorded::AlreadyRecorded
    ) {
        let event = Event::ApprovalDecided {
            run_id: id.clone(),
            call_id: decision.call_id.clone(),
            action: decision.action,
            decided_by: decision.decided_by.clone(),
            all_decided: matches!(recorded, Recorded::Recorded { all_decided: true }),
            channels,
        };
        let msg_id = format!("decided:{id}:{}", decision.call_id);
        let subject = state.bus.names.approval_decided(id);
        state.bus.publish(subject, &msg_id, event).await?;
    }
    Ok(recorded)
}

async fn audit_decision(
    state: &AppState,
    run: &Run,
    decision: &Decision,
    kind: AuditKind,
    detail: Value,
) -> Result<(), ApiError> {
    let mut entry = AuditEntry::new(&run.run_id, kind);
    entry.call_id = Some(decision.call_id.clone());
    entry.actor = Some(decision.decided_by.clone());
    entry.channel = Some(decision.channel.clone());
    entry.digest = Some(decision.digest.clone());
    entry.detail = detail;
    Ok(state.store.audit(&entry).await?)
}

async fn audit_refusal(
    state: &AppState,
    run: &Run,
    proposed: &Proposed,
    digest: &str,
    principal: &str,
    channel: &str,
    why: &str,
) -> Result<(), ApiError> {
    let mut entry = AuditEntry::new(&run.run_id, AuditKind::Refused);
    entry.call_id = Some(proposed.call_id.clone());
    entry.actor = Some(principal.to_string());
    entry.channel = Some(channel.to_string());
    entry.digest = Some(digest.to_string());
    entry.detail = json!({"action": proposed.action, "why": why});
    Ok(state.store.audit(&entry).await?)
}

fn refusal(run_id: &str, call: &str, outcome: DecideOutcome) -> ApiError {
    match outcome {
        DecideOutcome::NoRun => ApiError::not_found(format!("no run {run_id:?}")),
        DecideOutcome::NoCall => ApiError::not_found(format!(
            "run {run_id:?} has no call {call:?} waiting for a decision"
        )),
        DecideOutcome::NotWaiting(status) => ApiError::conflict(
            "not_awaiting_approval",
            format!("run {run_id:?} is {status}, not awaiting approval"),
        ),
        DecideOutcome::StaleDigest { current } => ApiError::conflict(
            "stale_digest",
            format!(
                "the digest for call {call:?} does not match what is pending now ({current}); reload the run"
            ),
        ),
        DecideOutcome::Conflict(existing) if existing.expired => ApiError::new(
            StatusCode::GONE,
            "expired",
            format!(
                "call {call:?} expired at {}: nobody decided before its deadline, so it did not run",
                crate::routes::rfc3339(existing.decided_at)
            ),
        ),
        DecideOutcome::Conflict(existing) => ApiError::conflict(
            "already_decided",
            format!(
                "call {call:?} was already decided: {} by {} at {}",
                serde_json::to_value(existing.action)
                    .unwrap_or_default()
                    .as_str()
                    .unwrap_or(""),
                existing.decided_by,
                crate::routes::rfc3339(existing.decided_at)
            ),
        )
        .with_details(json!({ "decision": existing })),
        DecideOutcome::Recorded { .. }
        | DecideOutcome::Vote { .. }
        | DecideOutcome::Duplicate(_)
        | DecideOutcome::DuplicateVote => {
            unreachable!("only refusals are passed here")
        }
    }
}
