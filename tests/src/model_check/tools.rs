//! The model check's tools service: `POST /lookup` and `POST /refunds`, each answered after a
//! delay the test sets (so kills and cancels land while a call is in flight), each request
//! logged as it arrives with its idempotency key, body, instant and sender.

use super::observe::ToolRequest;
use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Shared {
    log: Mutex<Vec<ToolRequest>>,
    delay_ms: AtomicU64,
    /// Requests received and not answered yet, by sender.
    in_flight: Mutex<Vec<SocketAddr>>,
}

/// A running tools service; it stops with its runtime.
#[derive(Clone)]
pub struct Tools {
    pub base_url: String,
    shared: Arc<Shared>,
}

impl Tools {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/lookup", post(lookup))
            .route("/refunds", post(refund))
            .with_state(shared.clone());
        tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
        });
        Self { base_url, shared }
    }

    /// Every answer waits this long.
    pub fn set_delay(&self, delay: Duration) {
        let ms = delay.as_millis() as u64;
        self.shared.delay_ms.store(ms, Ordering::Relaxed);
    }

    /// Every request received so far, in order of arrival.
    pub fn requests(&self) -> Vec<ToolRequest> {
        self.shared.log.lock().unwrap().clone()
    }

    /// The sender of a request being handled now, if any.
    pub fn in_flight(&self) -> Option<SocketAddr> {
        self.shared.in_flight.lock().unwrap().first().copied()
    }
}

async fn lookup(
    state: State<Arc<Shared>>,
    peer: ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> axum::Json<Value> {
    let order = body["order_id"].clone();
    answer(
        state,
        peer,
        headers,
        "/lookup",
        body,
        json!({"order_id": order, "status": "delivered", "paid": 450}),
    )
    .await
}

async fn refund(
    state: State<Arc<Shared>>,
    peer: ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> axum::Json<Value> {
    let amount = body["amount"].clone();
    answer(
        state,
        peer,
        headers,
        "/refunds",
        body,
        json!({"refunded": amount}),
    )
    .await
}

async fn answer(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    path: &str,
    axum::Json(body): axum::Json<Value>,
    reply: Value,
) -> axum::Json<Value> {
    let key = headers
        .get("idempotency-key")
        .and_then(|k| k.to_str().ok())
        .unwrap_or_default()
        .to_string();
    shared.log.lock().unwrap().push(ToolRequest {
        path: path.into(),
        key,
        body,
        at: Instant::now(),
    });
    shared.in_flight.lock().unwrap().push(peer);
    let delay = shared.delay_ms.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    let mut in_flight = shared.in_flight.lock().unwrap();
    if let Some(i) = in_flight.iter().position(|p| *p == peer) {
        in_flight.remove(i);
    }
    axum::Json(reply)
}
