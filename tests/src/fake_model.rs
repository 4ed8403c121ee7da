//! A local stand-in for the LLM APIs that speaks their real wire formats: Anthropic's
//! `POST /v1/messages` and OpenAI's `POST /chat/completions`. A test gives it a "brain" that
//! answers each request; every request is recorded for assertions.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

type Brain = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

#[derive(Clone)]
pub struct FakeModel {
    pub base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
    latency_ms: Arc<AtomicU64>,
    overloaded: Arc<AtomicU64>,
}

#[derive(Clone)]
struct ModelState {
    requests: Arc<Mutex<Vec<Value>>>,
    brain: Brain,
    latency_ms: Arc<AtomicU64>,
    /// Requests still to be refused as overloaded.
    overloaded: Arc<AtomicU64>,
}

impl FakeModel {
    pub async fn start(brain: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(listener, brain)
    }

    /// Serves on `listener` (for callers on other hosts: a listener on their network).
    pub fn start_on(
        listener: tokio::net::TcpListener,
        brain: impl Fn(&Value) -> Value + Send + Sync + 'static,
    ) -> Self {
        let state = ModelState {
            requests: Arc::new(Mutex::new(Vec::new())),
            brain: Arc::new(brain),
            latency_ms: Arc::new(AtomicU64::new(0)),
            overloaded: Arc::new(AtomicU64::new(0)),
        };
        let (requests, latency_ms, overloaded) = (
            state.requests.clone(),
            state.latency_ms.clone(),
            state.overloaded.clone(),
        );
        let app = Router::new()
            .route("/v1/messages", post(answer))
            .route("/chat/completions", post(answer))
            .with_state(state);
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            base_url,
            requests,
            latency_ms,
            overloaded,
        }
    }

    /// Refuses the next `n` requests with Anthropic's `529 overloaded_error`, as the real API
    /// does under load.
    pub fn overload_next(&self, n: u64) {
        self.overloaded.store(n, Ordering::Relaxed);
    }

    /// Makes every answer take this long, as a real model's do.
    pub fn set_latency(&self, latency: std::time::Duration) {
        self.latency_ms
            .store(latency.as_millis() as u64, Ordering::Relaxed);
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }

    /// Requests whose first user message is `input`: one run's model calls.
    pub fn requests_for(&self, input: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| first_user_text(r) == input)
            .collect()
    }
}

async fn answer(State(state): State<ModelState>, Json(body): Json<Value>) -> Response {
    let latency = state.latency_ms.load(Ordering::Relaxed);
    if latency > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(latency)).await;
    }
    state.requests.lock().unwrap().push(body.clone());
    let refuse = state
        .overloaded
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok();
    if refuse {
        let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        return (StatusCode::from_u16(529).unwrap(), Json(error)).into_response();
    }
    Json((state.brain)(&body)).into_response()
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

/// An Anthropic answer asking for tools: `(id, name, input)` each, after some text.
pub fn anthropic_tool_use(text: &str, calls: &[(&str, &str, Value)]) -> Value {
    let mut content = vec![json!({"type": "text", "text": text})];
    for (id, name, input) in calls {
        content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
    }
    json!({
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
        "content": content, "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 10},
    })
}

/// An Anthropic final answer.
pub fn anthropic_text(text: &str) -> Value {
    json!({
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
        "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 10},
    })
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

/// The refund conversation: first the order lookup and a refund of 129 in one turn, then a
/// final answer that quotes the last tool result it was given.
pub fn refund_brain(request: &Value) -> Value {
    match turn(request) {
        0 => anthropic_tool_use(
            "The order arrived broken; I will check it and refund it.",
            &[
                ("toolu_1", "get_order", json!({"order_id": "A-1001"})),
                (
                    "toolu_2",
                    "issue_refund",
                    json!({"order_id": "A-1001", "amount": 129, "reason": "arrived broken"}),
                ),
            ],
        ),
        _ => anthropic_text("All done."),
    }
}

/// The `tool_result` blocks of the last user message of a request.
pub fn last_results(request: &Value) -> Vec<Value> {
    let messages = request["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "user");
    last["content"].as_array().unwrap().clone()
}
