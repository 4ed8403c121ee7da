//! Tools of MCP servers: a `tools/call` on the agent's session with the server, carrying in
//! `_meta` what an HTTP call sends as headers (run and call ids, idempotency key, receipt).
//! The result's content blocks become the text the model and the reviewers read; `isError`
//! stays an error, and a tool that refused the receipt says so in the result's `_meta`.
//!
//! A run of the MCP proxy (an `mcp_client` agent) also keeps the whole result, as the server
//! answered it, for the proxy to answer its client with ([`CallResult::mcp`]): at most
//! [`MAX_MCP_RESULT_BYTES`] of it, so that the run's document stays bounded. Past that, the
//! client gets the text the model would be told and a note saying so ([`kept_whole`]).

use super::{Answer, MAX_MCP_RESULT_BYTES, ToolCall, bounded, idempotency_key};
use crate::agents::RunnableAgent;
use countersign_model::agent::{Provider, ToolDef};
use countersign_model::mcp::{McpServerDef, result_images, result_text};
use countersign_model::run::{CallOutcome, CallResult};
use countersign_receipt::mcp::{
    META_CALL_ID, META_IDEMPOTENCY_KEY, META_RECEIPT, META_RECEIPT_REFUSED, META_RUN_ID,
};
use rmcp::model::{CallToolResult, ContentBlock};
use serde::Deserialize;
use serde_json::{Map, Value};

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
        .call(
            &agent.agent.def.name,
            server,
            tool.called(),
            call.input,
            meta,
        )
        .await;
    let proxied = agent.agent.def.model.provider == Provider::McpClient;
    let mut receipt_refused = None;
    let result = match answered {
        Ok(result) => {
            receipt_refused = result["_meta"][META_RECEIPT_REFUSED]
                .as_str()
                .map(|code| format!("{META_RECEIPT_REFUSED} {code}"));
            let (text, is_error) = result_text(&result);
            let content = bounded(&text);
            CallResult {
                images: result_images(&result),
                outcome: if is_error {
                    CallOutcome::Failed
                } else {
                    outcome
                },
                mcp: proxied.then(|| kept_whole(result, &content, is_error)),
                content,
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

/// What a proxy run keeps of `result` (MCP's `CallToolResult`, as JSON) for its client: all
/// of it, when its JSON is at most [`MAX_MCP_RESULT_BYTES`]; else `content` (the text the
/// model would be told) and a note that the rest was left out, as an error if `result` was.
fn kept_whole(result: Value, content: &str, is_error: bool) -> Value {
    let size = serde_json::to_vec(&result).map_or(usize::MAX, |json| json.len());
    if size <= MAX_MCP_RESULT_BYTES {
        return result;
    }
    let note = format!(
        "countersign: the tool's whole result ({size} bytes of JSON) is over the \
         {MAX_MCP_RESULT_BYTES} bytes a proxied call keeps, so only its text is answered, \
         without its structured content, images, audio and resources."
    );
    let blocks = vec![ContentBlock::text(content), ContentBlock::text(note)];
    let text_only = match is_error {
        true => CallToolResult::error(blocks),
        false => CallToolResult::success(blocks),
    };
    serde_json::to_value(text_only).expect("results serialize")
}

/// Puts `text` first in a kept whole result (see [`kept_whole`]): what the client is told
/// before the server's own content, as the model is told it before the tool's text.
pub(crate) fn told_first(whole: &mut Option<Value>, text: &str) {
    let Some(kept) = whole else { return };
    // A kept result is always one rmcp read and wrote.
    let Ok(mut result) = CallToolResult::deserialize(&*kept) else {
        return;
    };
    result.content.insert(0, ContentBlock::text(text));
    *kept = serde_json::to_value(result).expect("results serialize");
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::Resource;
    use serde_json::json;

    fn whole() -> CallToolResult {
        let mut result = CallToolResult::structured(json!({"total": 3}));
        result
            .content
            .push(ContentBlock::image("iVBORw0KGgo=", "image/png"));
        result
            .content
            .push(ContentBlock::resource_link(Resource::new(
                "file:///report.pdf",
                "report",
            )));
        result
    }

    #[test]
    fn a_result_within_the_bound_is_kept_as_the_server_gave_it() {
        let given = serde_json::to_value(whole()).unwrap();
        assert_eq!(kept_whole(given.clone(), "ignored", false), given);
    }

    #[test]
    fn a_result_past_the_bound_is_kept_as_its_text_with_a_note() {
        let mut large = whole();
        let picture = "A".repeat(MAX_MCP_RESULT_BYTES);
        large
            .content
            .push(ContentBlock::image(picture, "image/png"));
        let given = serde_json::to_value(large).unwrap();
        let kept = kept_whole(given, "the text", true);
        let kept = CallToolResult::deserialize(&kept).unwrap();
        assert_eq!(kept.is_error, Some(true));
        assert_eq!(kept.structured_content, None);
        assert_eq!(kept.content.len(), 2, "{kept:?}");
        assert_eq!(kept.content[0].as_text().unwrap().text, "the text");
        let note = &kept.content[1].as_text().unwrap().text;
        assert!(note.contains(&MAX_MCP_RESULT_BYTES.to_string()), "{note}");
    }

    #[test]
    fn a_note_goes_before_the_server_s_content() {
        let mut kept = Some(serde_json::to_value(whole()).unwrap());
        told_first(&mut kept, "A reviewer edited this call.");
        let kept = CallToolResult::deserialize(&kept.unwrap()).unwrap();
        assert_eq!(
            kept.content[0].as_text().unwrap().text,
            "A reviewer edited this call."
        );
        assert_eq!(&kept.content[1..], &whole().content[..]);
        assert_eq!(kept.structured_content, Some(json!({"total": 3})));
        let mut none = None;
        told_first(&mut none, "nothing kept");
        assert_eq!(none, None);
    }
}
