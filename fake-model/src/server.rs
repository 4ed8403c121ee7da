//! The server: both wire formats' routes, each request answered by the brain after the
//! latency a test set, or refused as overloaded while a test asks for that. Tests keep every
//! request for their assertions; the benchmark keeps none and, with a script, reads no more
//! of a request than the roles of its messages, so the fake's own work stays small.

use crate::brain::{Brain, Wire, turn_of};
use crate::wire::turn;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running fake model. It stops with its runtime.
#[derive(Clone)]
pub struct FakeModel {
    pub base_url: String,
    shared: Arc<Shared>,
}

struct Shared {
    brain: Brain,
    /// Every request received, in order, when they are kept.
    requests: Option<Mutex<Vec<Value>>>,
    latency_ms: AtomicU64,
    /// Requests still to be refused as overloaded.
    overloaded: AtomicU64,
}

impl FakeModel {
    /// Serves `brain` on a loopback port of its own, keeping every request.
    pub async fn start(brain: impl Into<Brain>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(listener, brain)
    }

    /// Serves `brain` on `listener` (for callers on other hosts: a listener on their
    /// network) from a task of the current runtime, keeping every request.
    pub fn start_on(listener: tokio::net::TcpListener, brain: impl Into<Brain>) -> Self {
        let model = Self::new(brain.into(), true, &listener);
        let app = model.router();
        tokio::spawn(async move { axum::serve(listener, app).await });
        model
    }

    /// Serves `brain` on `listener` until the runtime ends, keeping no request: a
    /// benchmark's fake, whose cost should not blur the figures.
    pub async fn serve_unrecorded(
        listener: tokio::net::TcpListener,
        brain: impl Into<Brain>,
    ) -> std::io::Result<()> {
        let app = Self::new(brain.into(), false, &listener).router();
        axum::serve(listener, app).await
    }

    fn new(brain: Brain, record: bool, listener: &tokio::net::TcpListener) -> Self {
        Self {
            base_url: format!("http://{}", listener.local_addr().unwrap()),
            shared: Arc::new(Shared {
                brain,
                requests: record.then(Mutex::default),
                latency_ms: AtomicU64::new(0),
                overloaded: AtomicU64::new(0),
            }),
        }
    }

    fn router(&self) -> Router {
        Router::new()
            .route(
                "/v1/messages",
                post(|State(s), body| answer(s, Wire::Anthropic, body)),
            )
            .route(
                "/chat/completions",
                post(|State(s), body| answer(s, Wire::OpenAi, body)),
            )
            .with_state(self.shared.clone())
    }

    /// Refuses the next `n` requests with Anthropic's `529 overloaded_error`, as the real API
    /// does under load.
    pub fn overload_next(&self, n: u64) {
        self.shared.overloaded.store(n, Ordering::Relaxed);
    }

    /// Makes every answer take this long, as a real model's do.
    pub fn set_latency(&self, latency: Duration) {
        self.shared
            .latency_ms
            .store(latency.as_millis() as u64, Ordering::Relaxed);
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<Value> {
        let requests = self.shared.requests.as_ref();
        requests
            .expect("this fake keeps requests")
            .lock()
            .unwrap()
            .clone()
    }

    /// Requests whose first user message is `input`: one run's model calls.
    pub fn requests_for(&self, input: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| crate::wire::first_user_text(r) == input)
            .collect()
    }
}

async fn answer(shared: Arc<Shared>, wire: Wire, body: Bytes) -> Response {
    let latency = shared.latency_ms.load(Ordering::Relaxed);
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    // The whole request is read only when it is kept or the brain reads it.
    let whole = match (&shared.brain, &shared.requests) {
        (Brain::Plays(_), None) => None,
        _ => match serde_json::from_slice::<Value>(&body) {
            Ok(request) => Some(request),
            Err(e) => return unreadable(e),
        },
    };
    if let (Some(requests), Some(request)) = (&shared.requests, &whole) {
        requests.lock().unwrap().push(request.clone());
    }
    let refuse = shared
        .overloaded
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok();
    if refuse {
        let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        return (StatusCode::from_u16(529).unwrap(), axum::Json(error)).into_response();
    }
    match (&shared.brain, &whole) {
        (Brain::Reads(brain), Some(request)) => axum::Json(brain(request)).into_response(),
        (Brain::Reads(_), None) => unreachable!("a brain that reads requests gets them whole"),
        (Brain::Plays(turns), Some(request)) => sent(turns.answer(wire, turn(request))),
        (Brain::Plays(turns), None) => match turn_of(&body) {
            Ok(index) => sent(turns.answer(wire, index)),
            Err(e) => unreadable(e),
        },
    }
}

/// An answer written beforehand.
fn sent(answer: Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], answer).into_response()
}

fn unreadable(e: serde_json::Error) -> Response {
    let error = json!({"error": format!("unreadable request: {e}")});
    (StatusCode::BAD_REQUEST, axum::Json(error)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{REFUND_ANSWER, REFUND_SCRIPT, refund_brain};

    async fn post(base: &str, path: &str, request: &Value) -> Value {
        let response = reqwest::Client::new()
            .post(format!("{base}{path}"))
            .json(request)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    #[tokio::test]
    async fn a_script_is_answered_alike_whether_requests_are_kept_or_not() {
        let unrecorded = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let lean = format!("http://{}", unrecorded.local_addr().unwrap());
        tokio::spawn(FakeModel::serve_unrecorded(unrecorded, &*REFUND_SCRIPT));
        let kept = FakeModel::start(&*REFUND_SCRIPT).await;

        let asking = json!({"model": "fake", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Refund A-1001."}]}]});
        let answered = json!({"model": "fake", "messages": [
            {"role": "user", "content": "Refund A-1001."},
            {"role": "assistant", "content": null, "tool_calls": []},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "refunded"}]});
        for base in [lean.as_str(), kept.base_url.as_str()] {
            let first = post(base, "/v1/messages", &asking).await;
            assert_eq!(first, refund_brain(&asking));
            assert_eq!(first["content"][2]["id"], "toolu_2");
            let last = post(base, "/chat/completions", &answered).await;
            assert_eq!(last["choices"][0]["message"]["content"], REFUND_ANSWER);
            assert!(last["choices"][0]["message"]["tool_calls"].is_null());
        }
        assert_eq!(kept.requests(), vec![asking.clone(), answered]);
        assert_eq!(kept.requests_for("Refund A-1001.").len(), 2);

        kept.overload_next(1);
        let refused = reqwest::Client::new()
            .post(format!("{}/v1/messages", kept.base_url))
            .json(&asking)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status().as_u16(), 529);
    }
}
