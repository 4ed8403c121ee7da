//! The runs of an `mcp_client` agent: every `tools/call` an MCP client sends to the gateway's
//! `/mcp/{agent}` is a run of its own, whose "model" asks for exactly that call, once, then
//! ends the run. So the call goes through the policy, the held calls, the decisions and the
//! execution record like any agent's, and the client is answered with the result the run's
//! conversation ends with.
//!
//! The call is kept as data in the run's `metadata.mcp.call`, and the run's input, what every
//! surface shows as what was asked, is a sentence a reviewer reads ([`ProxyCall::request`]):
//! the call's tool and input are shown as the call's already.
//!
//! A run per call rather than per MCP session: a session's calls are independent and may run
//! at once, while a run is one conversation that pauses as a whole, so one held call would
//! hold up every other call of its session.

use crate::run::{Block, Message, Speaker};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A `tools/call` as a proxy run keeps it, in `metadata.mcp.call`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyCall {
    /// The tool the client called, as the agent names it.
    pub tool: String,
    /// The arguments the client gave, a JSON object.
    pub arguments: Value,
}

impl ProxyCall {
    /// The run's input: what it was asked, as a reviewer reads it.
    pub fn request(&self) -> String {
        format!("An MCP client called {}.", self.tool)
    }

    /// The call a run keeps in its metadata. A run started before the call moved there has it
    /// as its input (the first user message), as JSON text.
    pub fn of_run(metadata: &Value, messages: &[Message]) -> Result<Self, String> {
        const SHAPE: &str = r#"{"tool", "arguments"}"#;
        if let Some(call) = metadata.pointer("/mcp/call") {
            return Self::deserialize(call)
                .map_err(|e| format!("metadata.mcp.call is not {SHAPE}: {e}"));
        }
        let input = messages.first().map(Message::text).unwrap_or_default();
        serde_json::from_str(&input).map_err(|e| {
            format!("an mcp_client run keeps its call, {SHAPE}, in metadata.mcp.call: {e}")
        })
    }
}

/// The id of the one call of a proxy run of `tool`: named after the tool, so that it tells a
/// reviewer which call it is, and the same on every attempt of the run. Characters a call id
/// may not hold (MCP allows `.` and `/` in names) become `_`, so that the worker keeps the id
/// as the call's own (`Run::calls_asked`).
pub fn call_id(tool: &str) -> String {
    format!("mcp_{tool}")
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() || c == '-' {
            true => c,
            false => '_',
        })
        .take(64)
        .collect()
}

/// The answer of an `mcp_client` agent's model to its conversation: first the call the run
/// keeps ([`ProxyCall::of_run`]), then, once the call has its result, a line that ends the run.
pub fn answer(metadata: &Value, messages: &[Message]) -> Result<Vec<Block>, String> {
    let turns = messages
        .iter()
        .filter(|m| m.role == Speaker::Assistant)
        .count();
    if turns > 0 {
        let text = match result(messages) {
            Some((_, false)) => "The call's result went back to the MCP client.",
            _ => "The MCP client was told why the call did not succeed.",
        };
        return Ok(vec![Block::Text { text: text.into() }]);
    }
    let call = ProxyCall::of_run(metadata, messages)?;
    Ok(vec![Block::ToolUse {
        id: call_id(&call.tool),
        name: call.tool,
        input: call.arguments,
    }])
}

/// The result of the run's call, once it has one (its text and whether it is an error): what
/// the MCP client is answered. The call is found by the id the model gave it, whichever id
/// that was when the run started.
pub fn result(messages: &[Message]) -> Option<(&str, bool)> {
    let mut blocks = messages.iter().flat_map(|m| &m.content);
    let asked = blocks.find_map(|block| match block {
        Block::ToolUse { id, .. } => Some(id),
        _ => None,
    })?;
    blocks.find_map(|block| match block {
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
            ..
        } if tool_use_id == asked => Some((content.as_str(), *is_error)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refund() -> (Value, ProxyCall) {
        let call = ProxyCall {
            tool: "refund".into(),
            arguments: json!({"amount": 5}),
        };
        (json!({"mcp": {"session": null, "call": call}}), call)
    }

    #[test]
    fn the_model_asks_for_the_call_once_then_ends_the_run() {
        let (metadata, call) = refund();
        let mut messages = vec![Message::user_text(call.request())];
        let first = answer(&metadata, &messages).unwrap();
        assert_eq!(
            first,
            vec![Block::ToolUse {
                id: "mcp_refund".into(),
                name: "refund".into(),
                input: json!({"amount": 5}),
            }]
        );
        assert_eq!(result(&messages), None);
        messages.push(Message {
            role: Speaker::Assistant,
            content: first,
        });
        messages.push(Message {
            role: Speaker::User,
            content: vec![Block::ToolResult {
                tool_use_id: "mcp_refund".into(),
                content: "refunded".into(),
                is_error: false,
                outcome: None,
                images: Vec::new(),
            }],
        });
        assert_eq!(result(&messages), Some(("refunded", false)));
        let last = answer(&metadata, &messages).unwrap();
        assert!(matches!(&last[..], [Block::Text { .. }]));
    }

    #[test]
    fn a_run_started_with_the_call_as_its_input_still_finds_it() {
        let (_, call) = refund();
        let input = serde_json::to_string(&call).unwrap();
        let messages = [Message::user_text(input)];
        assert_eq!(ProxyCall::of_run(&json!({"mcp": {}}), &messages), Ok(call));
    }

    #[test]
    fn a_run_without_a_call_is_an_error() {
        let asked = [Message::user_text("Refund A-1 please.")];
        assert!(answer(&Value::Null, &asked).is_err());
        let half = json!({"mcp": {"call": {"tool": "t"}}});
        assert!(answer(&half, &asked).is_err());
    }

    #[test]
    fn a_call_id_is_named_after_its_tool_and_is_one_a_call_may_keep() {
        assert_eq!(call_id("issue_refund"), "mcp_issue_refund");
        assert_eq!(
            call_id("shop.orders/refund-v2"),
            "mcp_shop_orders_refund-v2"
        );
        let long = call_id(&"x".repeat(128));
        assert_eq!(long.len(), 64);
        let run = crate::run::Run::new(
            crate::run::RunId::new(),
            "shop".into(),
            "v".into(),
            String::new(),
            None,
            Value::Null,
        );
        for id in [call_id("a.b/c"), long] {
            let asked = run.calls_asked(&[Block::ToolUse {
                id: id.clone(),
                name: "t".into(),
                input: json!({}),
            }]);
            assert_eq!(
                (asked[0].call_id.as_str(), asked[0].model_call_id.as_deref()),
                (id.as_str(), None)
            );
        }
    }
}
