//! What a proxy call's client is answered: the result the run's call ended with (the upstream
//! tool's whole result as the worker kept it, its content blocks, structured content and
//! `isError`, with the reviewer's changes told first after an edit; the reason after a
//! rejection or expiry), else why there is none. Every answer about a run names it and its
//! call in `_meta` (`countersign.dev/run_id`, `countersign.dev/call_id`), as countersign
//! names them to tools, beside the upstream server's own `_meta`; a call that ran under a
//! receipt names the receipt too (`countersign.dev/receipt_jti`).

use crate::runs::wait::Waited;
use countersign_model::run::{Run, RunId, RunStatus};
use countersign_model::{mcp_proxy, one_call};
use countersign_receipt::mcp::{META_CALL_ID, META_RECEIPT_JTI, META_RUN_ID};
use rmcp::model::{CallToolResult, ContentBlock};
use serde::Deserialize;
use serde_json::Value;

/// The answer to the call run `id` holds, after a wait that ended as `waited`; `receipt_jti`
/// names the receipt the call ran under, if it did.
pub(super) fn of(
    id: &RunId,
    tool: &str,
    waited: Waited,
    receipt_jti: Option<&str>,
) -> CallToolResult {
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
    let mut result = about(result, id, tool);
    if let Some(meta) = result.meta.as_mut() {
        // Only countersign names the receipt: an upstream server's key of that name goes.
        meta.0.remove(META_RECEIPT_JTI);
        if let Some(jti) = receipt_jti {
            meta.0.insert(META_RECEIPT_JTI.into(), Value::from(jti));
        }
    }
    result
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
    // The whole result, when the worker kept it (an MCP tool's, within its bound); else the
    // text the model was told (a refusal, a failure to call, a run stored before).
    let whole =
        one_call::mcp_result(&run.messages).and_then(|kept| CallToolResult::deserialize(kept).ok());
    if let Some(whole) = whole {
        return whole;
    }
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

/// `result`, naming the run and the call of `tool` it is about in its `_meta`, beside what
/// the upstream server put there (countersign's names win over a server's of the same key).
fn about(mut result: CallToolResult, id: &RunId, tool: &str) -> CallToolResult {
    let mut meta = result.meta.take().unwrap_or_default();
    meta.0
        .insert(META_RUN_ID.into(), Value::from(id.to_string()));
    meta.0
        .insert(META_CALL_ID.into(), Value::from(mcp_proxy::call_id(tool)));
    result.meta = Some(meta);
    result
}
