//! The tasks of protocol 2025-11-25 (experimental there), which the official Python SDK's 1.x
//! client speaks (`session.experimental.call_tool_as_task`, `get_task`, `get_task_result`,
//! `cancel_task`). rmcp serves only the Tasks extension of 2026-07-28 (`super::tasks`), so
//! the requests of a 2025-11-25 session that differ are answered here, in front of rmcp,
//! from the same tasks (a task is its call's run, on every gateway):
//!
//! - `initialize` of that version is answered with the `tasks` capability (cancel, and tasks
//!   on `tools/call`; no `tasks/list`, which the 2026-07-28 extension dropped because a list
//!   can tell one caller about another's tasks), and `tools/list` names every tool's task
//!   support `optional`;
//! - a `tools/call` with `params.task` starts the call's run and is answered with the task at
//!   once; `tasks/get` with the task as it stands (`ttlMs` and `pollIntervalMs` as `ttl` and
//!   `pollInterval`, without the result); `tasks/result` once the call has its answer (the
//!   same a `tools/call` gets, with the task named in `_meta`), waiting for it as the
//!   version says; `tasks/cancel` through the run's cancel path, with the task once
//!   cancelled.
//!
//! Every other request, and every request of another version, goes on to rmcp untouched.

use super::{Proxy, misfit, owners, proxied, tasks};
use crate::auth::Caller;
use crate::runs::wait::{self, Until};
use axum::body::{Body, Bytes, to_bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use countersign_model::mcp_proxy::ProxyCall;
use countersign_model::run::{Run, RunId};
use rmcp::model::{ErrorData, Task};
use serde_json::{Value, json};
use std::time::Duration;

/// The protocol version whose tasks these are.
const VERSION: &str = "2025-11-25";
/// Where a 2025-11-25 client names its protocol version once initialized.
const VERSION_HEADER: &str = "mcp-protocol-version";
/// The `_meta` key naming the task a message belongs to.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
/// How long `tasks/result` waits for the answer before telling the client to ask again: the
/// version has it block until then, and a person may take a day.
const RESULT_WAIT: Duration = Duration::from_secs(24 * 3600);
/// How long `tasks/cancel` waits for the run to end, to answer with the cancelled task.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// Answers the 2025-11-25 task requests of `proxy`'s endpoint, passes on the rest.
pub(super) async fn intercept(
    State(proxy): State<Proxy>,
    request: Request,
    next: Next,
) -> Response {
    // Only a POST of 2025-11-25, or one naming no version yet (an `initialize`), can be one
    // of these: any other goes on to rmcp unread.
    let other_version = request
        .headers()
        .get(VERSION_HEADER)
        .is_some_and(|v| v.as_bytes() != VERSION.as_bytes());
    if request.method() != axum::http::Method::POST || other_version {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = to_bytes(body, proxy.state.config.max_body_bytes).await else {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is larger than the gateway takes",
        )
            .into_response();
    };
    let message: Option<Value> = serde_json::from_slice(&bytes).ok();
    let method = message
        .as_ref()
        .and_then(|m| m["method"].as_str())
        .unwrap_or_default()
        .to_string();
    let versioned = parts
        .headers
        .get(VERSION_HEADER)
        .is_some_and(|v| v.as_bytes() == VERSION.as_bytes());
    let caller = parts.extensions.get::<Caller>().cloned();
    let session = parts
        .headers
        .get(owners::SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let pass = |bytes: Bytes| next.run(Request::from_parts(parts, Body::from(bytes)));
    let (Some(message), Some(caller)) = (message, caller) else {
        return pass(bytes).await;
    };
    let params = &message["params"];
    let answer = match method.as_str() {
        "initialize" => return rewritten(pass(bytes).await, advertise).await,
        "tools/list" if versioned => return rewritten(pass(bytes).await, optional).await,
        "tools/call" if versioned && params.get("task").is_some() => {
            start(&proxy, &caller, session.as_deref(), params).await
        }
        "tasks/get" if versioned => get(&proxy, &caller, params).await,
        "tasks/result" if versioned => result(&proxy, &caller, params).await,
        "tasks/cancel" if versioned => cancel(&proxy, &caller, params).await,
        _ => return pass(bytes).await,
    };
    let id = &message["id"];
    let body = match answer {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
    };
    axum::Json(body).into_response()
}

/// A `tools/call` with `params.task`: its run started (or found), its task at once.
async fn start(
    proxy: &Proxy,
    caller: &Caller,
    session: Option<&str>,
    params: &Value,
) -> Result<Value, ErrorData> {
    let call = ProxyCall {
        tool: params["name"].as_str().unwrap_or_default().to_string(),
        arguments: params
            .get("arguments")
            .cloned()
            .unwrap_or_else(|| json!({})),
    };
    if !call.arguments.is_object() {
        return Err(ErrorData::invalid_params(
            "arguments must be an object",
            None,
        ));
    }
    let agent = proxy.agent()?;
    if let Some(why) = misfit(&agent, &call)? {
        return Err(ErrorData::invalid_params(why, None));
    }
    let id = proxy.start(&agent, caller, session, None, &call).await?;
    let run = proxy.state.run(id.as_str()).await.ok().flatten();
    let created = tasks::created(&id, run.as_ref());
    Ok(json!({"task": task(&created.task)}))
}

async fn get(proxy: &Proxy, caller: &Caller, params: &Value) -> Result<Value, ErrorData> {
    let run = proxy.task_run(caller, task_id(params)?).await?;
    Ok(task(&proxy.task(&run, None).await?.task))
}

/// The call's answer once it has one, with the task named in its `_meta`.
async fn result(proxy: &Proxy, caller: &Caller, params: &Value) -> Result<Value, ErrorData> {
    let run = proxy.task_run(caller, task_id(params)?).await?;
    let run = ended(proxy, run, RESULT_WAIT).await?;
    if !tasks::answered(&run) {
        let state = proxy.task(&run, None).await?.task;
        let why = state.status_message.unwrap_or_default();
        return Err(ErrorData::invalid_params(
            format!("task {:?} has no result: {why}", run.run_id.as_str()),
            None,
        ));
    }
    let answered = proxy.answer(&run, &proxied(&run)?.tool).await;
    let mut answered = serde_json::to_value(answered).map_err(super::internal)?;
    answered["_meta"][RELATED_TASK] = json!({"taskId": run.run_id});
    Ok(answered)
}

/// Cancels the task, then answers it as it stands once its run ended (or soon after).
async fn cancel(proxy: &Proxy, caller: &Caller, params: &Value) -> Result<Value, ErrorData> {
    let id = task_id(params)?;
    proxy.cancel(caller, id).await?;
    let run = proxy.task_run(caller, id).await?;
    let run = ended(proxy, run, CANCEL_WAIT).await?;
    Ok(task(&proxy.task(&run, None).await?.task))
}

/// `run` once its call has an outcome or its run ended, or as it is after `at_most`.
async fn ended(proxy: &Proxy, run: Run, at_most: Duration) -> Result<Run, ErrorData> {
    if wait::answered(&run) {
        return Ok(run);
    }
    let stop = proxy.stop.clone().cancelled_owned();
    tokio::pin!(stop);
    let id: &RunId = &run.run_id;
    let waited = wait::outcome(&proxy.state, id, (at_most, Until::Outcome), stop.as_mut())
        .await
        .map_err(super::internal)?;
    Ok(waited.run().cloned().unwrap_or(run))
}

fn task_id(params: &Value) -> Result<&str, ErrorData> {
    params["taskId"]
        .as_str()
        .ok_or_else(|| ErrorData::invalid_params("taskId must be a string", None))
}

/// A task as 2025-11-25 writes it.
fn task(task: &Task) -> Value {
    let mut shown = json!({
        "taskId": task.task_id,
        "status": task.status,
        "createdAt": task.created_at,
        "lastUpdatedAt": task.last_updated_at,
        "ttl": task.ttl_ms,
        "pollInterval": task.poll_interval_ms,
    });
    if let Some(message) = &task.status_message {
        shown["statusMessage"] = json!(message);
    }
    shown
}

/// An `initialize` answer of version 2025-11-25, with the tasks the gateway serves in it.
fn advertise(answer: &mut Value) {
    let result = &mut answer["result"];
    if result["protocolVersion"] == VERSION && result["capabilities"].is_object() {
        result["capabilities"]["tasks"] =
            json!({"cancel": {}, "requests": {"tools": {"call": {}}}});
    }
}

/// A `tools/list` answer whose every tool may be called as a task.
fn optional(answer: &mut Value) {
    if let Some(tools) = answer["result"]["tools"].as_array_mut() {
        for tool in tools {
            tool["execution"] = json!({"taskSupport": "optional"});
        }
    }
}

/// rmcp's `response` to one request, its JSON-RPC message (a JSON body, or each `data:` line
/// of an event stream) changed by `edit`. The streams of these answers end once answered.
async fn rewritten(response: Response, edit: fn(&mut Value)) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = to_bytes(body, usize::MAX).await else {
        return (StatusCode::BAD_GATEWAY, "the MCP answer broke off").into_response();
    };
    let text = String::from_utf8_lossy(&bytes);
    let edited = |json: &str| -> Option<String> {
        let mut message: Value = serde_json::from_str(json).ok()?;
        message.get("result")?;
        edit(&mut message);
        Some(message.to_string())
    };
    let stream = parts
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    let out = match stream {
        true => text
            .split('\n')
            .map(|line| {
                line.strip_prefix("data:")
                    .and_then(|data| edited(data.trim_start()))
                    .map_or_else(|| line.to_string(), |json| format!("data: {json}"))
            })
            .collect::<Vec<_>>()
            .join("\n"),
        false => edited(&text).unwrap_or_else(|| text.into_owned()),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}
