//! `POST /v1/runs/{run_id}/decisions`: decisions from the API and from other systems, by
//! key or by Standard Webhooks signature (see [`Authenticated`]). A signed body must name the
//! run it decides, since the signature covers the body and not the path. All decisions of a
//! request are checked and recorded together, or none is (see [`crate::decide`]).
//!
//! `POST /v1/decisions`: a batch, decisions on calls of several runs. Each run's decisions
//! are checked and recorded by that run's own script step, as if sent to its own route; the
//! answer says, decision by decision, what became of it, so one stale digest refuses its run's
//! decisions and leaves the other runs' recorded.

use crate::auth::{Authenticated, Permission};
use crate::decide::{self, Decider, Proposed};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use countersign_store::{CallDecided, DecidedStatus};
use serde::Deserialize;
use serde_json::{Map, Value, json};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/runs/{run_id}/decisions", post(decide))
        .route("/v1/decisions", post(decide_batch))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionsBody {
    /// The run decided; required in a signed body, and must match the path when given.
    run_id: Option<String>,
    decisions: Vec<Proposed>,
    /// The person deciding, when the key belongs to a system deciding for them.
    decided_by: Option<String>,
}

#[tracing::instrument(skip_all, fields(run_id = %run_id))]
async fn decide(
    State(state): State<AppState>,
    Path(run_id): Path<String>,
    Authenticated {
        caller,
        signed,
        body,
    }: Authenticated<DecisionsBody>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Decide)?;
    match body.run_id.as_deref() {
        Some(named) if named != run_id => {
            return Err(ApiError::bad_request(format!(
                "the body decides run {named:?} but the path names {run_id:?}"
            )));
        }
        None if signed => {
            return Err(ApiError::bad_request(
                "a signed decision must name its run_id in the body, which the signature covers",
            ));
        }
        _ => {}
    }
    let (principal, role) = caller.deciding_as(body.decided_by.as_deref(), &state.config)?;
    let by = Decider::api(&principal, role);
    let calls = decide::decide(&state, &run_id, body.decisions, &by).await?;
    let resumes = calls.iter().any(|c| c.all_decided);
    let answers: Vec<Value> = calls.iter().map(answer).collect();
    Ok(Json(
        json!({"run_id": run_id, "decided_by": principal, "decisions": answers, "resumes": resumes}),
    ))
}

/// What became of one recorded decision.
fn answer(c: &CallDecided) -> Value {
    let status = match c.status {
        DecidedStatus::Recorded => "recorded",
        DecidedStatus::ApprovalRecorded => "approval_recorded",
        DecidedStatus::AlreadyRecorded | DecidedStatus::AlreadyVoted => "already_recorded",
    };
    let mut answer = json!({"call_id": c.call_id, "status": status, "resumes": c.all_decided});
    if let (Some(approvals), Some(quorum)) = (c.approvals, c.quorum) {
        answer["approvals"] = json!(approvals);
        answer["quorum"] = json!(quorum);
    }
    answer
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    /// Each a decision as `/v1/runs/{run_id}/decisions` takes it, with its `run_id`.
    decisions: Vec<Map<String, Value>>,
    decided_by: Option<String>,
}

#[tracing::instrument(skip_all)]
async fn decide_batch(
    State(state): State<AppState>,
    Authenticated { caller, body, .. }: Authenticated<BatchBody>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Decide)?;
    let mut decisions = Vec::with_capacity(body.decisions.len());
    for (i, mut decision) in body.decisions.into_iter().enumerate() {
        let run_id = match decision.remove("run_id") {
            Some(Value::String(run_id)) if !run_id.is_empty() => run_id,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "decisions[{i}] has no run_id"
                )));
            }
        };
        let proposed: Proposed = serde_json::from_value(Value::Object(decision))
            .map_err(|e| ApiError::bad_request(format!("decisions[{i}]: {e}")))?;
        decisions.push((run_id, proposed));
    }
    let (principal, role) = caller.deciding_as(body.decided_by.as_deref(), &state.config)?;
    let by = Decider::api(&principal, role);
    let mut results = Vec::new();
    for run in decide::decide_batch(&state, decisions, &by).await? {
        match run.outcome {
            Ok(recorded) => results.extend(recorded.iter().map(|c| {
                let mut answer = answer(c);
                answer["run_id"] = json!(run.run_id);
                answer
            })),
            Err(refused) => {
                let refused = ApiError::from(refused);
                let error = refused.body();
                results.extend(run.calls.into_iter().map(|call_id| {
                    json!({"run_id": run.run_id, "call_id": call_id, "status": "refused",
                           "http_status": refused.status.as_u16(), "error": error})
                }));
            }
        }
    }
    Ok(Json(json!({"decided_by": principal, "results": results})))
}
