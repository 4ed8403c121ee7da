//! `POST /v1/runs/{run_id}/decisions`: decisions from the API and from other systems, by
//! key or by Standard Webhooks signature (see [`Authenticated`]). Every
//! decision of a request is checked before any is recorded (see [`crate::decide`]).

use super::runs::load_run;
use crate::decide::{self, Proposed, Recorded};
use crate::error::ApiError;
use crate::extract::{Authenticated, Permission};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashSet;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/runs/{run_id}/decisions", post(decide))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionsBody {
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
    Authenticated { caller, body }: Authenticated<DecisionsBody>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Decide)?;
    let principal = caller.deciding_as(body.decided_by.as_deref())?;
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
    let mut checked = Vec::with_capacity(body.decisions.len());
    for proposed in body.decisions {
        checked.push(decide::check(&state, &run, proposed, &principal, CHANNEL).await?);
    }

    let mut answers = Vec::new();
    let mut resumes = false;
    for checked in checked {
        let call_id = checked.decision.call_id.clone();
        let recorded = match decide::record(&state, &run, checked).await {
            Ok(recorded) => recorded,
            Err(error) if answers.is_empty() => return Err(error),
            Err(error) => {
                let message = format!(
                    "{} (decisions before it in this request were recorded)",
                    error.message
                );
                return Err(
                    ApiError { message, ..error }.with_details(json!({ "recorded": answers }))
                );
            }
        };
        resumes |= matches!(recorded, Recorded::Recorded { all_decided: true });
        let mut answer = json!({"call_id": call_id, "status": recorded.label()});
        if let Recorded::Vote { approvals, quorum } = recorded {
            answer["approvals"] = json!(approvals);
            answer["quorum"] = json!(quorum);
        }
        answers.push(answer);
    }
    Ok(Json(
        json!({"run_id": run.run_id, "decided_by": principal, "decisions": answers, "resumes": resumes}),
    ))
}
