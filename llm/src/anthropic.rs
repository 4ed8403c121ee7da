//! The Anthropic Messages API, streamed. Our blocks already have its shape, so the
//! conversation goes out as it is (but for a tool result with images, whose `content` becomes
//! the API's list of a text block and image blocks). The answer comes back as events that
//! build its blocks by index: a text block grows by text deltas, passed on as they arrive; a
//! tool_use block's input arrives as pieces of JSON, readable once the block stops. `text` and
//! `tool_use` blocks are kept, others (`thinking`, ...) dropped.

use super::{Completion, Endpoint, ModelError, ModelRequest, Usage, pass_on, unreadable};
use countersign_model::run::{Block, Message};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use tokio::sync::mpsc::UnboundedSender;

pub(super) async fn complete(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    req: &ModelRequest<'_>,
    deltas: &UnboundedSender<String>,
) -> Result<Completion, ModelError> {
    let tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
        .collect();
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens,
        "system": req.system,
        "messages": req.messages.iter().map(to_anthropic).collect::<Vec<_>>(),
        "stream": true,
    });
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    let request = http
        .post(format!("{}/v1/messages", endpoint.base_url))
        .header("x-api-key", &endpoint.api_key)
        .header("anthropic-version", "2023-06-01");
    let mut answer = Answer::default();
    super::stream(request, &body, |event| answer.read(&event.data, deltas)).await
}

/// The events of a streamed message, as documented; the event's `type` in its data repeats
/// the SSE event name.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent {
    ContentBlockStart {
        index: u64,
        content_block: Value,
    },
    ContentBlockDelta {
        index: u64,
        delta: Delta,
    },
    ContentBlockStop {
        index: u64,
    },
    /// Opens the message; its usage counts the input's tokens.
    MessageStart {
        #[serde(default)]
        message: Counted,
    },
    /// Its usage counts the output's tokens so far (the counts are cumulative).
    MessageDelta {
        #[serde(default)]
        usage: Tokens,
    },
    MessageStop,
    Error {
        error: ApiError,
    },
    /// `ping` carries nothing the turn needs; event types added later are to be ignored, the
    /// API says.
    #[serde(other)]
    Other,
}

/// A message, for its usage; a missing usage counts nothing (the turn does not need it).
#[derive(Default, Deserialize)]
struct Counted {
    #[serde(default)]
    usage: Tokens,
}

/// A usage object: the counts present in it.
#[derive(Default, Deserialize)]
struct Tokens {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum Delta {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
    /// The deltas of dropped blocks (`thinking_delta`, `signature_delta`, ...).
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct ApiError {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    message: String,
}

impl ApiError {
    /// Overload, rate limits and the API's own errors pass with time; the request's do not.
    fn into_model_error(self) -> ModelError {
        let message = format!("{}: {}", self.kind, self.message);
        match self.kind.as_str() {
            "overloaded_error" | "api_error" | "rate_limit_error" => ModelError::Retryable(message),
            _ => ModelError::Fatal(message),
        }
    }
}

/// A message being streamed.
#[derive(Default)]
struct Answer {
    /// The kept blocks by index, in order.
    blocks: BTreeMap<u64, Block>,
    /// The JSON received so far of each kept tool_use block still open.
    inputs: HashMap<u64, String>,
    usage: Usage,
}

impl Answer {
    /// Reads the data of one event: the turn's blocks once the message stops.
    fn read(
        &mut self,
        data: &str,
        deltas: &UnboundedSender<String>,
    ) -> Result<Option<Completion>, ModelError> {
        match serde_json::from_str(data).map_err(unreadable)? {
            StreamEvent::ContentBlockStart {
                index,
                content_block,
            } => {
                if matches!(content_block["type"].as_str(), Some("text" | "tool_use"))
                    && let Ok(block) = serde_json::from_value::<Block>(content_block)
                {
                    if let Block::Text { text } = &block {
                        pass_on(deltas, text);
                    } else {
                        self.inputs.insert(index, String::new());
                    }
                    self.blocks.insert(index, block);
                }
            }
            StreamEvent::ContentBlockDelta {
                index,
                delta: Delta::Text { text },
            } => {
                if let Some(Block::Text { text: so_far }) = self.blocks.get_mut(&index) {
                    pass_on(deltas, &text);
                    so_far.push_str(&text);
                }
            }
            StreamEvent::ContentBlockDelta {
                index,
                delta: Delta::InputJson { partial_json },
            } => {
                if let Some(json) = self.inputs.get_mut(&index) {
                    json.push_str(&partial_json);
                }
            }
            StreamEvent::ContentBlockStop { index } => {
                // An input streamed as nothing (or as "") is the `{}` its block started with.
                if let Some(json) = self.inputs.remove(&index).filter(|json| !json.is_empty())
                    && let Some(Block::ToolUse { input, .. }) = self.blocks.get_mut(&index)
                {
                    *input = serde_json::from_str(&json).map_err(|e| {
                        ModelError::Fatal(format!("unreadable input of block {index}: {e}"))
                    })?;
                }
            }
            StreamEvent::MessageStart { message } => self.count(message.usage),
            StreamEvent::MessageDelta { usage } => self.count(usage),
            StreamEvent::MessageStop => {
                return Ok(Some(Completion {
                    blocks: std::mem::take(&mut self.blocks).into_values().collect(),
                    usage: self.usage,
                }));
            }
            StreamEvent::Error { error } => return Err(error.into_model_error()),
            StreamEvent::ContentBlockDelta {
                delta: Delta::Other,
                ..
            }
            | StreamEvent::Other => {}
        }
        Ok(None)
    }

    /// Takes the counts a usage object gives (each is the message's total so far).
    fn count(&mut self, tokens: Tokens) {
        if let Some(input) = tokens.input_tokens {
            self.usage.input_tokens = input;
        }
        if let Some(output) = tokens.output_tokens {
            self.usage.output_tokens = output;
        }
    }
}

fn to_anthropic(message: &Message) -> Value {
    let mut out = serde_json::to_value(message).expect("messages serialize");
    for (block, wire) in message
        .content
        .iter()
        .zip(out["content"].as_array_mut().unwrap())
    {
        // Ours, kept with the run: the API knows no such fields.
        if let Some(fields) = wire.as_object_mut() {
            fields.remove("outcome");
            fields.remove("mcp");
        }
        if let Block::ToolResult {
            content, images, ..
        } = block
            && !images.is_empty()
        {
            let mut parts = vec![json!({"type": "text", "text": content})];
            parts.extend(images.iter().map(|image| {
                json!({"type": "image", "source": {
                    "type": "base64", "media_type": image.media_type, "data": image.data,
                }})
            }));
            wire["content"] = Value::Array(parts);
            wire.as_object_mut().unwrap().remove("images");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Model;
    use crate::tests::{ask, ask_counted, at, serve_stream};
    use countersign_fake_model::{FakeModel, REFUND_SCRIPT, refund_brain};

    /// A message as the API streams it, with a thinking block first (dropped), a text block,
    /// a tool_use block whose input arrives in pieces (the first empty, as the API sends it),
    /// and one whose input arrives as nothing.
    const STREAM: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"A broken order: refund it."}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Checking the"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" order — and refunding."}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01","name":"issue_refund","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"order_id\": \"A-1"}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"001\", \"amount\": 12"}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"9, \"reason\": \"broken\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: content_block_start
data: {"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_02","name":"list_orders","input":{}}}

event: content_block_stop
data: {"type":"content_block_stop","index":3}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}

event: message_stop
data: {"type":"message_stop"}

"#;

    #[test]
    fn a_tool_result_goes_out_without_what_countersign_keeps_with_it() {
        let message = Message {
            role: countersign_model::run::Speaker::User,
            content: vec![Block::ToolResult {
                tool_use_id: "toolu_01".into(),
                content: "[image image/png]".into(),
                is_error: false,
                outcome: Some(countersign_model::run::CallOutcome::Executed),
                images: Vec::new(),
                mcp: Some(json!({"content": [], "structuredContent": {"n": 1}})),
            }],
        };
        assert_eq!(
            to_anthropic(&message),
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "[image image/png]"},
            ]})
        );
    }

    #[tokio::test]
    async fn a_streamed_message_becomes_its_text_and_tool_use_blocks_and_its_text_is_passed_on() {
        let (answer, deltas) = ask(&Model::Anthropic(serve_stream(STREAM).await)).await;
        let text = "Checking the order — and refunding.";
        assert_eq!(
            answer.unwrap(),
            [
                Block::Text { text: text.into() },
                Block::ToolUse {
                    id: "toolu_01".into(),
                    name: "issue_refund".into(),
                    input: json!({"order_id": "A-1001", "amount": 129, "reason": "broken"}),
                },
                Block::ToolUse {
                    id: "toolu_02".into(),
                    name: "list_orders".into(),
                    input: json!({}),
                },
            ]
        );
        assert_eq!(deltas, ["Checking the", " order — and refunding."]);
    }

    #[tokio::test]
    async fn an_error_event_can_be_retried_when_the_api_is_overloaded_and_not_when_the_request_is_wrong()
     {
        let overloaded = serve_stream(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n\
             event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        )
        .await;
        let (answer, _) = ask(&Model::Anthropic(overloaded)).await;
        assert!(
            matches!(&answer, Err(ModelError::Retryable(e)) if e == "overloaded_error: Overloaded"),
            "{answer:?}"
        );
        let wrong = serve_stream(
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"no\"}}\n\n",
        )
        .await;
        let (answer, _) = ask(&Model::Anthropic(wrong)).await;
        assert!(matches!(&answer, Err(ModelError::Fatal(_))), "{answer:?}");
    }

    #[tokio::test]
    async fn a_stream_cut_before_message_stop_can_be_retried_and_a_whole_one_reads_as_the_turn() {
        let model = FakeModel::start(refund_brain).await;
        model.cut_next_stream(1);
        let (answer, deltas) = ask(&Model::Anthropic(at(&model))).await;
        assert!(
            matches!(&answer, Err(ModelError::Retryable(_))),
            "{answer:?}"
        );
        assert_eq!(
            deltas,
            ["The "],
            "the text received before the cut was passed on"
        );

        let (answer, deltas) = ask(&Model::Anthropic(at(&model))).await;
        let blocks = answer.unwrap();
        assert_eq!(blocks, REFUND_SCRIPT.turn(0));
        let Block::Text { text } = &blocks[0] else {
            panic!("{blocks:?}")
        };
        assert!(deltas.len() > 1);
        assert_eq!(deltas.concat(), *text);
        assert_eq!(model.requests()[0]["stream"], true);
    }
    #[tokio::test]
    async fn a_streamed_message_counts_the_tokens_its_start_and_its_last_delta_report() {
        let (answer, _) = ask_counted(&Model::Anthropic(serve_stream(STREAM).await)).await;
        let usage = answer.unwrap().usage;
        assert_eq!((usage.input_tokens, usage.output_tokens), (472, 89));
    }
}
