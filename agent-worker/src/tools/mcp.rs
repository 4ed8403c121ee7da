//! Tools of MCP servers: a `tools/call` on the agent's session with the server, carrying in
//! `_meta` what an HTTP call sends as headers (run and call ids, idempotency key, receipt).
//! The result's content blocks become the text the model and the reviewers read; `isError`
//! stays an error, and a tool that refused the receipt says so in the result's `_meta`.

use super::{Answer, ToolCall, bounded, idempotency_key};
use crate::agents::RunnableAgent;
use countersign_model::agent::ToolDef;
use countersign_model::mcp::{McpServerDef, result_images, result_text};
use countersign_model::run::{CallOutcome, CallResult};
use countersign_receipt::mcp::{
    META_CALL_ID, META_IDEMPOTENCY_KEY, META_RECEIPT, META_RECEIPT_REFUSED, META_RUN_ID,
};
use serde_json::Map;

pub(super) async fn call(
    agent: &RunnableAgent,
    server: &McpServerDef,
    tool: &ToolDef,
    call: &ToolCall<'_>,
    outcome: CallOutcome,
) -> Answer {
    let mut meta = Map::new();
    meta.insert(META_RUN_ID.into(), call.run.to_string().into());
    meta.insert(META_CALL_ID.into(), call.call_id.into());
    meta.insert(
        META_IDEMPOTENCY_KEY.into(),
        idempotency_key(call.run, call.turn, call.call_id).into(),
    );
    if let Some(receipt) = call.receipt {
        meta.insert(META_RECEIPT.into(), receipt.into());
    }
    let answered = agent
        .mcp
        .call(&agent.agent.def.name, server, &tool.name, call.input, meta)
        .await;
    let mut receipt_refused = None;
    let result = match answered {
        Ok(result) => {
            receipt_refused = result["_meta"][META_RECEIPT_REFUSED]
                .as_str()
                .map(|code| format!("{META_RECEIPT_REFUSED} {code}"));
            let (text, is_error) = result_text(&result);
            CallResult {
                images: result_images(&result),
                outcome: if is_error {
                    CallOutcome::Failed
                } else {
                    outcome
                },
                content: bounded(&text),
                is_error,
            }
        }
        Err(e) => CallResult::failed(format!(
            "The tool {} of the MCP server {} could not be called: {e}",
            tool.name, server.name
        )),
    };
    Answer {
        result,
        receipt_refused,
    }
}
