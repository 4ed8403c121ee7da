//! The server: both wire formats' routes, each request answered by the brain after the
//! latency a test set, or refused as overloaded while a test asks for that. A request with
//! `"stream": true` gets the answer as the API streams it, cut halfway while a test asks for
//! that. Tests keep every request for their assertions; the benchmark keeps none and, with a
//! script, reads no more of a request than the roles of its messages and its `stream`, so the
//! fake's own work stays small.

use crate::brain::{Brain, Wire, Written, asked};
use crate::wire::{Streamed, turn};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running fake model. It stops with its runtime.
#[derive(Clone)]
pub struct FakeModel {
    /// Where the fake model is reached, `http://127.0.0.1:PORT`.
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
    /// Streamed answers still to be cut halfway.
    cut_streams: AtomicU64,
    /// The pause before each event of a streamed answer; 0: the answer is written at once.
    pace_ms: AtomicU64,
    /// When each piece of text of a paced answer was written, when requests are kept.
    texts: Option<Mutex<Vec<(Instant, String)>>>,
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
                cut_streams: AtomicU64::new(0),
                pace_ms: AtomicU64::new(0),
                texts: record.then(Mutex::default),
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

    /// Cuts the next `n` streamed answers after their first text delta (or first event, when
    /// they have no text): they end without the API's last event, as when the connection
    /// breaks.
    pub fn cut_next_stream(&self, n: u64) {
        self.shared.cut_streams.store(n, Ordering::Relaxed);
    }

    /// Writes each event of a streamed answer on its own, `pause` after the one before, as a
    /// real model's tokens come; [`FakeModel::texts_written`] then says when each piece of
    /// text went out.
    pub fn pace_streams(&self, pause: Duration) {
        let ms = pause.as_millis() as u64;
        self.shared.pace_ms.store(ms, Ordering::Relaxed);
    }

    /// Each piece of text of the paced answers, in order, with when it was written.
    pub fn texts_written(&self) -> Vec<(Instant, String)> {
        let texts = self.shared.texts.as_ref();
        texts
            .expect("this fake keeps requests")
            .lock()
            .unwrap()
            .clone()
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
    if take_one(&shared.overloaded) {
        let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        return (StatusCode::from_u16(529).unwrap(), axum::Json(error)).into_response();
    }
    match (&shared.brain, &whole) {
        (Brain::Reads(brain), Some(request)) => {
            let answer = brain(request);
            match streams(request).then(|| wire.stream(&answer)).flatten() {
                Some(streamed) => shared.stream(&streamed),
                None => axum::Json(answer).into_response(),
            }
        }
        (Brain::Reads(_), None) => unreachable!("a brain that reads requests gets them whole"),
        (Brain::Plays(turns), Some(request)) => {
            shared.send(turns.answer(wire, turn(request)), streams(request))
        }
        (Brain::Plays(turns), None) => match asked(&body) {
            Ok(asked) => shared.send(turns.answer(wire, asked.turn), asked.stream),
            Err(e) => unreadable(e),
        },
    }
}

fn streams(request: &Value) -> bool {
    request["stream"] == true
}

/// Counts one down, if it is not down to zero yet.
fn take_one(counter: &AtomicU64) -> bool {
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}

impl Shared {
    /// An answer written beforehand.
    fn send(self: &Arc<Self>, written: &Written, stream: bool) -> Response {
        if stream {
            return self.stream(&written.streamed);
        }
        let answer = written.whole.clone();
        ([(header::CONTENT_TYPE, "application/json")], answer).into_response()
    }

    /// A streamed answer, cut halfway if a test asked for that.
    fn stream(self: &Arc<Self>, streamed: &Streamed) -> Response {
        let body = if take_one(&self.cut_streams) {
            streamed.body.slice(..streamed.cut)
        } else {
            streamed.body.clone()
        };
        let headers = [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ];
        let pace = Duration::from_millis(self.pace_ms.load(Ordering::Relaxed));
        if pace.is_zero() {
            return (headers, body).into_response();
        }
        (headers, self.paced(body, pace)).into_response()
    }

    /// The events of `body` one at a time, `pace` apart, each piece of text noted as written.
    fn paced(self: &Arc<Self>, body: Bytes, pace: Duration) -> Body {
        let mut events = Vec::new();
        let mut rest = body;
        while let Some(end) = rest.windows(2).position(|w| w == b"\n\n") {
            events.push(rest.split_to(end + 2));
        }
        let shared = self.clone();
        Body::from_stream(futures::stream::iter(events).then(move |event| {
            let shared = shared.clone();
            async move {
                tokio::time::sleep(pace).await;
                // Only a fake that keeps what it did reads its events back.
                if let Some(texts) = &shared.texts
                    && let Some(text) = text_in(&event)
                {
                    texts.lock().unwrap().push((Instant::now(), text));
                }
                Ok::<_, std::convert::Infallible>(event)
            }
        }))
    }
}

/// The piece of text an event carries, in either wire format.
fn text_in(event: &[u8]) -> Option<String> {
    let data = std::str::from_utf8(event)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("data: "))?;
    let data: Value = serde_json::from_str(data).ok()?;
    let text = match data["type"].as_str() {
        Some("content_block_delta") => &data["delta"]["text"],
        _ => &data["choices"][0]["delta"]["content"],
    };
    text.as_str().map(str::to_string)
}

fn unreadable(e: serde_json::Error) -> Response {
    let error = json!({"error": format!("unreadable request: {e}")});
    (StatusCode::BAD_REQUEST, axum::Json(error)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{REFUND_ANSWER, REFUND_SCRIPT, openai_answer, refund_brain};
    use countersign_model::sse::{Decoder, Event};

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

    /// The events of a streamed answer, with the data of each.
    async fn post_stream(base: &str, path: &str, request: &Value) -> Vec<(Event, Value)> {
        let mut request = request.clone();
        request["stream"] = json!(true);
        let response = reqwest::Client::new()
            .post(format!("{base}{path}"))
            .json(&request)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let events = Decoder::new().push(&response.bytes().await.unwrap());
        let data = |e: &Event| serde_json::from_str(&e.data).unwrap_or(Value::Null);
        events.into_iter().map(|e| (e.clone(), data(&e))).collect()
    }

    /// The strings at `pointer` in a stream's data.
    fn pieces<'a>(events: &'a [(Event, Value)], pointer: &str) -> Vec<&'a str> {
        events
            .iter()
            .filter_map(|(_, data)| data.pointer(pointer)?.as_str())
            .collect()
    }

    #[tokio::test]
    async fn a_script_is_streamed_alike_whether_requests_are_kept_or_not() {
        let unrecorded = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let lean = format!("http://{}", unrecorded.local_addr().unwrap());
        tokio::spawn(FakeModel::serve_unrecorded(unrecorded, &*REFUND_SCRIPT));
        let kept = FakeModel::start(&*REFUND_SCRIPT).await;

        let asking = json!({"model": "fake", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Refund A-1001."}]}]});
        let whole = refund_brain(&asking);
        let answered = json!({"model": "fake", "messages": [
            {"role": "user", "content": "Refund A-1001."},
            {"role": "assistant", "content": null, "tool_calls": []},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "refunded"}]});
        for base in [lean.as_str(), kept.base_url.as_str()] {
            let events = post_stream(base, "/v1/messages", &asking).await;
            let names: Vec<&str> = events.iter().map(|(e, _)| e.event.as_str()).collect();
            assert_eq!(names[..2], ["message_start", "ping"]);
            assert_eq!(names.last(), Some(&"message_stop"));
            for (event, data) in &events {
                assert_eq!(data["type"], event.event, "an event is named as its type");
            }
            let words = pieces(&events, "/delta/text");
            assert!(words.len() > 1, "{words:?}");
            assert_eq!(words.concat(), whole["content"][0]["text"]);
            let refund = &events
                .iter()
                .find(|(_, data)| data["content_block"]["id"] == "toolu_2")
                .unwrap()
                .1;
            assert_eq!(refund["content_block"]["input"], json!({}));
            let index = refund["index"].clone();
            let input: Vec<&str> = events
                .iter()
                .filter(|(_, data)| data["index"] == index)
                .filter_map(|(_, data)| data["delta"]["partial_json"].as_str())
                .collect();
            assert!(input.len() > 1, "{input:?}");
            let input: Value = serde_json::from_str(&input.concat()).unwrap();
            assert_eq!(input, whole["content"][2]["input"]);
            let stop = &events[events.len() - 2].1;
            assert_eq!(stop["delta"]["stop_reason"], "tool_use");

            let events = post_stream(base, "/chat/completions", &answered).await;
            let (done, chunks) = events.split_last().unwrap();
            assert_eq!(done.0.data, "[DONE]");
            assert_eq!(chunks[0].1["choices"][0]["delta"]["role"], "assistant");
            let words = pieces(chunks, "/choices/0/delta/content");
            assert_eq!(words.concat(), REFUND_ANSWER);
            assert!(words.len() > 1, "{words:?}");
            let (usage, chunks) = chunks.split_last().unwrap();
            assert_eq!(usage.1["choices"], json!([]));
            assert_eq!(usage.1["usage"]["completion_tokens"], 10);
            let finish = &chunks.last().unwrap().1["choices"][0]["finish_reason"];
            assert_eq!(finish, "stop");
        }

        kept.cut_next_stream(1);
        let cut = post_stream(&kept.base_url, "/v1/messages", &asking).await;
        assert_eq!(cut.last().unwrap().1["delta"]["type"], "text_delta");
        assert_eq!(pieces(&cut, "/delta/text").len(), 1);
        let again = post_stream(&kept.base_url, "/v1/messages", &asking).await;
        assert_eq!(
            again.last().unwrap().0.event,
            "message_stop",
            "one cut only"
        );
        kept.cut_next_stream(1);
        let cut = post_stream(&kept.base_url, "/chat/completions", &answered).await;
        let last = &cut.last().unwrap().1["choices"][0]["delta"]["content"];
        assert_eq!(last, "All ");
    }

    #[tokio::test]
    async fn a_test_s_answer_is_streamed_if_it_is_a_message_and_goes_as_it_is_if_not() {
        let model = FakeModel::start(|request: &Value| match turn(request) {
            0 => openai_answer(
                None,
                &[(
                    "call_1",
                    "issue_refund",
                    json!({"order_id": "A-1001", "amount": 5}),
                )],
            ),
            _ => json!({"not": "an answer"}),
        })
        .await;
        let asking = json!({"model": "fake", "messages": [{"role": "user", "content": "Hi."}]});
        let events = post_stream(&model.base_url, "/chat/completions", &asking).await;
        assert!(events[0].1["choices"][0]["delta"]["content"].is_null());
        let calls: Vec<&Value> = events
            .iter()
            .filter_map(|(_, data)| data["choices"][0]["delta"]["tool_calls"].get(0))
            .collect();
        assert_eq!(calls[0]["id"], "call_1");
        assert_eq!(calls[0]["function"]["name"], "issue_refund");
        assert!(calls[1..].iter().all(|call| call.get("id").is_none()));
        let arguments: Vec<&str> = calls
            .iter()
            .map(|call| call["function"]["arguments"].as_str().unwrap())
            .collect();
        assert!(arguments.len() > 1);
        assert_eq!(arguments.concat(), r#"{"amount":5,"order_id":"A-1001"}"#);
        // The finish reason, the usage, `[DONE]`.
        let finish = &events[events.len() - 3].1["choices"][0]["finish_reason"];
        assert_eq!(finish, "tool_calls");

        let answered = json!({"model": "fake", "stream": true, "messages": [
            {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "?"}]});
        let plain = post(&model.base_url, "/chat/completions", &answered).await;
        assert_eq!(plain, json!({"not": "an answer"}));
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
