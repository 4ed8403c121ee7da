//! The door of `external` agents: agents written in code, which countersign does not run, ask
//! here before each call whether they may make it. `POST /v1/agents/{agent}/calls` starts a
//! run of one call (`countersign_model::door`), as `POST /v1/runs` starts runs, and answers
//! with the call's state once it has an outcome or when `wait_secs` is up, whichever comes
//! first; `GET /v1/runs/{run}/calls/{call}` looks again, waiting the same way. A tool with an
//! endpoint is run by the worker once the call may run, and its result is in the answer; a
//! tool without one is released to the agent, which runs it itself with the receipt.
//!
//! A call released to the agent is claimed and reported by it at
//! `POST /v1/runs/{run}/calls/{call}/execution` ([`execution`]), so it never runs twice.
//!
//! Every ask carries an `Idempotency-Key` (per caller, as `POST /v1/runs` keeps them): the
//! same ask again is the same run, so it never asks a person twice nor runs twice.

mod execution;
mod outcome;

use crate::auth::{Caller, IdempotencyKey, JsonBody, Permission, QueryParams};
use crate::error::ApiError;
use crate::runs::wait::{self, Until, Waited};
use crate::runs::{self, Idempotency, NewRun};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use countersign_model::agent::{Agent, Provider};
use countersign_model::door::{DoorCall, Seen};
use countersign_model::run::{Run, RunId};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long an ask waits for its outcome when it does not say: long enough for a call its
/// policy lets through to be answered with its result in one round trip.
const DEFAULT_WAIT_SECS: u64 = 10;

pub(super) fn router(stop: &CancellationToken) -> Router<AppState> {
    let ask_stop = stop.clone();
    let look_stop = stop.clone();
    let report_stop = stop.clone();
    Router::new()
        .route(
            "/v1/agents/{agent}/calls",
            post(move |state, caller, key, path, body| {
                ask(state, caller, key, path, body, ask_stop)
            }),
        )
        .route(
            "/v1/runs/{run_id}/calls/{call_id}",
            get(move |state, caller, path, query| look(state, caller, path, query, look_stop)),
        )
        .route(
            "/v1/runs/{run_id}/calls/{call_id}/execution",
            post(move |state, caller, path, body| report(state, caller, path, body, report_stop)),
        )
}

/// An ask: the call the agent would make, and what the reviewer should see of it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Ask {
    tool: String,
    input: Value,
    /// What the agent was asked to do: the run's input, shown as the request.
    #[serde(default)]
    task: Option<String>,
    /// The agent's own words about the call.
    #[serde(default)]
    message: String,
    #[serde(default)]
    evidence: Vec<Seen>,
    /// The agent's conversation or session, which groups its calls.
    #[serde(default)]
    session: Option<String>,
    /// Whom the call is for: the caller, or someone its key speaks for.
    #[serde(default)]
    requested_by: Option<String>,
    #[serde(default)]
    wait_secs: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Look {
    #[serde(default)]
    wait_secs: Option<u64>,
}

async fn ask(
    State(state): State<AppState>,
    caller: Caller,
    IdempotencyKey(key): IdempotencyKey,
    Path(agent): Path<String>,
    JsonBody(ask): JsonBody<Ask>,
    stop: CancellationToken,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(Permission::Start)?;
    let Some(key) = key else {
        return Err(ApiError::bad_request(
            "an ask needs an Idempotency-Key: the same key again is the same call, which is \
             never asked twice nor run twice",
        ));
    };
    let requested_by = caller.speaking_as(ask.requested_by.as_deref(), "ask for calls")?;
    let wait = wait_for(&state, ask.wait_secs)?;
    let agent = external(&state, &agent)?;
    if agent.tool(&ask.tool).is_none() {
        return Err(ApiError::not_found(format!(
            "agent {:?} has no tool {:?}",
            agent.def.name, ask.tool
        )));
    }
    if let Err(problems) = agent.validate_input(&ask.tool, &ask.input) {
        return Err(ApiError::for_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "the input does not fit the input schema of {}: {}",
                ask.tool,
                problems.join("; ")
            ),
        ));
    }
    let task = ask
        .task
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| format!("The agent {} asked to call {}.", agent.def.name, ask.tool));
    let call = DoorCall {
        tool: ask.tool,
        input: ask.input,
        message: ask.message,
        evidence: ask.evidence,
        session: ask.session,
    };
    let metadata = json!({"door": call});
    let request = json!({
        "agent": agent.def.name,
        "task": task,
        "requested_by": requested_by,
        "metadata": metadata,
    });
    let new = NewRun {
        agent: &agent,
        input: task,
        requested_by,
        metadata,
        idempotency: Some(Idempotency::new(&caller.principal, &key, &request)),
    };
    let (run_id, _) = runs::start(&state, new).await?;
    answer(&state, &caller, &run_id, &call.call_id(), wait, stop).await
}

async fn look(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, call_id)): Path<(String, String)>,
    QueryParams(look): QueryParams<Look>,
    stop: CancellationToken,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(Permission::Read)?;
    let wait = wait_for(&state, look.wait_secs)?;
    let run = door_run(&state, &caller, &run_id, &call_id).await?;
    answer(&state, &caller, &run.run_id, &call_id, wait, stop).await
}

async fn report(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, call_id)): Path<(String, String)>,
    JsonBody(report): JsonBody<execution::Report>,
    stop: CancellationToken,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(Permission::Read)?;
    let run = door_run(&state, &caller, &run_id, &call_id).await?;
    execution::report(&state, &caller, &run, &call_id, report).await?;
    answer(&state, &caller, &run.run_id, &call_id, Duration::ZERO, stop).await
}

/// The run of an external agent's call `call_id`, for a caller who may read it.
async fn door_run(
    state: &AppState,
    caller: &Caller,
    run_id: &str,
    call_id: &str,
) -> Result<Run, ApiError> {
    let run = state
        .run(run_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run {run_id:?}")))?;
    caller.reading(run_id, run.requested_by.as_deref())?;
    let call = DoorCall::of_run(&run.metadata).ok().map(|c| c.call_id());
    if call.as_deref() != Some(call_id) {
        return Err(ApiError::not_found(format!(
            "run {run_id:?} is not an external agent's call {call_id:?}"
        )));
    }
    Ok(run)
}

/// The call's state once it has an outcome, or as it is when `wait` is up: `200` for an
/// outcome, `202` for a call that still waits.
async fn answer(
    state: &AppState,
    caller: &Caller,
    run_id: &RunId,
    call_id: &str,
    wait: Duration,
    stop: CancellationToken,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let stopped = stop.cancelled_owned();
    tokio::pin!(stopped);
    let waited = wait::outcome(state, run_id, (wait, Until::Outcome), stopped.as_mut()).await?;
    let run: Option<&Run> = waited.run();
    let decisions = state.store.decisions(run_id).await?;
    let execution = state.store.agent_execution(run_id, call_id).await?;
    let receipts = caller.holds_receipts(run.and_then(|r| r.requested_by.as_deref()));
    let catalog = state.catalog();
    let agent = run.and_then(|r| catalog.get(&r.agent));
    let view = outcome::of(
        run_id,
        call_id,
        run,
        agent.as_deref(),
        (&decisions, execution.as_ref()),
        receipts,
    );
    let status = match waited {
        Waited::Done(_) => StatusCode::OK,
        Waited::Pending(_) | Waited::Abandoned(_) => StatusCode::ACCEPTED,
    };
    Ok((status, Json(view)))
}

/// How long a request may wait: what it asks, at most `[door] max_wait_secs`.
fn wait_for(state: &AppState, asked: Option<u64>) -> Result<Duration, ApiError> {
    let most = state.config.door.max_wait_secs;
    let secs = asked.unwrap_or(DEFAULT_WAIT_SECS.min(most));
    if secs > most {
        return Err(ApiError::bad_request(format!(
            "wait_secs may be at most {most} ([door] max_wait_secs)"
        )));
    }
    Ok(Duration::from_secs(secs))
}

/// The external agent of this name, or why there is none.
fn external(state: &AppState, name: &str) -> Result<std::sync::Arc<Agent>, ApiError> {
    let agent = state
        .catalog()
        .get(name)
        .ok_or_else(|| ApiError::not_found(format!("no agent named {name:?}")))?;
    if agent.def.model.provider != Provider::External {
        return Err(ApiError::bad_request(format!(
            "agent {name:?} is not an external agent (its [model] provider is {:?}): start its \
             runs with POST /v1/runs",
            agent.def.model.provider.as_str()
        )));
    }
    Ok(agent)
}
