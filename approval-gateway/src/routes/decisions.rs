//! Recording reviewers' decisions. Every decision in a request is checked before any is
//! recorded; each is then recorded atomically in Redis (first decision per call wins) and
//! announced on `approval.decided.<run_id>`, which any worker picks up to resume the run
//! once the turn's last pending call is decided.

use super::runs::load_run;
use crate::error::ApiError;
use crate::extract::{Caller, JsonBody, Permission};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use countersign_shared::events::Event;
use countersign_shared::now_ms;
use countersign_shared::run::{Action, Decision, Run};
use countersign_shared::store::DecideOutcome;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashSet;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/runs/{run_id}/decisions", post(decide))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionsBody {
    decisions: Vec<DecisionIn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionIn {
    call_id: String,
    digest: Option<String>,
    action: Action,
    input: Option<Value>,
    note: Option<String>,
    reason: Option<String>,
}

/// The channel API decisions are recorded as coming from.
const CHANNEL: &str = "api";

#[tracing::instrument(skip_all, fields(run_id = %run_id))]
async fn decide(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    JsonBody(body): JsonBody<DecisionsBody>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Decide)?;
    if body.decisions.is_empty() {
        return Err(ApiError::bad_request(
            "decisions must hold at least one decision",
        ));
    }
    let mut seen = HashSet::new();
    for d in &body.decisions {
        if !seen.insert(d.call_id.as_str()) {
            return Err(ApiError::bad_request(format!(
                "call {:?} is decided twice",
                d.call_id
            )));
        }
    }
    let run = load_run(&state, &run_id).await?;
    let id = run.run_id.clone();
    let decisions = body
        .decisions
        .into_iter()
        .map(|d| check(&state, &run, d, &caller.principal))
        .collect::<Result<Vec<_>, _>>()?;

    let mut recorded = Vec::new();
    let mut resumes = false;
    for decision in decisions {
        let outcome = state.store.decide(&id, &decision).await?;
        let answer = match outcome {
            DecideOutcome::Recorded { all_decided } => {
                resumes |= all_decided;
                "recorded"
            }
            // Announced again in case the first attempt stopped before publishing.
            DecideOutcome::Duplicate(_) => "already_recorded",
            other => return Err(refusal(&run_id, &decision.call_id, other, &recorded)),
        };
        let event = Event::ApprovalDecided {
            run_id: id.clone(),
            call_id: decision.call_id.clone(),
            action: decision.action,
            decided_by: decision.decided_by.clone(),
            all_decided: resumes,
        };
        let names = &state.bus.names;
        let msg_id = format!("decided:{id}:{}", decision.call_id);
        state
            .bus
            .publish(names.approval_decided(&id), &msg_id, event)
            .await?;
        recorded.push(json!({"call_id": decision.call_id, "status": answer}));
    }
    Ok(Json(
        json!({"run_id": id, "decisions": recorded, "resumes": resumes}),
    ))
}

/// Checks one decision's shape, and an edit's input against the tool's schema.
fn check(state: &AppState, run: &Run, d: DecisionIn, by: &str) -> Result<Decision, ApiError> {
    let call = &d.call_id;
    let digest = d
        .digest
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!(
            "the decision for call {call:?} has no digest: quote the digest of the call you were shown"
        )))?;
    let blank = |s: &Option<String>| s.as_deref().is_none_or(|s| s.trim().is_empty());
    match d.action {
        Action::Reject if blank(&d.reason) => {
            return Err(ApiError::bad_request(format!(
                "rejecting call {call:?} needs a reason"
            )));
        }
        Action::Edit if d.input.is_none() => {
            return Err(ApiError::bad_request(format!(
                "editing call {call:?} needs an input"
            )));
        }
        Action::Approve | Action::Reject if d.input.is_some() => {
            return Err(ApiError::bad_request(format!(
                "only an edit carries an input (call {call:?})"
            )));
        }
        _ => {}
    }
    if let (Some(input), Some(pending)) = (&d.input, run.pending().find(|p| &p.call_id == call))
        && let Some(agent) = state.catalog.get(&run.agent)
        && let Err(errors) = agent.validate_input(&pending.tool, input)
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            format!(
                "the edited input for call {call:?} does not match the schema of {}",
                pending.tool
            ),
        )
        .with_details(json!({ "errors": errors })));
    }
    let fingerprint = Decision::fingerprint_of(
        d.action,
        d.input.as_ref(),
        d.note.as_deref(),
        d.reason.as_deref(),
    );
    Ok(Decision {
        call_id: d.call_id,
        digest,
        action: d.action,
        input: d.input,
        note: d.note,
        reason: d.reason,
        decided_by: by.to_string(),
        channel: CHANNEL.into(),
        decided_at: now_ms(),
        fingerprint,
    })
}

fn refusal(run_id: &str, call: &str, outcome: DecideOutcome, recorded: &[Value]) -> ApiError {
    let error = match outcome {
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
        DecideOutcome::Conflict(existing) => ApiError::conflict(
            "already_decided",
            format!(
                "call {call:?} was already decided: {:?} by {} at {}",
                existing.action,
                existing.decided_by,
                super::view::rfc3339(existing.decided_at)
            )
            .to_lowercase(),
        )
        .with_details(json!({ "decision": existing })),
        DecideOutcome::Recorded { .. } | DecideOutcome::Duplicate(_) => {
            unreachable!("only refusals are passed here")
        }
    };
    if recorded.is_empty() {
        error
    } else {
        let message = format!(
            "{} (decisions before it in this request were recorded)",
            error.message
        );
        ApiError { message, ..error }.with_details(json!({ "recorded": recorded }))
    }
}
