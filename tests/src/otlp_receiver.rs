//! A local OTLP/HTTP trace receiver: takes `POST /v1/traces` in protobuf, as a collector
//! does, and keeps every span it was sent.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use std::sync::{Arc, Mutex};

/// One span as received.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
}

#[derive(Clone)]
pub struct OtlpReceiver {
    /// The full endpoint URL, `/v1/traces` included.
    pub url: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, spans }
    }

    /// The names of every span received.
    pub fn names(&self) -> Vec<String> {
        let spans = self.spans.lock().unwrap();
        spans.iter().map(|s| s.name.clone()).collect()
    }

    /// The spans of one trace (`trace_id` in hex), in the order received.
    pub fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect()
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<ReceivedSpan>>>>, body: Bytes) -> StatusCode {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut spans = spans.lock().unwrap();
    let received = request
        .resource_spans
        .into_iter()
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans);
    for span in received {
        spans.push(ReceivedSpan {
            name: span.name,
            trace_id: hex::encode(span.trace_id),
            span_id: hex::encode(span.span_id),
            parent_span_id: hex::encode(span.parent_span_id),
        });
    }
    StatusCode::OK
}
