//! The OpenAI Chat Completions API. Tool calls carry their arguments as a JSON string, and
//! each tool result is its own `tool` message (consecutive ones answer one assistant turn).
//! A `tool` message carries text only, so images tools answered with follow the turn's results
//! in a user message, as data URLs.

use super::{Endpoint, ModelError, ModelRequest, post_json};
use countersign_model::run::{Block, Message, Role};
use serde_json::{Value, json};

pub async fn complete(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    req: &ModelRequest<'_>,
) -> Result<Vec<Block>, ModelError> {
    let mut messages = vec![json!({"role": "system", "content": req.system})];
    for m in req.messages {
        messages.extend(to_openai(m));
    }
    let mut body = json!({
        "model": req.model,
        "max_completion_tokens": req.max_tokens,
        "messages": messages,
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
    let answer = post_json(request, &body).await?;
    let message = &answer["choices"][0]["message"];
    if message.is_null() {
        return Err(ModelError::Fatal("answer has no choices[0].message".into()));
    }
    let mut blocks = Vec::new();
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        blocks.push(Block::Text { text: text.into() });
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
        // Arguments that are not JSON are kept as a string; schema validation then tells
        // the model what is wrong instead of the run failing.
        let input = serde_json::from_str(arguments).unwrap_or(Value::String(arguments.into()));
        blocks.push(Block::ToolUse {
            id: call["id"].as_str().unwrap_or_default().into(),
            name: call["function"]["name"].as_str().unwrap_or_default().into(),
            input,
        });
    }
    Ok(blocks)
}

fn to_openai(message: &Message) -> Vec<Value> {
    let text = message.text();
    match message.role {
        Role::Assistant => {
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
        Role::User => {
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
    use countersign_model::run::Image;

    #[test]
    fn images_of_tool_results_follow_the_tool_messages_as_data_urls() {
        let message = Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                tool_use_id: "call_1".into(),
                content: "[image image/png]".into(),
                is_error: false,
                images: vec![Image {
                    media_type: "image/png".into(),
                    data: "iVBORw0KGgo=".into(),
                }],
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
}
