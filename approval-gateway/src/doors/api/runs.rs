//! Starting, cancelling and reading runs: the HTTP side (who may, what the request says);
//! what is stored and announced is `crate::runs`.

use crate::auth::{Caller, IdempotencyKey, JsonBody, Permission};
use crate::decide;
use crate::error::ApiError;
use crate::runs::{self, Idempotency, NewRun};
use crate::state::AppState;
use crate::view::{Receipts, RunView};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use countersign_model::agent::Provider;
use countersign_model::run::Run;
use countersign_runtime::trace_context;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::Instrument;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/runs", post(start_run))
        .route("/v1/runs/{run_id}", get(get_run))
        .route("/v1/runs/{run_id}/cancel", post(cancel_run))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartRun {
    agent: String,
    /// The user's request, the first message of the conversation.
    input: String,
    /// Whom the run is for; only the caller itself or someone its key speaks for, since the
    /// requester may not approve their own request.
    requested_by: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
}

/// The run's trace starts here, as a child of the caller's span if its request carries a
/// `traceparent`.
async fn start_run(
    state: State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    key: IdempotencyKey,
    body: JsonBody<StartRun>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let span =
        tracing::info_span!("run.start", agent = %body.0.agent, run_id = tracing::field::Empty);
    let traceparent = headers
        .get(trace_context::HEADER)
        .and_then(|v| v.to_str().ok());
    trace_context::adopt(&span, traceparent);
    start(state, caller, key, body).instrument(span).await
}

async fn start(
    State(state): State<AppState>,
    caller: Caller,
    IdempotencyKey(key): IdempotencyKey,
    JsonBody(body): JsonBody<StartRun>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(Permission::Start)?;
    let requested_by = caller.speaking_as(body.requested_by.as_deref(), "request runs")?;
    let metadata = body.metadata.unwrap_or_else(|| json!({}));
    if !metadata.is_object() {
        return Err(ApiError::bad_request("metadata must be a JSON object"));
    }
    if body.input.trim().is_empty() {
        return Err(ApiError::bad_request("input must not be empty"));
    }
    let Some(agent) = state.catalog().get(&body.agent) else {
        return Err(ApiError::not_found(format!(
            "no agent named {:?}",
            body.agent
        )));
    };
    if agent.def.model.provider == Provider::McpClient {
        return Err(ApiError::bad_request(format!(
            "the runs of agent {:?} come from its MCP clients, one per tools/call at /mcp/{}",
            body.agent, body.agent
        )));
    }
    // The request as it will be stored: the same JSON written otherwise (key order, spacing)
    // is the same request.
    let request = json!({
        "agent": agent.def.name,
        "input": body.input,
        "requested_by": requested_by,
        "metadata": metadata,
    });
    let idempotency = key.map(|key| Idempotency::new(&caller.principal, &key, &request));
    let new = NewRun {
        agent: &agent,
        input: body.input,
        requested_by,
        metadata,
        idempotency,
    };
    let (run_id, status) = runs::start(&state, new).await?;
    tracing::Span::current().record("run_id", run_id.as_str());
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"run_id": run_id, "status": status.as_str()})),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelRun {
    /// Why, for the audit trail and the people watching.
    reason: Option<String>,
}

/// Asks a run to stop. A worker finishes it as `cancelled` at its next step (a paused or
/// queued run at once): its undecided calls are closed, their channels told, and
/// `run.cancelled` published. Only the run's requester (or a key speaking for them) or an
/// admin may.
#[tracing::instrument(skip_all, fields(run_id = %run_id))]
async fn cancel_run(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(Permission::Start)?;
    let reason = if body.is_empty() {
        None
    } else {
        let JsonBody(CancelRun { reason }) = JsonBody::parse(&body)?;
        reason
    };
    if reason.as_ref().is_some_and(|r| r.len() > decide::MAX_TEXT) {
        return Err(ApiError::bad_request(format!(
            "the reason is longer than {} bytes",
            decide::MAX_TEXT
        )));
    }
    let run = load_run(&state, &run_id).await?;
    let by = caller.cancelling(&run_id, run.requested_by.as_deref())?;
    runs::cancel(&state, &run, (by, "api"), reason).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"run_id": run.run_id, "status": "cancelling"})),
    ))
}

async fn get_run(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    caller.require(Permission::Read)?;
    let (run, decisions) = state
        .run_with_decisions(&run_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run {run_id:?}")))?;
    caller.reading(&run_id, run.requested_by.as_deref())?;
    let receipts = Receipts::for_role(caller.role);
    Ok(Json(RunView::new(
        run,
        decisions,
        &state.catalog(),
        receipts,
    )))
}

/// The run named in a path, or a 404 that says so.
pub(super) async fn load_run(state: &AppState, run_id: &str) -> Result<Run, ApiError> {
    let run = state.run(run_id).await?;
    run.ok_or_else(|| ApiError::not_found(format!("no run {run_id:?}")))
}
