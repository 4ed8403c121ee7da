//! A run of one call: how countersign countersigns the calls of an agent it does not run.
//! Such an agent's "model" asks for exactly the call its client sent, once, and ends the run
//! when the call has its result; so the call goes through the policy, the held calls, the
//! decisions, the deadlines, the receipts and the execution record like any agent's call.
//! Two doors start such runs: the MCP proxy ([`crate::mcp_proxy`]) and the HTTP door for
//! agents written in code ([`crate::door`]).

use crate::run::{Block, CallOutcome, Message, Speaker};
use serde_json::Value;

/// The id of the one call of a run of `tool` asked through `door` (`mcp`, `door`): named
/// after the tool, so that it tells a reviewer which call it is, and the same on every
/// attempt of the run. Characters a call id may not hold (MCP allows `.` and `/` in names)
/// become `_`, so that the worker keeps the id as the call's own (`Run::calls_asked`).
pub fn call_id(door: &str, tool: &str) -> String {
    format!("{door}_{tool}")
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() || c == '-' {
            true => c,
            false => '_',
        })
        .take(64)
        .collect()
}

/// The call a one-call run asks for, in its model's words.
pub struct Asked<'a> {
    /// The call's id ([`call_id`]).
    pub id: String,
    /// The tool it calls.
    pub tool: &'a str,
    /// Its input, as the client sent it.
    pub input: &'a Value,
    /// What the agent said about the call, shown to reviewers as the model's words; empty
    /// for none.
    pub text: &'a str,
}

/// The answer of a one-call run's model to its conversation: first `asked`, then, once the
/// call has its result, a line that ends the run.
pub fn answer(asked: Asked<'_>, messages: &[Message]) -> Vec<Block> {
    let turns = messages
        .iter()
        .filter(|m| m.role == Speaker::Assistant)
        .count();
    if turns > 0 {
        let text = match result(messages) {
            Some((_, false)) => "The call's result went back to the client.",
            _ => "The client was told why the call did not succeed.",
        };
        return vec![Block::Text { text: text.into() }];
    }
    let mut blocks = Vec::new();
    if !asked.text.trim().is_empty() {
        blocks.push(Block::Text {
            text: asked.text.to_string(),
        });
    }
    blocks.push(Block::ToolUse {
        id: asked.id,
        name: asked.tool.to_string(),
        input: asked.input.clone(),
    });
    blocks
}

/// The result of the run's call, once it has one (its text and whether it is an error): what
/// the client is answered. The call is found by the id the model gave it, whichever id that
/// was when the run started.
pub fn result(messages: &[Message]) -> Option<(&str, bool)> {
    match answered(messages)? {
        Block::ToolResult {
            content, is_error, ..
        } => Some((content.as_str(), *is_error)),
        _ => None,
    }
}

/// The whole MCP result of the run's call (MCP's `CallToolResult`, as JSON), when its tool
/// was an MCP server's and the worker kept it ([`crate::run::CallResult::mcp`]): what the MCP
/// proxy answers its client with, instead of [`result`]'s text.
pub fn mcp_result(messages: &[Message]) -> Option<&Value> {
    match answered(messages)? {
        Block::ToolResult { mcp, .. } => mcp.as_ref(),
        _ => None,
    }
}

/// What became of the run's call, once it has a result that says (results stored before
/// outcomes were recorded say nothing).
pub fn outcome(messages: &[Message]) -> Option<CallOutcome> {
    match answered(messages)? {
        Block::ToolResult { outcome, .. } => *outcome,
        _ => None,
    }
}

/// The result block of the run's call, once it has one.
fn answered(messages: &[Message]) -> Option<&Block> {
    let mut blocks = messages.iter().flat_map(|m| &m.content);
    let asked = blocks.find_map(|block| match block {
        Block::ToolUse { id, .. } => Some(id),
        _ => None,
    })?;
    blocks.find(
        |block| matches!(block, Block::ToolResult { tool_use_id, .. } if tool_use_id == asked),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_model_asks_for_the_call_once_with_the_agents_words_then_ends_the_run() {
        let input = json!({"amount": 5});
        let asked = || Asked {
            id: call_id("door", "refund"),
            tool: "refund",
            input: &input,
            text: "The customer was charged twice.",
        };
        let mut messages = vec![Message::user_text("Refund A-1.")];
        let first = answer(asked(), &messages);
        assert_eq!(
            first,
            vec![
                Block::Text {
                    text: "The customer was charged twice.".into()
                },
                Block::ToolUse {
                    id: "door_refund".into(),
                    name: "refund".into(),
                    input: input.clone(),
                }
            ]
        );
        assert_eq!(result(&messages), None);
        messages.push(Message {
            role: Speaker::Assistant,
            content: first,
        });
        messages.push(Message {
            role: Speaker::User,
            content: vec![Block::ToolResult {
                tool_use_id: "door_refund".into(),
                content: "refunded".into(),
                is_error: false,
                outcome: None,
                images: Vec::new(),
                mcp: None,
            }],
        });
        assert_eq!(result(&messages), Some(("refunded", false)));
        assert_eq!(
            mcp_result(&messages),
            None,
            "an HTTP tool's result is text only"
        );
        let last = answer(asked(), &messages);
        assert!(matches!(&last[..], [Block::Text { .. }]));
    }

    #[test]
    fn a_call_id_is_named_after_its_tool_and_is_one_a_call_may_keep() {
        assert_eq!(call_id("mcp", "issue_refund"), "mcp_issue_refund");
        assert_eq!(
            call_id("mcp", "shop.orders/refund-v2"),
            "mcp_shop_orders_refund-v2"
        );
        let long = call_id("mcp", &"x".repeat(128));
        assert_eq!(long.len(), 64);
        let run = crate::run::Run::new(
            crate::run::RunId::new(),
            "shop".into(),
            "v".into(),
            String::new(),
            None,
            Value::Null,
        );
        for id in [call_id("mcp", "a.b/c"), long] {
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
