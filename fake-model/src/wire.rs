//! The two wire formats as the fake speaks them: answers built from the assistant's blocks,
//! and what a brain reads of a request (which turn it asks for, the run's input, the tool
//! results it carries).

use countersign_model::run::Block;
use serde_json::{Value, json};

/// An Anthropic Messages answer holding `blocks` (text and tool_use); it stops for tools if
/// it asks for any.
pub fn anthropic_message(blocks: &[Block]) -> Value {
    let asks = blocks.iter().any(|b| matches!(b, Block::ToolUse { .. }));
    json!({
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
        "content": blocks, "stop_reason": if asks { "tool_use" } else { "end_turn" },
        "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 10},
    })
}

/// An OpenAI Chat Completions answer holding `blocks`: their text joined as the content (none
/// without text), their tool_use blocks as tool calls.
pub fn openai_message(blocks: &[Block]) -> Value {
    let texts: Vec<&str> = blocks
        .iter()
        .filter_map(|b| match b {
            Block::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let calls: Vec<(&str, &str, Value)> = blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolUse { id, name, input } => Some((id.as_str(), name.as_str(), input.clone())),
            _ => None,
        })
        .collect();
    let content = texts.join("\n");
    openai_answer((!texts.is_empty()).then_some(content.as_str()), &calls)
}

/// An Anthropic answer asking for tools: `(id, name, input)` each, after some text.
pub fn anthropic_tool_use(text: &str, calls: &[(&str, &str, Value)]) -> Value {
    let mut blocks = vec![Block::Text { text: text.into() }];
    blocks.extend(calls.iter().map(|(id, name, input)| Block::ToolUse {
        id: id.to_string(),
        name: name.to_string(),
        input: input.clone(),
    }));
    anthropic_message(&blocks)
}

/// An Anthropic final answer.
pub fn anthropic_text(text: &str) -> Value {
    anthropic_message(&[Block::Text { text: text.into() }])
}

/// An OpenAI Chat Completions answer: the assistant's `content` and its `tool_calls`, each
/// `(id, name, input)` with the arguments as a JSON string, as the API sends them.
pub fn openai_answer(content: Option<&str>, calls: &[(&str, &str, Value)]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, input)| {
            json!({"id": id, "type": "function",
                   "function": {"name": name, "arguments": input.to_string()}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": content});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    })
}

/// How many assistant turns a request's conversation holds (the turn being asked for).
pub fn turn(request: &Value) -> usize {
    request["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] == "assistant").count())
        .unwrap_or(0)
}

/// The text of the first user message (Anthropic blocks or OpenAI string).
pub fn first_user_text(request: &Value) -> String {
    let Some(first) = request["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    match &first["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks[0]["text"].as_str().unwrap_or_default().to_string(),
        _ => String::new(),
    }
}

/// The `tool_result` blocks of the last user message of an Anthropic request.
pub fn last_results(request: &Value) -> Vec<Value> {
    let messages = request["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "user");
    last["content"].as_array().unwrap().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_turn_reads_the_same_in_both_formats() {
        let blocks = [
            Block::Text {
                text: "Refunding.".into(),
            },
            Block::ToolUse {
                id: "toolu_2".into(),
                name: "issue_refund".into(),
                input: json!({"amount": 129}),
            },
        ];
        let anthropic = anthropic_message(&blocks);
        assert_eq!(anthropic["stop_reason"], "tool_use");
        assert_eq!(
            anthropic["content"][0],
            json!({"type": "text", "text": "Refunding."})
        );
        assert_eq!(
            anthropic["content"][1],
            json!({"type": "tool_use", "id": "toolu_2", "name": "issue_refund",
                   "input": {"amount": 129}})
        );
        let openai = openai_message(&blocks);
        let message = &openai["choices"][0]["message"];
        assert_eq!(message["content"], "Refunding.");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            r#"{"amount":129}"#
        );
        assert_eq!(openai["choices"][0]["finish_reason"], "tool_calls");

        let text_only = openai_message(&blocks[..1]);
        assert_eq!(text_only["choices"][0]["finish_reason"], "stop");
        assert!(openai_message(&blocks[1..])["choices"][0]["message"]["content"].is_null());
        assert_eq!(anthropic_message(&blocks[..1])["stop_reason"], "end_turn");
    }
}
