//! The demo's orders and refunds service: the refund agent's tools. It honours
//! `Idempotency-Key` (a repeated key answers the first answer and refunds nothing more) and
//! counts what it receives per key, which is how the tests prove a refund ran exactly once.
//!
//! Served [`Countersigned`], it checks receipts as a tool author would: a refund over
//! [`REFUND_LIMIT`] (what the demo policy sends to a person) runs only with a valid
//! countersignature receipt for exactly that refund, and any receipt a smaller one carries
//! must be valid too; otherwise it answers 401 and refunds nothing.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use countersign_receipt::{Claims, Jwks, RECEIPT_HEADER, Refresh, SeenJtis, Verifier};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

#[derive(Default)]
struct Ledger {
    /// Requests received per (path, idempotency key).
    received: HashMap<(String, String), u32>,
    /// The first answer per (path, idempotency key), replayed for repeats.
    answers: HashMap<(String, String), Value>,
    /// Refunds applied, in order.
    refunds: Vec<Value>,
    /// The receipts refunds ran with, in order.
    receipts: Vec<Claims>,
    /// Refunds refused for their receipt, by refusal code.
    refused: Vec<String>,
    /// Requests that came with a receipt, per path.
    carrying_receipts: HashMap<String, u32>,
}

/// The largest refund the demo runs without a person's countersignature, as the demo
/// agent's policy has it.
pub const REFUND_LIMIT: f64 = 20.0;

/// Where the refunds service checks receipts against: the gateway's JWK Set
/// (`GET /.well-known/jwks.json`) and the issuer it signs as.
pub struct Countersigned {
    pub jwks_url: String,
    pub issuer: String,
}

#[derive(Clone)]
struct Service {
    ledger: Arc<Mutex<Ledger>>,
    verifier: Option<Arc<Verifier>>,
}

/// A running demo tools service.
#[derive(Clone)]
pub struct DemoTools {
    pub base_url: String,
    ledger: Arc<Mutex<Ledger>>,
}

impl DemoTools {
    /// Serves on `listener` until the process ends, checking no receipt.
    pub fn serve(listener: TcpListener) -> std::io::Result<Self> {
        Self::serve_watched(listener, None).map(|(tools, _)| tools)
    }

    /// Serves on `listener`, checking refunds' receipts against `countersigned`.
    pub fn serve_countersigned(
        listener: TcpListener,
        countersigned: Countersigned,
    ) -> std::io::Result<Self> {
        Self::serve_watched(listener, Some(countersigned)).map(|(tools, _)| tools)
    }

    /// Like [`DemoTools::serve`], with the server's task, which ends only if it fails.
    pub fn serve_watched(
        listener: TcpListener,
        countersigned: Option<Countersigned>,
    ) -> std::io::Result<(Self, JoinHandle<std::io::Result<()>>)> {
        let base_url = format!("http://{}", listener.local_addr()?);
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let verifier = countersigned.map(|c| {
            let keys = Jwks::from_url(c.jwks_url, Refresh::default());
            // The agent's tools name themselves by their tool names (no `audience` set).
            Arc::new(Verifier::new(
                keys,
                c.issuer,
                "issue_refund",
                SeenJtis::default(),
            ))
        });
        let app = Router::new()
            .route("/orders/lookup", post(lookup))
            .route("/refunds", post(refund))
            .with_state(Service {
                ledger: ledger.clone(),
                verifier,
            });
        let task = tokio::spawn(async move { axum::serve(listener, app).await });
        Ok((Self { base_url, ledger }, task))
    }

    /// The receipts refunds ran with, in order.
    pub fn receipts(&self) -> Vec<Claims> {
        self.ledger.lock().unwrap().receipts.clone()
    }

    /// How many requests `path` received with a receipt.
    pub fn carrying_receipts(&self, path: &str) -> u32 {
        let ledger = self.ledger.lock().unwrap();
        ledger.carrying_receipts.get(path).copied().unwrap_or(0)
    }

    /// The codes of the receipt refusals the refunds service answered, in order.
    pub fn refused(&self) -> Vec<String> {
        self.ledger.lock().unwrap().refused.clone()
    }

    /// How many requests `path` received with this idempotency key.
    pub fn received(&self, path: &str, key: &str) -> u32 {
        let ledger = self.ledger.lock().unwrap();
        ledger
            .received
            .get(&(path.to_string(), key.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Requests `path` received, per idempotency key.
    pub fn received_by_key(&self, path: &str) -> HashMap<String, u32> {
        let ledger = self.ledger.lock().unwrap();
        ledger
            .received
            .iter()
            .filter(|((p, _), _)| p == path)
            .map(|((_, k), n)| (k.clone(), *n))
            .collect()
    }

    /// Refunds applied (each once per idempotency key), in order.
    pub fn refunds(&self) -> Vec<Value> {
        self.ledger.lock().unwrap().refunds.clone()
    }
}

fn orders() -> HashMap<&'static str, Value> {
    HashMap::from([
        (
            "A-1001",
            json!({"order_id": "A-1001", "status": "delivered", "amount": 129.0,
                   "payments": [{"method": "card", "amount": 129.0}],
                   "note": "customer reports the item arrived broken"}),
        ),
        (
            "A-1002",
            json!({"order_id": "A-1002", "status": "delivered", "amount": 15.5,
                   "payments": [{"method": "card", "amount": 15.5}]}),
        ),
    ])
}

type Answer = (StatusCode, Json<Value>);

/// Counts the request and replays the first answer for a repeated key.
fn once(
    ledger: &Mutex<Ledger>,
    path: &str,
    headers: &HeaderMap,
    apply: impl FnOnce(&mut Ledger) -> Answer,
) -> Answer {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut ledger = ledger.lock().unwrap();
    if headers.contains_key(RECEIPT_HEADER) {
        *ledger
            .carrying_receipts
            .entry(path.to_string())
            .or_default() += 1;
    }
    let slot = (path.to_string(), key);
    *ledger.received.entry(slot.clone()).or_default() += 1;
    if let Some(answer) = ledger.answers.get(&slot) {
        return (StatusCode::OK, Json(answer.clone()));
    }
    let (status, Json(body)) = apply(&mut ledger);
    if status.is_success() && !slot.1.is_empty() {
        ledger.answers.insert(slot, body.clone());
    }
    (status, Json(body))
}

async fn lookup(
    State(service): State<Service>,
    headers: HeaderMap,
    Json(input): Json<Value>,
) -> Answer {
    once(&service.ledger, "/orders/lookup", &headers, |_| {
        let id = input["order_id"].as_str().unwrap_or_default();
        match orders().remove(id) {
            Some(order) => (StatusCode::OK, Json(order)),
            None => (
                StatusCode::NOT_FOUND,
                Json(json!({"error": format!("no order {id}")})),
            ),
        }
    })
}

async fn refund(State(service): State<Service>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(input) = serde_json::from_slice::<Value>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "the body is not JSON"})),
        )
            .into_response();
    };
    let mut receipt = None;
    if let Some(verifier) = &service.verifier {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let needed = input["amount"].as_f64().is_none_or(|a| a > REFUND_LIMIT);
        if needed || header(RECEIPT_HEADER).is_some() {
            let checked = verifier
                .check(
                    header(RECEIPT_HEADER),
                    "issue_refund",
                    header("idempotency-key"),
                    &body,
                )
                .await;
            match checked {
                Ok(checked) => receipt = Some(checked.claims),
                Err(refusal) => {
                    let mut ledger = service.ledger.lock().unwrap();
                    ledger.refused.push(refusal.code().to_string());
                    return countersign_receipt::refused(&refusal);
                }
            }
        }
    }
    once(&service.ledger, "/refunds", &headers, |ledger| {
        let refund = json!({
            "refund_id": format!("rf_{}", ledger.refunds.len() + 1),
            "order_id": input["order_id"],
            "amount": input["amount"],
            "status": "refunded",
        });
        ledger.refunds.push(refund.clone());
        ledger.receipts.extend(receipt);
        (StatusCode::OK, Json(refund))
    })
    .into_response()
}
