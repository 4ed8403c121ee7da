//! The inbox: held calls across runs, oldest first, a page at a time.
//!
//! A page holds whole runs: it ends before a run whose calls would not fit in `limit` (a run
//! with more calls than that gets a page of its own). `next_cursor` names the last run the
//! page read, and the next page resumes strictly after it; it is `null` once the index is
//! exhausted. Runs that moved on since they were indexed are skipped, and so are the runs the
//! caller may not read (`authority::may_read`: a requester's key lists the held calls of the
//! runs it asked for or speaks for, as it reads those runs and no others).

use crate::auth::{Caller, Permission, QueryParams};
use crate::error::ApiError;
use crate::runs;
use crate::state::AppState;
use crate::time::rfc3339;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use countersign_model::run::RunId;
use countersign_store::Awaiting;
use serde::Deserialize;
use serde_json::{Value, json};

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/v1/approvals", get(list))
}

#[derive(Deserialize)]
struct ListQuery {
    status: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

const MAX_LIMIT: usize = 500;
const DEFAULT_LIMIT: usize = 100;

/// The cursor is `{since_ms}-{run_id}` of the last run read. Clients treat it as opaque.
fn encode_cursor(at: &Awaiting) -> String {
    format!("{}-{}", at.since_ms, at.run_id)
}

fn decode_cursor(cursor: &str) -> Result<Awaiting, ApiError> {
    cursor
        .split_once('-')
        .and_then(|(since, run)| {
            Some(Awaiting {
                since_ms: since.parse().ok()?,
                run_id: RunId::parse(run)?,
            })
        })
        .ok_or_else(|| {
            ApiError::invalid_cursor("cursor is not one this API gave out; start again without it")
        })
}

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
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )));
    }
    let mut after = query.cursor.as_deref().map(decode_cursor).transpose()?;
    let mut approvals = Vec::new();
    let next = 'page: loop {
        // Every awaiting run has at least one call left, so this many runs can fill the page.
        let want = limit - approvals.len();
        let batch = state.store.awaiting(after.as_ref(), want).await?;
        let exhausted = batch.len() < want;
        for at in batch {
            let calls = undecided_calls(&state, &caller, &at.run_id).await?;
            if !approvals.is_empty() && approvals.len() + calls.len() > limit {
                break 'page after;
            }
            approvals.extend(calls);
            after = Some(at);
            if approvals.len() >= limit {
                break 'page after;
            }
        }
        if exhausted {
            break None;
        }
    };
    Ok(Json(json!({
        "approvals": approvals,
        "next_cursor": next.as_ref().map(encode_cursor),
    })))
}

/// The calls of a paused run that wait for a decision; none if it has moved on, or if
/// `caller` may not read it.
async fn undecided_calls(
    state: &AppState,
    caller: &Caller,
    id: &RunId,
) -> Result<Vec<Value>, ApiError> {
    let Some((run, calls)) = runs::awaiting_decision(state, id).await? else {
        return Ok(Vec::new());
    };
    if caller
        .reading(id.as_str(), run.requested_by.as_deref())
        .is_err()
    {
        return Ok(Vec::new());
    }
    let text = run.paused_turn_text();
    Ok(calls
        .into_iter()
        .map(|call| {
            json!({
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
                "deadline": call.deadline,
            })
        })
        .collect())
}
