//! `POST /v1/runs/{run_id}/decisions`: decisions from the API and from other systems, by
//! key or by Standard Webhooks signature (see [`Authenticated`]). A signed body must name the
//! run it decides, since the signature covers the body and not the path. All decisions of a
//! request are checked and recorded together, or none is (see [`crate::decide`]).

use crate::auth::{Authenticated, Permission};
use crate::decide::{self, Decider, Proposed};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use countersign_store::DecidedStatus;
use serde::Deserialize;
use serde_json::{Value, json};

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/v1/runs/{run_id}/decisions", post(decide))
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

/// The channel API decisions are recorded as coming from.
const CHANNEL: &str = "api";

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
    let by = Decider {
        principal: &principal,
        role,
        door: CHANNEL,
        link: None,
    };
    let calls = decide::decide(&state, &run_id, body.decisions, &by).await?;
    let resumes = calls.iter().any(|c| c.all_decided);
    let answers: Vec<Value> = calls
        .iter()
        .map(|c| {
            let status = match c.status {
                DecidedStatus::Recorded => "recorded",
                DecidedStatus::ApprovalRecorded => "approval_recorded",
                DecidedStatus::AlreadyRecorded | DecidedStatus::AlreadyVoted => "already_recorded",
            };
            let mut answer = json!({"call_id": c.call_id, "status": status});
            if let (Some(approvals), Some(quorum)) = (c.approvals, c.quorum) {
                answer["approvals"] = json!(approvals);
                answer["quorum"] = json!(quorum);
            }
            answer
        })
        .collect();
    Ok(Json(
        json!({"run_id": run_id, "decided_by": principal, "decisions": answers, "resumes": resumes}),
    ))
}
