//! The Anthropic Messages API. Our blocks already have its shape, so the conversation goes
//! out as it is (but for a tool result with images, whose `content` becomes the API's list of
//! a text block and image blocks); the answer's `text` and `tool_use` blocks come back, others
//! are dropped.

use super::{Endpoint, ModelError, ModelRequest, post_json};
use countersign_model::run::{Block, Message};
use serde_json::{Value, json};

pub async fn complete(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    req: &ModelRequest<'_>,
) -> Result<Vec<Block>, ModelError> {
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
    });
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    let request = http
        .post(format!("{}/v1/messages", endpoint.base_url))
        .header("x-api-key", &endpoint.api_key)
        .header("anthropic-version", "2023-06-01");
    let answer = post_json(request, &body).await?;
    let content = answer["content"]
        .as_array()
        .ok_or_else(|| ModelError::Fatal("answer has no content".into()))?;
    Ok(content
        .iter()
        .filter(|b| matches!(b["type"].as_str(), Some("text" | "tool_use")))
        .filter_map(|b| serde_json::from_value(b.clone()).ok())
        .collect())
}

fn to_anthropic(message: &Message) -> Value {
    let mut out = serde_json::to_value(message).expect("messages serialize");
    for (block, wire) in message
        .content
        .iter()
        .zip(out["content"].as_array_mut().unwrap())
    {
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
