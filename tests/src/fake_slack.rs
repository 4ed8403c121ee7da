//! A local Slack Web API: records `chat.postMessage`, `chat.update`, `views.open` and
//! `chat.postEphemeral` calls and answers as Slack does, and signs interaction payloads the
//! way Slack signs them.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

pub const BOT_TOKEN: &str = "xoxb-test-token";
pub const SIGNING_SECRET: &str = "test-signing-secret";
/// The channel id the fake gives every posted message.
pub const CHANNEL_ID: &str = "C_REFUNDS";

#[derive(Clone, Debug)]
pub struct SlackCall {
    pub method: String,
    pub body: Value,
    pub authorization: String,
}

#[derive(Clone)]
pub struct FakeSlack {
    pub api_base_url: String,
    calls: Arc<Mutex<Vec<SlackCall>>>,
}

impl FakeSlack {
    pub async fn start() -> Self {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/api/{method}", post(method))
            .with_state(calls.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api_base_url = format!("http://{}/api", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            api_base_url,
            calls,
        }
    }

    /// The gateway's Slack config for this fake.
    pub fn config(&self) -> approval_gateway::config::SlackConfig {
        approval_gateway::config::SlackConfig {
            api_base_url: self.api_base_url.clone(),
            bot_token: BOT_TOKEN.into(),
            signing_secret: SIGNING_SECRET.into(),
        }
    }

    pub fn calls(&self, method: &str) -> Vec<SlackCall> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }
}

async fn method(
    State(calls): State<Arc<Mutex<Vec<SlackCall>>>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Json<Value> {
    let mut calls = calls.lock().unwrap();
    calls.push(SlackCall {
        method: method.clone(),
        body: body.clone(),
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
    });
    match method.as_str() {
        "chat.postMessage" => {
            let ts = format!("1700000000.{:06}", calls.len());
            Json(
                json!({"ok": true, "channel": CHANNEL_ID, "ts": ts, "message": {"text": body["text"]}}),
            )
        }
        _ => Json(json!({"ok": true})),
    }
}

/// The form body Slack posts for an interaction payload.
pub fn form_body(payload: &Value) -> String {
    serde_urlencoded::to_string([("payload", payload.to_string())]).unwrap()
}

/// A button click by `user` on the message posted for a call.
pub fn click(user: &str, action: &str, button_value: &str) -> Value {
    json!({
        "type": "block_actions",
        "user": {"id": user, "username": user, "team_id": "T1"},
        "team": {"id": "T1", "domain": "acme"},
        "trigger_id": "12345.98765.abcd",
        "container": {"type": "message", "message_ts": "1700000000.000001", "channel_id": CHANNEL_ID},
        "channel": {"id": CHANNEL_ID, "name": "refunds"},
        "actions": [{"type": "button", "action_id": action, "block_id": "decision",
                     "value": button_value, "action_ts": "1700000001.000001"}],
    })
}

/// A modal submission by `user`; `values` maps block ids to typed text.
pub fn submit(
    user: &str,
    callback: &str,
    private_metadata: &str,
    values: &[(&str, &str)],
) -> Value {
    let mut state = serde_json::Map::new();
    for (block, text) in values {
        state.insert(
            block.to_string(),
            json!({ *block: {"type": "plain_text_input", "value": text} }),
        );
    }
    json!({
        "type": "view_submission",
        "user": {"id": user, "name": user},
        "team": {"id": "T1", "domain": "acme"},
        "view": {"id": "V1", "type": "modal", "callback_id": callback,
                 "private_metadata": private_metadata, "state": {"values": state}},
    })
}
