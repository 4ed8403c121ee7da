//! The runs of an `mcp_client` agent: every `tools/call` an MCP client sends to the gateway's
//! `/mcp/{agent}` is a run of its own, whose input is the call and whose "model" asks for
//! exactly that call, once, then ends the run. So the call goes through the policy, the held
//! calls, the decisions and the execution record like any agent's, and the client is answered
//! with the result the run's conversation ends with.
//!
//! A run per call rather than per MCP session: a session's calls are independent and may run
//! at once, while a run is one conversation that pauses as a whole, so one held call would
//! hold up every other call of its session.

use crate::run::{Block, Message, Role};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The id of the one call of a proxy run.
pub const CALL_ID: &str = "mcp_call";

/// A `tools/call` as a proxy run's input (the first user message), as JSON text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyCall {
    pub tool: String,
    pub arguments: Value,
}

impl ProxyCall {
    /// The run's input.
    pub fn input(&self) -> String {
        serde_json::to_string(self).expect("a call serializes")
    }

    /// The call a run's input names.
    pub fn parse(input: &str) -> Result<Self, String> {
        serde_json::from_str(input).map_err(|e| {
            format!("the input of an mcp_client run is a call, {{\"tool\", \"arguments\"}}: {e}")
        })
    }
}

/// The answer of an `mcp_client` agent's model to its conversation: first the call its input
/// names, then, once the call has its result, a line that ends the run.
pub fn answer(messages: &[Message]) -> Result<Vec<Block>, String> {
    let turns = messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count();
    if turns > 0 {
        let text = match result(messages) {
            Some((_, false)) => "The call's result went back to the MCP client.",
            _ => "The MCP client was told why the call did not succeed.",
        };
        return Ok(vec![Block::Text { text: text.into() }]);
    }
    let input = messages.first().map(Message::text).unwrap_or_default();
    let call = ProxyCall::parse(&input)?;
    Ok(vec![Block::ToolUse {
        id: CALL_ID.into(),
        name: call.tool,
        input: call.arguments,
    }])
}

/// The result of the run's call, once it has one (its text and whether it is an error): what
/// the MCP client is answered.
pub fn result(messages: &[Message]) -> Option<(&str, bool)> {
    messages
        .iter()
        .flat_map(|m| &m.content)
        .find_map(|block| match block {
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
                ..
            } if tool_use_id == CALL_ID => Some((content.as_str(), *is_error)),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_model_asks_for_the_call_once_then_ends_the_run() {
        let call = ProxyCall {
            tool: "refund".into(),
            arguments: json!({"amount": 5}),
        };
        let mut messages = vec![Message::user_text(call.input())];
        let first = answer(&messages).unwrap();
        assert_eq!(
            first,
            vec![Block::ToolUse {
                id: CALL_ID.into(),
                name: "refund".into(),
                input: json!({"amount": 5}),
            }]
        );
        assert_eq!(result(&messages), None);
        messages.push(Message {
            role: Role::Assistant,
            content: first,
        });
        messages.push(Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                tool_use_id: CALL_ID.into(),
                content: "refunded".into(),
                is_error: false,
                outcome: None,
                images: Vec::new(),
            }],
        });
        assert_eq!(result(&messages), Some(("refunded", false)));
        let last = answer(&messages).unwrap();
        assert!(matches!(&last[..], [Block::Text { .. }]));
    }

    #[test]
    fn an_input_that_is_not_a_call_is_an_error() {
        assert!(answer(&[Message::user_text("Refund A-1 please.")]).is_err());
        assert!(ProxyCall::parse(r#"{"tool": "t"}"#).is_err());
    }
}
