//! A local Slack Web API: records `chat.postMessage`, `chat.update`, `views.open` and
//! `chat.postEphemeral` calls and answers as Slack does, and signs interaction payloads the
//! way Slack signs them. Like Slack, it refuses a message with more than 50 blocks or a
//! section text over 3,000 characters (`invalid_blocks`), and a test can make it refuse the
//! next call of a method (`refuse_next`) or rate limit it (`rate_limit_next`, HTTP 429 with
//! `Retry-After`).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub const BOT_TOKEN: &str = "xoxb-test-token";
pub const SIGNING_SECRET: &str = "test-signing-secret";
/// The channel id the fake gives every posted message.
pub const CHANNEL_ID: &str = "C_REFUNDS";
/// The workspace and the app every interaction payload comes from.
pub const TEAM_ID: &str = "T0ACME";
pub const APP_ID: &str = "A0COUNTERSIGN";

#[derive(Clone, Debug)]
pub struct SlackCall {
    pub method: String,
    pub body: Value,
    pub authorization: String,
    /// When it arrived.
    pub at: Instant,
    /// The error it was answered with (`ratelimited` for a 429), if it was refused.
    pub refused: Option<String>,
}

/// An answer a test asked for, in place of the usual one.
#[derive(Clone, Debug)]
enum Scripted {
    Refuse(String),
    RateLimit { retry_after_secs: u64 },
}

#[derive(Default)]
struct Inner {
    calls: Vec<SlackCall>,
    scripted: VecDeque<(String, Scripted)>,
}

#[derive(Clone)]
pub struct FakeSlack {
    pub api_base_url: String,
    inner: Arc<Mutex<Inner>>,
}

impl FakeSlack {
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/api/{method}", post(method))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api_base_url = format!("http://{}/api", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            api_base_url,
            inner,
        }
    }

    /// The next call of `method` is refused with `error` (`invalid_blocks`, say).
    pub fn refuse_next(&self, method: &str, error: &str) {
        let refusal = Scripted::Refuse(error.into());
        self.inner
            .lock()
            .unwrap()
            .scripted
            .push_back((method.into(), refusal));
    }

    /// The next call of `method` is answered HTTP 429 with `Retry-After: {secs}`.
    pub fn rate_limit_next(&self, method: &str, retry_after_secs: u64) {
        let limit = Scripted::RateLimit { retry_after_secs };
        self.inner
            .lock()
            .unwrap()
            .scripted
            .push_back((method.into(), limit));
    }

    /// The gateway's Slack config for this fake.
    pub fn config(&self) -> approval_gateway::config::SlackConfig {
        approval_gateway::config::SlackConfig {
            api_base_url: self.api_base_url.clone(),
            bot_token: BOT_TOKEN.into(),
            signing_secret: SIGNING_SECRET.into(),
            team_id: Some(TEAM_ID.into()),
            api_app_id: Some(APP_ID.into()),
        }
    }

    /// Every call of `method`, refused or not, in order.
    pub fn calls(&self, method: &str) -> Vec<SlackCall> {
        self.inner
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    /// The calls of `method` Slack took, in order.
    pub fn accepted(&self, method: &str) -> Vec<SlackCall> {
        let mut calls = self.calls(method);
        calls.retain(|c| c.refused.is_none());
        calls
    }
}

/// What Slack's schema check would say of a message's blocks (only the limits tests touch).
fn invalid_blocks(body: &Value) -> Option<String> {
    let blocks = body["blocks"].as_array()?;
    if blocks.len() > 50 {
        return Some("no more than 50 items allowed [json-pointer:/blocks]".into());
    }
    blocks.iter().enumerate().find_map(|(i, block)| {
        let text = block["text"]["text"].as_str()?;
        (block["type"] == "section" && text.chars().count() > 3000).then(|| {
            format!("must be less than 3001 characters [json-pointer:/blocks/{i}/text/text]")
        })
    })
}

async fn method(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let mut inner = inner.lock().unwrap();
    let scripted = inner
        .scripted
        .iter()
        .position(|(m, _)| *m == method)
        .and_then(|i| inner.scripted.remove(i))
        .map(|(_, answer)| answer);
    let invalid = if method == "chat.postMessage" || method == "chat.update" {
        invalid_blocks(&body)
    } else {
        None
    };
    let refused = match (&scripted, &invalid) {
        (Some(Scripted::Refuse(error)), _) => Some(error.clone()),
        (Some(Scripted::RateLimit { .. }), _) => Some("ratelimited".to_string()),
        (None, Some(_)) => Some("invalid_blocks".to_string()),
        (None, None) => None,
    };
    inner.calls.push(SlackCall {
        method: method.clone(),
        body: body.clone(),
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        at: Instant::now(),
        refused: refused.clone(),
    });
    if let Some(Scripted::RateLimit { retry_after_secs }) = scripted {
        let headers = [("retry-after", retry_after_secs.to_string())];
        let body = Json(json!({"ok": false, "error": "ratelimited"}));
        return (StatusCode::TOO_MANY_REQUESTS, headers, body).into_response();
    }
    if let Some(error) = refused {
        // Slack's shape for a refusal: HTTP 200, `ok: false`, and for block errors the
        // schema's complaints.
        let complaint = invalid.unwrap_or_else(|| "failed to match all allowed schemas".into());
        return Json(json!({
            "ok": false, "error": error, "errors": [complaint],
            "response_metadata": {"messages": [format!("[ERROR] {complaint}")]},
        }))
        .into_response();
    }
    match method.as_str() {
        "chat.postMessage" => {
            let ts = format!("1700000000.{:06}", inner.calls.len());
            Json(
                json!({"ok": true, "channel": CHANNEL_ID, "ts": ts, "message": {"text": body["text"]}}),
            )
            .into_response()
        }
        _ => Json(json!({"ok": true})).into_response(),
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
        "api_app_id": APP_ID,
        "user": {"id": user, "username": user, "team_id": TEAM_ID},
        "team": {"id": TEAM_ID, "domain": "acme"},
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
        "api_app_id": APP_ID,
        "user": {"id": user, "name": user, "team_id": TEAM_ID},
        "team": {"id": TEAM_ID, "domain": "acme"},
        "view": {"id": "V1", "type": "modal", "callback_id": callback, "team_id": TEAM_ID,
                 "app_id": APP_ID,
                 "private_metadata": private_metadata, "state": {"values": state}},
    })
}
