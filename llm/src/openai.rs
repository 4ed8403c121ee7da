//! The OpenAI Chat Completions API, streamed. Tool calls carry their arguments as a JSON
//! string, and each tool result is its own `tool` message (consecutive ones answer one
//! assistant turn). A `tool` message carries text only, so images tools answered with follow
//! the turn's results in a user message, as data URLs.
//!
//! The answer comes back as chunks ending with `[DONE]`: pieces of the content, passed on as
//! they arrive and joined into one text block, and fragments of the tool calls, gathered by
//! their index (the first fragment names the call, the others carry more of its arguments).

use super::{Completion, Endpoint, ModelError, ModelRequest, Usage, pass_on, unreadable};
use countersign_model::run::{Block, Message, Speaker};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use tokio::sync::mpsc::UnboundedSender;

pub(super) async fn complete(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    req: &ModelRequest<'_>,
    deltas: &UnboundedSender<String>,
) -> Result<Completion, ModelError> {
    let mut messages = vec![json!({"role": "system", "content": req.system})];
    for m in req.messages {
        messages.extend(to_openai(m));
    }
    let mut body = json!({
        "model": req.model,
        "max_completion_tokens": req.max_tokens,
        "messages": messages,
        "stream": true,
        // A last chunk, before `[DONE]`, counts the request's tokens.
        "stream_options": {"include_usage": true},
    });
    let tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.input_schema,
            }})
        })
        .collect();
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    let request = http
        .post(format!("{}/chat/completions", endpoint.base_url))
        .bearer_auth(&endpoint.api_key);
    let mut answer = Answer::default();
    super::stream(request, &body, |event| answer.read(&event.data, deltas)).await
}

/// One chunk of a streamed completion: a delta of its one choice, or an error.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    error: Option<ApiError>,
    /// In the last chunk only: the request's tokens.
    usage: Option<Tokens>,
}

/// A usage object; a count it lacks is none (the turn does not need them).
#[derive(Deserialize)]
struct Tokens {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: ChoiceDelta,
}

#[derive(Default, Deserialize)]
struct ChoiceDelta {
    content: Option<String>,
    tool_calls: Option<Vec<CallFragment>>,
}

#[derive(Deserialize)]
struct CallFragment {
    index: u64,
    id: Option<String>,
    #[serde(default)]
    function: FunctionFragment,
}

#[derive(Default, Deserialize)]
struct FunctionFragment {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct ApiError {
    #[serde(default)]
    message: String,
    #[serde(rename = "type")]
    kind: Option<String>,
    code: Option<Value>,
}

impl ApiError {
    /// Rate limits and server errors pass with time; the request's errors do not.
    fn into_model_error(self) -> ModelError {
        let kind = self.kind.as_deref().unwrap_or_default();
        let code = self
            .code
            .as_ref()
            .and_then(Value::as_str)
            .unwrap_or_default();
        let passes = [kind, code]
            .iter()
            .any(|k| k.contains("rate_limit") || k.contains("server_error"));
        let message = format!("{} (type {kind:?}, code {code:?})", self.message);
        if passes {
            ModelError::Retryable(message)
        } else {
            ModelError::Fatal(message)
        }
    }
}

/// A completion being streamed.
#[derive(Default)]
struct Answer {
    text: String,
    /// The tool calls by index, in order.
    calls: BTreeMap<u64, Call>,
    usage: Usage,
}

struct Call {
    id: String,
    name: String,
    arguments: String,
}

impl Answer {
    /// Reads the data of one event: the turn's blocks once the stream is done.
    fn read(
        &mut self,
        data: &str,
        deltas: &UnboundedSender<String>,
    ) -> Result<Option<Completion>, ModelError> {
        if data == "[DONE]" {
            return Ok(Some(Completion {
                blocks: self.blocks(),
                usage: self.usage,
            }));
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(unreadable)?;
        if let Some(error) = chunk.error {
            return Err(error.into_model_error());
        }
        if let Some(tokens) = chunk.usage {
            self.usage = Usage {
                input_tokens: tokens.prompt_tokens,
                output_tokens: tokens.completion_tokens,
            };
        }
        for delta in chunk.choices.into_iter().map(|c| c.delta) {
            if let Some(text) = delta.content {
                pass_on(deltas, &text);
                self.text.push_str(&text);
            }
            for fragment in delta.tool_calls.into_iter().flatten() {
                let function = fragment.function;
                let call = self.calls.entry(fragment.index).or_insert_with(|| Call {
                    id: fragment.id.unwrap_or_default(),
                    name: function.name.unwrap_or_default(),
                    arguments: String::new(),
                });
                call.arguments
                    .push_str(function.arguments.as_deref().unwrap_or_default());
            }
        }
        Ok(None)
    }

    /// The text, if any, then the tool calls.
    fn blocks(&mut self) -> Vec<Block> {
        let text = std::mem::take(&mut self.text);
        let text = (!text.is_empty()).then_some(Block::Text { text });
        let calls = std::mem::take(&mut self.calls).into_values().map(|call| {
            // No arguments is no input; arguments that are not JSON are kept as a string:
            // schema validation then tells the model what is wrong instead of the run failing.
            let input = if call.arguments.is_empty() {
                json!({})
            } else {
                serde_json::from_str(&call.arguments).unwrap_or(Value::String(call.arguments))
            };
            Block::ToolUse {
                id: call.id,
                name: call.name,
                input,
            }
        });
        text.into_iter().chain(calls).collect()
    }
}

fn to_openai(message: &Message) -> Vec<Value> {
    let text = message.text();
    match message.role {
        Speaker::Assistant => {
            let calls: Vec<Value> = message
                .content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolUse { id, name, input } => Some(json!({
                        "id": id, "type": "function",
                        "function": {"name": name, "arguments": input.to_string()},
                    })),
                    _ => None,
                })
                .collect();
            let mut out = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::String(text) }});
            if !calls.is_empty() {
                out["tool_calls"] = Value::Array(calls);
            }
            vec![out]
        }
        Speaker::User => {
            let mut out: Vec<Value> = message
                .content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolResult {
                        tool_use_id,
                        content,
                        ..
                    } => Some(
                        json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}),
                    ),
                    _ => None,
                })
                .collect();
            let images: Vec<Value> = message
                .content
                .iter()
                .flat_map(|b| match b {
                    Block::ToolResult { images, .. } => images.as_slice(),
                    _ => &[],
                })
                .map(|image| {
                    let url = format!("data:{};base64,{}", image.media_type, image.data);
                    json!({"type": "image_url", "image_url": {"url": url}})
                })
                .collect();
            if !images.is_empty() {
                let mut parts =
                    vec![json!({"type": "text", "text": "Images the tools answered with:"})];
                parts.extend(images);
                out.push(json!({"role": "user", "content": parts}));
            }
            if !text.is_empty() {
                out.push(json!({"role": "user", "content": text}));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Model;
    use crate::tests::{ask, ask_counted, at, serve_stream};
    use countersign_fake_model::{FakeModel, openai_answer, turn};
    use countersign_model::run::Image;

    /// A completion as the API streams it: the role, the content in pieces, two tool calls
    /// whose arguments arrive in fragments after the one naming them, and a third whose
    /// arguments are not JSON; then the finish reason and a usage chunk without choices.
    const STREAM: &str = r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"content":"Checking the"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"content":" order — and refunding."},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_order","arguments":""}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"order_id\":"}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" \"A-1001\"}"}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"issue_refund","arguments":""}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"order_id\": \"A-1001\", "}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"amount\": 129}"}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"tool_calls":[{"index":2,"id":"call_c","type":"function","function":{"name":"get_order","arguments":"{\"order_id\": A-1"}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":40,"total_tokens":160}}

data: [DONE]

"#;

    #[tokio::test]
    async fn a_streamed_completion_becomes_one_text_block_and_its_tool_calls_and_its_text_is_passed_on()
     {
        let (answer, deltas) = ask(&Model::OpenAi(serve_stream(STREAM).await)).await;
        let text = "Checking the order — and refunding.";
        let call = |id: &str, name: &str, input: Value| Block::ToolUse {
            id: id.into(),
            name: name.into(),
            input,
        };
        assert_eq!(
            answer.unwrap(),
            [
                Block::Text { text: text.into() },
                call("call_a", "get_order", json!({"order_id": "A-1001"})),
                call(
                    "call_b",
                    "issue_refund",
                    json!({"order_id": "A-1001", "amount": 129})
                ),
                call("call_c", "get_order", json!("{\"order_id\": A-1")),
            ]
        );
        assert_eq!(deltas, ["Checking the", " order — and refunding."]);
    }

    #[tokio::test]
    async fn an_error_in_the_stream_can_be_retried_only_when_it_is_a_rate_limit_or_a_server_error()
    {
        let chunk = r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}

"#;
        let cases = [
            (
                r#"{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}"#,
                true,
            ),
            (
                r#"{"message":"The server had an error","type":"server_error","code":null}"#,
                true,
            ),
            (
                r#"{"message":"Invalid tools","type":"invalid_request_error","code":null}"#,
                false,
            ),
        ];
        for (error, retryable) in cases {
            let stream = format!("{chunk}data: {{\"error\":{error}}}\n\n");
            let (answer, _) = ask(&Model::OpenAi(serve_stream(&stream).await)).await;
            match answer {
                Err(ModelError::Retryable(e)) if retryable => assert!(e.contains("type"), "{e}"),
                Err(ModelError::Fatal(e)) if !retryable => {
                    assert!(e.contains("Invalid tools"), "{e}");
                }
                other => panic!("{error}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_stream_cut_before_done_can_be_retried_and_a_whole_one_reads_as_the_turn() {
        let model = FakeModel::start(|request: &Value| match turn(request) {
            0 => openai_answer(
                Some("Refunding it now."),
                &[(
                    "call_1",
                    "issue_refund",
                    json!({"order_id": "A-1001", "amount": 129}),
                )],
            ),
            _ => openai_answer(Some("Refunded."), &[]),
        })
        .await;
        model.cut_next_stream(1);
        let (answer, deltas) = ask(&Model::OpenAi(at(&model))).await;
        assert!(
            matches!(&answer, Err(ModelError::Retryable(_))),
            "{answer:?}"
        );
        assert_eq!(deltas, ["Refunding "]);

        let (answer, deltas) = ask(&Model::OpenAi(at(&model))).await;
        assert_eq!(
            answer.unwrap(),
            [
                Block::Text {
                    text: "Refunding it now.".into()
                },
                Block::ToolUse {
                    id: "call_1".into(),
                    name: "issue_refund".into(),
                    input: json!({"order_id": "A-1001", "amount": 129}),
                },
            ]
        );
        assert_eq!(deltas, ["Refunding ", "it ", "now."]);
        assert_eq!(model.requests()[0]["stream"], true);
        assert_eq!(
            model.requests()[0]["stream_options"],
            json!({"include_usage": true})
        );
    }

    #[test]
    fn images_of_tool_results_follow_the_tool_messages_as_data_urls() {
        let message = Message {
            role: Speaker::User,
            content: vec![Block::ToolResult {
                tool_use_id: "call_1".into(),
                content: "[image image/png]".into(),
                is_error: false,
                outcome: None,
                images: vec![Image {
                    media_type: "image/png".into(),
                    data: "iVBORw0KGgo=".into(),
                }],
                // Kept for an MCP proxy's client, never sent.
                mcp: Some(json!({"content": [], "structuredContent": {"n": 1}})),
            }],
        };
        let out = to_openai(&message);
        assert_eq!(
            out[0],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "[image image/png]"})
        );
        assert_eq!(out[1]["role"], "user");
        assert_eq!(
            out[1]["content"][1],
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}})
        );
    }
    #[tokio::test]
    async fn a_streamed_completion_counts_the_tokens_its_usage_chunk_reports() {
        let (answer, _) = ask_counted(&Model::OpenAi(serve_stream(STREAM).await)).await;
        let usage = answer.unwrap().usage;
        assert_eq!((usage.input_tokens, usage.output_tokens), (120, 40));
    }
}
