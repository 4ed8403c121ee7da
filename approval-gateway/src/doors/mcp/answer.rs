//! What a proxy call's client is answered: the result the run's call ended with (the upstream
//! tool's after an approval, with the reviewer's changes told after an edit; the reason after
//! a rejection or expiry), else why there is none. Every answer about a run names it and its
//! call in `_meta` (`countersign.dev/run_id`, `countersign.dev/call_id`), as countersign
//! names them to tools.

use crate::runs::wait::Waited;
use countersign_model::run::{Run, RunId, RunStatus};
use countersign_model::{mcp_proxy, one_call};
use countersign_receipt::mcp::{META_CALL_ID, META_RUN_ID};
use rmcp::model::{CallToolResult, ContentBlock, MetaObject};
use serde_json::{Map, Value};

/// The answer to the call run `id` holds, after a wait that ended as `waited`.
pub(super) fn of(id: &RunId, tool: &str, waited: Waited) -> CallToolResult {
    let result = match waited {
        Waited::Done(run) => finished(&run, tool),
        Waited::Pending(Some(run)) | Waited::Abandoned(Some(run))
            if run.status == RunStatus::AwaitingApproval =>
        {
            held(&run, tool)
        }
        Waited::Pending(run) | Waited::Abandoned(run) => {
            let status = run.map_or("queued", |r| r.status.as_str());
            return still_waiting(id, tool, &format!("the run is {status}"));
        }
    };
    about(result, id, tool)
}

/// A call that has no outcome yet, for a reason that is not a person.
pub(super) fn still_waiting(id: &RunId, tool: &str, why: &str) -> CallToolResult {
    let call = mcp_proxy::call_id(tool);
    about(
        text(
            format!(
                "The call {call} of {tool} (run {id}) has no outcome yet: {why}. Call {tool} \
                 again with the same arguments to get its outcome; it will not run twice."
            ),
            true,
        ),
        id,
        tool,
    )
}

/// A call refused before any run: nothing to name.
pub(super) fn refused(why: &str) -> CallToolResult {
    text(why.to_string(), true)
}

fn finished(run: &Run, tool: &str) -> CallToolResult {
    let id = &run.run_id;
    if let Some((content, is_error)) = one_call::result(&run.messages) {
        return text(content.to_string(), is_error);
    }
    let why = match (run.status, &run.cancel) {
        (RunStatus::Cancelled, Some(cancel)) => format!(
            "run {id} was cancelled by {}{}",
            cancel.by,
            cancel
                .reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
        (RunStatus::Failed, _) => format!(
            "run {id} failed: {}",
            run.error.as_deref().unwrap_or("no reason given")
        ),
        (status, _) => format!("run {id} is {} without a result", status.as_str()),
    };
    text(format!("{tool} did not run: {why}."), true)
}

/// The call waits for a person: why, and until when.
fn held(run: &Run, tool: &str) -> CallToolResult {
    let id = &run.run_id;
    let call_id = mcp_proxy::call_id(tool);
    let call = run.held_calls().find(|c| c.call_id == call_id);
    let reason = call.map_or("its policy holds it", |c| c.reason.as_str());
    let deadline = call
        .and_then(|c| c.deadline)
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|at| format!(" (they have until {})", at.to_rfc3339()))
        .unwrap_or_default();
    text(
        format!(
            "The call {call_id} of {tool} (run {id}) waits for a person's decision: {reason}. \
             Nothing has run. A person must decide{deadline}; then call {tool} again with the \
             same arguments to get the outcome (it will not run twice)."
        ),
        true,
    )
}

fn text(content: String, is_error: bool) -> CallToolResult {
    let blocks = vec![ContentBlock::text(content)];
    match is_error {
        true => CallToolResult::error(blocks),
        false => CallToolResult::success(blocks),
    }
}

/// `result`, naming the run and the call of `tool` it is about in its `_meta`.
fn about(mut result: CallToolResult, id: &RunId, tool: &str) -> CallToolResult {
    let mut meta = Map::new();
    meta.insert(META_RUN_ID.into(), Value::from(id.to_string()));
    meta.insert(META_CALL_ID.into(), Value::from(mcp_proxy::call_id(tool)));
    result.meta = Some(MetaObject(meta));
    result
}
