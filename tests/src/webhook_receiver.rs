//! A local webhook endpoint: records every request (headers and raw body) and answers 500
//! to the first `fail_first` requests, to exercise retries.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug)]
pub struct Received {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
    pub body: Vec<u8>,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Clone)]
pub struct WebhookReceiver {
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl WebhookReceiver {
    pub async fn start(fail_first: usize) -> Self {
        let received = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(AtomicUsize::new(fail_first));
        let app = Router::new()
            .route("/hook", post(receive))
            .with_state((received.clone(), failures));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, received }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Requests whose body has this `type`.
    pub fn of_type(&self, event_type: &str) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.json()["type"] == event_type)
            .collect()
    }
}

type ReceiverState = (Arc<Mutex<Vec<Received>>>, Arc<AtomicUsize>);

async fn receive(
    State((received, failures)): State<ReceiverState>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    received.lock().unwrap().push(Received {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body: body.to_vec(),
    });
    let failing = failures
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if failing {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::NO_CONTENT
    }
}
