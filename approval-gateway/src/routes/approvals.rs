//! The inbox: pending calls across runs.

use super::view::rfc3339;
use crate::error::ApiError;
use crate::extract::{Caller, Permission, QueryParams};
use crate::state::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use countersign_shared::run::RunStatus;
use serde::Deserialize;
use serde_json::{Value, json};

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/approvals", get(list))
}

#[derive(Deserialize)]
struct ListQuery {
    status: Option<String>,
    limit: Option<usize>,
}

const MAX_LIMIT: usize = 500;

async fn list(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Read)?;
    if let Some(status) = query.status.as_deref().filter(|s| *s != "pending") {
        return Err(ApiError::bad_request(format!(
            "status {status:?} is not supported; use status=pending"
        )));
    }
    let limit = query.limit.unwrap_or(100).clamp(1, MAX_LIMIT);
    let mut approvals = Vec::new();
    for id in state.store.awaiting(MAX_LIMIT).await? {
        let Some(run) = state.store.load(&id).await? else {
            continue;
        };
        if run.status != RunStatus::AwaitingApproval {
            continue;
        }
        let decisions = state.store.decisions(&id).await?;
        let text = run.held_turn_text();
        for call in run
            .pending()
            .filter(|c| !decisions.contains_key(&c.call_id))
        {
            approvals.push(json!({
                "run_id": run.run_id,
                "agent": run.agent,
                "requested_by": run.requested_by,
                "text": text,
                "paused_at": rfc3339(run.updated_at),
                "call_id": call.call_id,
                "tool": call.tool,
                "input": call.input,
                "digest": call.digest,
                "summary": call.summary,
                "reason": call.reason,
            }));
        }
        if approvals.len() >= limit {
            approvals.truncate(limit);
            break;
        }
    }
    Ok(Json(json!({ "approvals": approvals })))
}
