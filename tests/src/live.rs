//! A client of a run's live events (`GET /v1/runs/{id}/events`), reading the server-sent
//! events with the same decoder the CLI uses.

use crate::app::{PATIENCE, TestApp};
use countersign_model::sse::Decoder;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;
use std::collections::VecDeque;

/// One event as received: its `id` (none for a `stream.cut`), type and data.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    pub id: Option<u64>,
    pub kind: String,
    pub data: Value,
}

pub struct LiveEvents {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    decoder: Decoder,
    ready: VecDeque<Received>,
    /// Comment lines received so far: the gateway's heartbeats.
    pub comments: usize,
}

impl LiveEvents {
    /// Connects as `key`, after event `last_event_id` if given; the answer's status and, for a
    /// 200, the events.
    pub async fn open(
        app: &TestApp,
        run_id: &str,
        key: &str,
        last_event_id: Option<u64>,
    ) -> (StatusCode, Option<Self>) {
        Self::open_at(app, &app.gateway_url, run_id, key, last_event_id).await
    }

    /// As [`LiveEvents::open`], from the gateway at `base` (another of the app's).
    pub async fn open_at(
        app: &TestApp,
        base: &str,
        run_id: &str,
        key: &str,
        last_event_id: Option<u64>,
    ) -> (StatusCode, Option<Self>) {
        match Self::open_on(&app.http, base, run_id, key, last_event_id).await {
            Ok(events) => (StatusCode::OK, Some(events)),
            Err(response) => (response.status(), None),
        }
    }

    /// As [`LiveEvents::open_at`], with the client `http`; the answer itself unless it is 200.
    pub async fn open_on(
        http: &reqwest::Client,
        base: &str,
        run_id: &str,
        key: &str,
        last_event_id: Option<u64>,
    ) -> Result<Self, reqwest::Response> {
        let mut request = http
            .get(format!("{base}/v1/runs/{run_id}/events"))
            .bearer_auth(key);
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.expect("gateway reachable");
        if response.status() != StatusCode::OK {
            return Err(response);
        }
        let header = |name| response.headers()[name].to_str().unwrap();
        assert_eq!(header("content-type"), "text/event-stream");
        assert_eq!(header("cache-control"), "no-cache");
        assert_eq!(header("x-accel-buffering"), "no");
        Ok(Self {
            body: response.bytes_stream().boxed(),
            decoder: Decoder::default(),
            ready: VecDeque::new(),
            comments: 0,
        })
    }

    /// The next event; None when the server ended the stream. Panics after [`PATIENCE`].
    pub async fn next(&mut self) -> Option<Received> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            if !self.read().await {
                return None;
            }
        }
    }

    /// Reads until `n` comment lines have come in all, keeping the events that came with them.
    pub async fn until_comments(&mut self, n: usize) {
        while self.comments < n {
            assert!(
                self.read().await,
                "the stream ended after {} comments",
                self.comments
            );
        }
    }

    /// Reads one chunk; false when the server ended the stream.
    async fn read(&mut self) -> bool {
        let chunk = tokio::time::timeout(PATIENCE, self.body.next())
            .await
            .expect("a chunk within the patience");
        let Some(chunk) = chunk else {
            return false;
        };
        let chunk = chunk.expect("the stream reads");
        // Comments are whole lines starting with ':'; the gateway writes each in one piece.
        let text = String::from_utf8_lossy(&chunk);
        self.comments += text.lines().filter(|l| l.starts_with(':')).count();
        for event in self.decoder.push(&chunk) {
            self.ready.push_back(Received {
                id: event.id.as_deref().map(|id| id.parse().unwrap()),
                kind: event.event,
                data: serde_json::from_str(&event.data).unwrap(),
            });
        }
        true
    }

    /// Every event up to and including the first of type `kind`.
    pub async fn until(&mut self, kind: &str) -> Vec<Received> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            let found = event.kind == kind;
            events.push(event);
            if found {
                return events;
            }
        }
        panic!("the stream ended before a {kind} event: {events:#?}");
    }

    /// Every event until the server ends the stream.
    pub async fn to_end(&mut self) -> Vec<Received> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

/// The events' types in order, each run of `text.delta`s as one.
pub fn kinds(events: &[Received]) -> Vec<&str> {
    let mut kinds: Vec<&str> = Vec::new();
    for event in events {
        if event.kind == "text.delta" && kinds.last() == Some(&"text.delta") {
            continue;
        }
        kinds.push(&event.kind);
    }
    kinds
}

/// The text of turn `turn`'s deltas, joined.
pub fn text_of(events: &[Received], turn: u64) -> String {
    events
        .iter()
        .filter(|e| e.kind == "text.delta" && e.data["turn"] == turn)
        .map(|e| e.data["text"].as_str().unwrap())
        .collect()
}
