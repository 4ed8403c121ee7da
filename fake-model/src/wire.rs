//! The two wire formats as the fake speaks them: answers built from the assistant's blocks,
//! the same answers streamed (server-sent events, in each API's own events), and what a brain
//! reads of a request (which turn it asks for, the run's input, the tool results it carries).

use axum::body::Bytes;
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

/// An answer as a request asking for a stream gets it.
#[derive(Clone)]
pub(crate) struct Streamed {
    /// Its server-sent events.
    pub(crate) body: Bytes,
    /// Where a stream cut halfway ends: after its first text delta, or after its first event
    /// when it has no text.
    pub(crate) cut: usize,
}

/// Server-sent events being written.
#[derive(Default)]
struct Events {
    body: String,
    first_text_end: Option<usize>,
}

impl Events {
    fn send(&mut self, event: Option<&str>, data: &str) {
        if let Some(event) = event {
            self.body.push_str(&format!("event: {event}\n"));
        }
        self.body.push_str(&format!("data: {data}\n\n"));
    }

    /// Sends an Anthropic event, named as its data's `type`.
    fn anthropic(&mut self, data: Value) {
        self.send(data["type"].as_str(), &data.to_string());
    }

    /// Sends an OpenAI chunk, which is unnamed.
    fn openai(&mut self, data: Value) {
        self.send(None, &data.to_string());
    }

    /// Marks the text delta just sent: a cut stream ends after the first.
    fn sent_text(&mut self) {
        self.first_text_end.get_or_insert(self.body.len());
    }

    fn written(self) -> Streamed {
        let first_event_end = self.body.find("\n\n").map_or(0, |i| i + 2);
        Streamed {
            cut: self.first_text_end.unwrap_or(first_event_end),
            body: Bytes::from(self.body),
        }
    }
}

/// Text as the APIs stream it: word by word (each with the whitespace after it).
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split_inclusive(char::is_whitespace)
}

/// A tool input's JSON in two pieces, as the APIs stream it in several.
fn halves(json: &str) -> [&str; 2] {
    let mut middle = json.len() / 2;
    while !json.is_char_boundary(middle) {
        middle += 1;
    }
    let (first, second) = json.split_at(middle);
    [first, second]
}

/// An Anthropic Messages answer (as [`anthropic_message`] writes it) as its stream: the
/// message without content, each block started, grown by deltas and stopped, then the stop
/// reason and the end.
pub(crate) fn anthropic_stream(message: &Value) -> Streamed {
    let mut events = Events::default();
    let mut started = message.clone();
    started["content"] = json!([]);
    started["stop_reason"] = Value::Null;
    started["stop_sequence"] = Value::Null;
    events.anthropic(json!({"type": "message_start", "message": started}));
    events.anthropic(json!({"type": "ping"}));
    let blocks = message["content"].as_array().map_or(&[][..], Vec::as_slice);
    for (index, block) in blocks.iter().enumerate() {
        let mut start = block.clone();
        let deltas: Vec<Value> = match block["type"].as_str() {
            Some("text") => {
                start["text"] = json!("");
                let text = block["text"].as_str().unwrap_or_default();
                words(text)
                    .map(|word| json!({"type": "text_delta", "text": word}))
                    .collect()
            }
            Some("tool_use") => {
                start["input"] = json!({});
                halves(&block["input"].to_string())
                    .map(|piece| json!({"type": "input_json_delta", "partial_json": piece}))
                    .into()
            }
            _ => Vec::new(),
        };
        events.anthropic(
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        );
        for delta in deltas {
            let text = delta["type"] == "text_delta";
            events
                .anthropic(json!({"type": "content_block_delta", "index": index, "delta": delta}));
            if text {
                events.sent_text();
            }
        }
        events.anthropic(json!({"type": "content_block_stop", "index": index}));
    }
    events.anthropic(json!({"type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
        "usage": {"output_tokens": message["usage"]["output_tokens"]}}));
    events.anthropic(json!({"type": "message_stop"}));
    events.written()
}

/// An OpenAI Chat Completions answer (as [`openai_answer`] writes it) as its stream: chunks
/// of its first choice's message (the role, the content word by word, each tool call named
/// and then its arguments in pieces), the finish reason, the usage, then `[DONE]`.
pub(crate) fn openai_stream(answer: &Value) -> Streamed {
    let mut events = Events::default();
    let choice = &answer["choices"][0];
    let message = &choice["message"];
    let chunk = |delta: Value, finish_reason: &Value| {
        json!({
            "id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"],
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
        })
    };
    let content = message["content"].as_str();
    events.openai(chunk(
        json!({"role": "assistant", "content": content.map(|_| "")}),
        &Value::Null,
    ));
    for word in words(content.unwrap_or_default()) {
        events.openai(chunk(json!({"content": word}), &Value::Null));
        events.sent_text();
    }
    let calls = message["tool_calls"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    for (index, call) in calls.iter().enumerate() {
        let function = &call["function"];
        let [first, rest] = halves(function["arguments"].as_str().unwrap_or_default());
        let named = json!({"index": index, "id": call["id"], "type": "function",
                           "function": {"name": function["name"], "arguments": first}});
        let more = json!({"index": index, "function": {"arguments": rest}});
        for fragment in [named, more] {
            events.openai(chunk(json!({"tool_calls": [fragment]}), &Value::Null));
        }
    }
    events.openai(chunk(json!({}), &choice["finish_reason"]));
    // The usage chunk the API sends last when asked (`stream_options.include_usage`, which
    // the worker always asks for): no choices, the answer's usage.
    events.openai(json!({
        "id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
        "model": answer["model"], "choices": [], "usage": answer["usage"],
    }));
    events.send(None, "[DONE]");
    events.written()
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
