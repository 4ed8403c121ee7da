//! Calling tools, over HTTP or MCP. Either way the call names itself by an idempotency key
//! made of the run, the turn and the call id, so a tool that honours it never applies one call
//! twice, nor takes two calls for one (as it could if a model numbered its calls afresh each
//! turn); an approved call carries its countersignature receipt. A failure or a timeout is an
//! error result for the model, never a crash.

mod http;
pub(crate) mod mcp;

use crate::agents::RunnableAgent;
use countersign_model::agent::ToolDef;
use countersign_model::run::{CallOutcome, CallResult, RunId};

/// The most of a tool's answer passed on to the model.
const MAX_RESULT_CHARS: usize = 16_000;

/// The most of an MCP proxy run's whole result kept with the run for its client, in bytes of
/// its JSON (images and audio count as their base64); past it the client gets the text the
/// model would be told, with a note (`mcp::kept_whole`).
pub(crate) const MAX_MCP_RESULT_BYTES: usize = 1 << 20;

pub(crate) fn idempotency_key(run: &RunId, turn: u32, call_id: &str) -> String {
    format!("{run}:{turn}:{call_id}")
}

/// The header an approved call's receipt travels in.
pub(crate) const RECEIPT_HEADER: &str = "Countersign-Receipt";

/// What a tool answered.
pub(crate) struct Answer {
    pub result: CallResult,
    /// Set when the tool refused the call's receipt (or its lack of one): the
    /// `WWW-Authenticate` challenge it answered with.
    pub receipt_refused: Option<String>,
}

/// One call as its tool receives it.
pub(crate) struct ToolCall<'a> {
    pub run: &'a RunId,
    pub turn: u32,
    pub call_id: &'a str,
    pub input: &'a serde_json::Value,
    /// The receipt of the decision that approved it; none for a call the policy let through.
    pub receipt: Option<&'a str>,
}

/// Runs one call of `agent`'s `tool`; `outcome` is what a success is reported as (executed,
/// approved, edited).
#[tracing::instrument(name = "tool.call", skip_all, fields(tool = %tool.name, call_id = call.call_id, mcp = tool.mcp.as_deref()))]
pub(crate) async fn call(
    http: &reqwest::Client,
    agent: &RunnableAgent,
    tool: &ToolDef,
    call: &ToolCall<'_>,
    outcome: CallOutcome,
) -> Answer {
    let server = tool
        .mcp
        .as_deref()
        .and_then(|name| agent.agent.def.mcp_server(name));
    match (&tool.http, server) {
        (Some(endpoint), _) => http::call(http, tool, endpoint, call, outcome).await,
        (None, Some(server)) => mcp::call(agent, server, tool, call, outcome).await,
        // Only an external agent's tool has neither (the agent's loading makes sure): the
        // agent runs it itself, once it is told it may.
        (None, None) => Answer {
            result: released(tool, call),
            receipt_refused: None,
        },
    }
}

/// A call let through to the external agent that asked, which runs it itself: what it may
/// run. Its receipt stays with the decision, shown only to whoever may hold it: this result is
/// in the conversation every reader of the run sees.
fn released(tool: &ToolDef, call: &ToolCall<'_>) -> CallResult {
    let content = serde_json::json!({
        "released": tool.name,
        "input": call.input,
    });
    CallResult {
        outcome: CallOutcome::Released,
        content: content.to_string(),
        is_error: false,
        images: Vec::new(),
        mcp: None,
    }
}

/// At most [`MAX_RESULT_CHARS`] of a tool's answer.
fn bounded(text: &str) -> String {
    text.chars().take(MAX_RESULT_CHARS).collect()
}
