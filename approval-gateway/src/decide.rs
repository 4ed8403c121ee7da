//! Deciding held calls, whatever channel the decisions came through. The gateway checks
//! only what needs its configuration or is plain bad input: the shape and size of each
//! decision, and an edit's input against the tool's schema. Everything about the run (is the
//! call held in its current turn, the digest, who may decide, the requester, the quorum, the
//! deadline, an email link still unused) is checked by the decision script in the same
//! atomic step that records the decisions, appends their audit entries and queues their
//! announcements (`lua/decide.lua`); nothing read here before it runs is trusted. What the
//! script queued is published at once, and by the outbox sweepers if NATS is away.

use crate::error::ApiError;
use crate::state::AppState;
use axum::http::StatusCode;
use countersign_shared::audit::{AuditEntry, AuditKind};
use countersign_shared::run::{Action, Decision, Run};
use countersign_shared::store::{
    CallDecided, DecideRequest, Outcome, Proposal, Refusal, RefusalCode,
};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashSet;

/// The longest call id a decision may name.
pub const MAX_CALL_ID: usize = 128;
/// The longest note or reason, in bytes.
pub const MAX_TEXT: usize = 4096;

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

/// Who decides, through which channel, with which email link if any.
pub struct Decider<'a> {
    pub principal: &'a str,
    pub channel: &'a str,
    /// (token hash, grant) of the email link used: spent with the decision.
    pub link: Option<(&'a str, &'a str)>,
}

/// Checks and records the decisions of one request on `run_id`: all stand, or none does.
pub async fn decide(
    state: &AppState,
    run_id: &str,
    proposed: Vec<Proposed>,
    by: &Decider<'_>,
) -> Result<Vec<CallDecided>, ApiError> {
    if proposed.is_empty() {
        return Err(ApiError::bad_request(
            "decisions must hold at least one decision",
        ));
    }
    let mut seen = HashSet::new();
    for p in &proposed {
        check_shape(p)?;
        if !seen.insert(p.call_id.as_str()) {
            return Err(ApiError::bad_request(format!(
                "call {:?} is decided twice",
                p.call_id
            )));
        }
    }
    let run = crate::routes::load_run(state, run_id).await?;
    let proposals = proposed
        .into_iter()
        .map(|p| proposal(state, &run, p, by))
        .collect::<Result<Vec<_>, _>>()?;
    let request = DecideRequest {
        principal: by.principal,
        channel: by.channel,
        expiry: false,
        link: by.link,
        proposals,
    };
    match state.store.decide(&run.run_id, &request).await? {
        Outcome::Decided { calls, queued } => {
            // The decision stands once Redis holds it: the reviewer is answered now, whatever
            // NATS is doing, and what is not published here the outbox sweepers publish.
            let (outbox, run_id) = (state.outbox.clone(), run.run_id.clone());
            tokio::spawn(async move {
                if let Err(e) = outbox.publish(&run_id, &queued).await {
                    tracing::warn!(%run_id, error = %e, "decision recorded; its announcement waits in the outbox");
                }
            });
            Ok(calls)
        }
        Outcome::Refused(refusal) => Err(refused(&run, by.principal, refusal)),
        Outcome::NoRun => Err(ApiError::not_found(format!("no run {run_id:?}"))),
        Outcome::Settled(_) | Outcome::NotDue => Err(ApiError::unavailable(
            "the decision script answered as for an expiry",
        )),
    }
}

/// Checks and records one decision, as the channels other than the API make them.
pub async fn decide_one(
    state: &AppState,
    run_id: &str,
    proposed: Proposed,
    by: &Decider<'_>,
) -> Result<CallDecided, ApiError> {
    let mut calls = decide(state, run_id, vec![proposed], by).await?;
    calls
        .pop()
        .ok_or_else(|| ApiError::unavailable("the decision script answered nothing"))
}

/// Bad input, refused before anything is stored: sizes, formats, and what each action needs.
fn check_shape(p: &Proposed) -> Result<(), ApiError> {
    let call = p.call_id.as_str();
    if call.is_empty() || call.len() > MAX_CALL_ID {
        return Err(ApiError::bad_request(format!(
            "call_id must be 1 to {MAX_CALL_ID} characters"
        )));
    }
    let digest = p.digest.as_deref().unwrap_or_default();
    if digest.is_empty() {
        return Err(ApiError::bad_request(format!(
            "the decision for call {call:?} has no digest: quote the digest of the call you were shown"
        )));
    }
    let well_formed = digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if !well_formed {
        return Err(ApiError::bad_request(format!(
            "the digest for call {call:?} must be \"sha256:\" and 64 lowercase hex digits, as shown with the call"
        )));
    }
    for (name, text) in [("note", &p.note), ("reason", &p.reason)] {
        if text.as_ref().is_some_and(|t| t.len() > MAX_TEXT) {
            return Err(ApiError::bad_request(format!(
                "the {name} for call {call:?} is longer than {MAX_TEXT} bytes"
            )));
        }
    }
    let blank = |s: &Option<String>| s.as_deref().is_none_or(|s| s.trim().is_empty());
    match p.action {
        Action::Reject if blank(&p.reason) => Err(ApiError::bad_request(format!(
            "rejecting call {call:?} needs a reason"
        ))),
        Action::Edit if p.input.is_none() => Err(ApiError::bad_request(format!(
            "editing call {call:?} needs an input"
        ))),
        Action::Approve | Action::Reject if p.input.is_some() => Err(ApiError::bad_request(
            format!("only an edit carries an input (call {call:?})"),
        )),
        _ => Ok(()),
    }
}

/// The decision to record, with its audit entry; an edit is checked against the schema of
/// the tool of the call as this copy of the run holds it, and the script makes sure that is
/// the call it decides.
fn proposal(
    state: &AppState,
    run: &Run,
    p: Proposed,
    by: &Decider<'_>,
) -> Result<Proposal, ApiError> {
    let pending = run.pending().find(|c| c.call_id == p.call_id);
    let mut checked_digest = None;
    if let (Action::Edit, Some(input), Some(pending)) = (p.action, &p.input, pending) {
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
        checked_digest = Some(pending.digest.clone());
    }
    let digest = p.digest.unwrap_or_default();
    let mut entry = AuditEntry::new(&run.run_id, AuditKind::Decided);
    entry.call_id = Some(p.call_id.clone());
    entry.actor = Some(by.principal.to_string());
    entry.channel = Some(by.channel.to_string());
    entry.digest = Some(digest.clone());
    entry.detail = json!({
        "action": p.action, "input": p.input, "note": p.note, "reason": p.reason,
    });
    let fingerprint = Decision::fingerprint_of(
        p.action,
        p.input.as_ref(),
        p.note.as_deref(),
        p.reason.as_deref(),
    );
    Ok(Proposal {
        decision: Decision {
            call_id: p.call_id,
            digest,
            action: p.action,
            input: p.input,
            note: p.note,
            reason: p.reason,
            decided_by: by.principal.to_string(),
            channel: by.channel.to_string(),
            decided_at: entry.at,
            fingerprint,
            expired: false,
        },
        checked_digest,
        entry,
    })
}

/// The API error for a refusal of the decision script.
fn refused(run: &Run, principal: &str, refusal: Refusal) -> ApiError {
    let run_id = run.run_id.as_str();
    let call = refusal.call_id.as_str();
    let detail = refusal.detail;
    match refusal.code {
        RefusalCode::Decided => match serde_json::from_str::<Decision>(&detail) {
            Ok(existing) if existing.expired => ApiError::new(
                StatusCode::GONE,
                "expired",
                format!(
                    "call {call:?} expired at {}: nobody decided before its deadline, so it did not run",
                    crate::routes::rfc3339(existing.decided_at)
                ),
            ),
            Ok(existing) => ApiError::conflict(
                "already_decided",
                format!(
                    "call {call:?} was already decided: {} by {} at {}",
                    action_name(existing.action),
                    existing.decided_by,
                    crate::routes::rfc3339(existing.decided_at)
                ),
            )
            .with_details(json!({ "decision": existing })),
            Err(_) => ApiError::conflict(
                "already_decided",
                format!("call {call:?} was already decided"),
            ),
        },
        RefusalCode::NotWaiting => ApiError::conflict(
            "not_awaiting_approval",
            format!("run {run_id:?} is {detail}, not awaiting approval"),
        ),
        RefusalCode::NoCall => ApiError::not_found(format!(
            "run {run_id:?} has no call {call:?} waiting for a decision"
        )),
        RefusalCode::StaleDigest => ApiError::conflict(
            "stale_digest",
            format!(
                "the digest for call {call:?} does not match what is pending now ({detail}); reload the run"
            ),
        ),
        RefusalCode::PastDeadline => ApiError::new(
            StatusCode::GONE,
            "expired",
            format!(
                "the deadline of call {call:?} passed at {}; it can no longer be decided",
                detail.parse().map(crate::routes::rfc3339).unwrap_or(detail)
            ),
        ),
        RefusalCode::NotApprover => {
            let deciders: Vec<String> = serde_json::from_str(&detail).unwrap_or_default();
            ApiError::new(
                StatusCode::FORBIDDEN,
                "not_an_approver",
                format!(
                    "{principal} is not among the approvers of call {call:?} ({})",
                    deciders.join(", ")
                ),
            )
        }
        RefusalCode::OwnRequest => ApiError::new(
            StatusCode::FORBIDDEN,
            "not_an_approver",
            format!("{principal} requested this run and may not approve their own request"),
        ),
        RefusalCode::EditWithQuorum => ApiError::bad_request(format!(
            "call {call:?} needs {detail} approvals, and an edit cannot be approved by several people at once: approve it as it is, or reject it with a reason"
        )),
        RefusalCode::EditUnchecked => ApiError::conflict(
            "not_checked",
            format!(
                "call {call:?} was not waiting when the edit was checked against its tool's schema; send it again"
            ),
        ),
        RefusalCode::LinkUsed => ApiError::new(
            StatusCode::GONE,
            "link_used",
            "this link was already used or has expired",
        ),
    }
}

pub fn action_name(action: Action) -> &'static str {
    match action {
        Action::Approve => "approve",
        Action::Edit => "edit",
        Action::Reject => "reject",
    }
}
