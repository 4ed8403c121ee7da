//! A proxy call as an MCP task (the Tasks extension, `io.modelcontextprotocol/tasks`, of
//! protocol 2026-07-28): a client that declares the extension on its `tools/call` is answered
//! with a task handle as soon as a person must decide (or when `[mcp] wait_secs` is up), and
//! follows the call with `tasks/get` and `tasks/cancel` instead of calling again.
//!
//! The task is the call's run: its id is the run's id, so every gateway answers for it, after
//! restarts, from the one record of the run in Redis; nothing else is stored. Its status
//! follows the run: `working` while it is queued, running or held (the status message names
//! who was asked, why and until when), `completed` with the answer a `tools/call` gets once
//! the call has one (the upstream result after an approval or edit; after a rejection or
//! expiry, the tool error the model is told, since the extension keeps `failed` for JSON-RPC
//! errors), `cancelled` once the run is. Who may see a task is who may read its run
//! (`Caller::reading`), and who may cancel it who may cancel the run (`Caller::cancelling`),
//! through the same path as `POST /v1/runs/{id}/cancel`; anyone else is told there is no such
//! task.

use crate::auth::Caller;
use crate::runs::wait;
use crate::time::rfc3339;
use countersign_model::one_call;
use countersign_model::run::{CallOutcome, Run, RunId, RunStatus};
use rmcp::model::{
    CallToolResult, CreateTaskResult, DetailedTask, ElicitRequest, ElicitRequestParams, ErrorData,
    InputRequest, Task, TaskPayload, TaskStatus,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// How often a client is asked to poll: people take minutes, and a finished call waits at
/// most this long to be seen.
pub(super) const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// The handle a `tools/call` is answered with: the task of run `id` (`run`, as last read).
pub(super) fn created(id: &RunId, run: Option<&Run>) -> CreateTaskResult {
    let now = countersign_model::now_ms();
    let (created, updated) = run.map_or((now, now), |r| (r.created_at, r.updated_at));
    CreateTaskResult::new(task(id, (created, updated), None, Some(waiting(id, run))))
}

/// How long the answer to an elicitation is remembered: longer than a call waits.
pub(super) const ELICITED_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The key of the input request that sends a reviewer to the inbox, by the call it is about.
const REVIEW_KEY: &str = "countersign.dev/review:";

/// Where the caller, a person who may decide the held call, decides it: its page in the
/// inbox, and whether their client answered the elicitation that sent them there.
pub(super) struct Review {
    pub(super) call_id: String,
    pub(super) url: String,
    pub(super) answered: bool,
}

/// The call an input response's key is about, if it answers the elicitation of a review.
pub(super) fn reviewed_call(key: &str) -> Option<&str> {
    key.strip_prefix(REVIEW_KEY)
}

/// Whether the call of `run` has the answer a `tools/call` gets (its result, or the end of
/// its run), other than a cancellation before it ran, which is a `cancelled` task.
pub(super) fn answered(run: &Run) -> bool {
    !cancelled(run) && wait::answered(run)
}

/// Whether the run was cancelled before its call ran (the call closed as cancelled, or never
/// asked).
fn cancelled(run: &Run) -> bool {
    let outcome = one_call::outcome(&run.messages);
    run.status == RunStatus::Cancelled && matches!(outcome, None | Some(CallOutcome::Cancelled))
}

/// The task of `run` as `tasks/get` answers it: `result` is the answer the call has, if it
/// has one; `retained` how much longer the run is kept, if it is to expire.
pub(super) fn detailed(
    run: &Run,
    result: Option<CallToolResult>,
    retained: Option<Duration>,
    review: Option<Review>,
) -> DetailedTask {
    let id = &run.run_id;
    let times = (run.created_at, run.updated_at);
    let ttl = retained.map(|left| {
        let age = (countersign_model::now_ms() - run.created_at).max(0) as u64;
        age + left.as_millis() as u64
    });
    let (payload, message) = match result {
        _ if cancelled(run) => {
            let by = run.cancel.as_ref().map_or_else(
                || "its run was cancelled".to_string(),
                |c| {
                    let why = c.reason.as_deref().map(|r| format!(" ({r})"));
                    format!("cancelled by {}{}", c.by, why.unwrap_or_default())
                },
            );
            (TaskPayload::Cancelled, format!("Nothing ran: {by}."))
        }
        Some(result) => {
            let message = match result.is_error {
                Some(true) => "The call has its answer: it did not run, or its tool failed.",
                _ => "The call ran; its result is here.",
            };
            let result = match serde_json::to_value(result) {
                Ok(Value::Object(result)) => result,
                _ => Default::default(),
            };
            (TaskPayload::Completed { result }, message.to_string())
        }
        None => match review {
            Some(review) if !review.answered => {
                let message = format!(
                    "You may decide this call: open {} to sign in and decide it in the inbox.",
                    review.url
                );
                let params = ElicitRequestParams::UrlElicitationParams {
                    meta: None,
                    message: message.clone(),
                    url: review.url,
                    elicitation_id: String::new(),
                };
                let asked = InputRequest::Elicitation(ElicitRequest::new(params));
                let key = format!("{REVIEW_KEY}{}", review.call_id);
                let input_requests = BTreeMap::from([(key, asked)]);
                (TaskPayload::InputRequired { input_requests }, message)
            }
            Some(review) => {
                let waits = waiting(id, Some(run));
                (
                    TaskPayload::Working,
                    format!("{waits} You may decide it in the inbox: {}", review.url),
                )
            }
            None => (TaskPayload::Working, waiting(id, Some(run))),
        },
    };
    DetailedTask::new(task(id, times, ttl, Some(message)), payload)
}

fn task(
    id: &RunId,
    (created, updated): (i64, i64),
    ttl: Option<u64>,
    message: Option<String>,
) -> Task {
    let mut task = Task::new(
        id.to_string(),
        TaskStatus::Working,
        rfc3339(created),
        rfc3339(updated),
    )
    .with_poll_interval_ms(POLL_INTERVAL.as_millis() as u64);
    task.ttl_ms = ttl;
    task.status_message = message;
    task
}

/// What a call without an outcome waits for: a person (who, why, until when), or its run.
pub(super) fn waiting(id: &RunId, run: Option<&Run>) -> String {
    let Some(run) = run else {
        return format!("Run {id} is starting.");
    };
    if let Some(cancel) = &run.cancel {
        return format!("Run {id} is being cancelled, as {} asked.", cancel.by);
    }
    if run.status != RunStatus::AwaitingApproval {
        return format!("Run {id} is {}.", run.status.as_str());
    }
    // A run of one call holds at most one (held again under a new id after a policy change).
    let Some(held) = run.held_calls().next() else {
        return format!("Run {id} waits for a person's decision. Nothing has run.");
    };
    let who = match held
        .deciders
        .as_deref()
        .unwrap_or(&held.reviewers.approvers)
    {
        _ if held.nobody_decides() => "nobody".to_string(),
        [] => "a reviewer".to_string(),
        named => named.join(", "),
    };
    let until = held
        .deadline
        .map(|at| format!(" until {}", rfc3339(at)))
        .unwrap_or_default();
    format!(
        "Waits for a decision by {who}{until}: {}. Nothing has run.",
        held.reason
    )
}

/// The run of task `task_id` of the proxy of `agent`, for `caller`; the same error whether
/// there is no such task or it is not the caller's to see.
pub(super) fn visible(
    run: Option<Run>,
    agent: &str,
    caller: &Caller,
    task_id: &str,
) -> Result<Run, ErrorData> {
    let not_found = || {
        ErrorData::invalid_params(
            format!("Failed to retrieve task: no task {task_id:?}"),
            None,
        )
    };
    let run = run.ok_or_else(not_found)?;
    let proxied = run.agent == agent && run.metadata.pointer("/mcp/call").is_some();
    if !proxied
        || caller
            .reading(task_id, run.requested_by.as_deref())
            .is_err()
    {
        return Err(not_found());
    }
    Ok(run)
}
