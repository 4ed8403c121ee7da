//! The demo's orders and refunds service: the refund agent's tools. It honours
//! `Idempotency-Key` (a repeated key answers the first answer and refunds nothing more) and
//! counts what it receives per key, which is how the tests prove a refund ran exactly once.
//!
//! Served [`Countersigned`], it checks receipts as a tool author would: a refund over
//! [`REFUND_LIMIT`](crate::demo_ledger::REFUND_LIMIT) (what the demo policy sends to a
//! person) runs only with a valid countersignature receipt for exactly that refund, and any
//! receipt a smaller one carries must be valid too; otherwise it answers 401 and refunds
//! nothing. It remembers the
//! receipts it ran in a file ([`FileJtis`], `receipts-run.jsonl` in the runner's data
//! folder), so a receipt stays spent after the service restarts; its answers it keeps in
//! memory only, so a receipt that comes again after a restart, even under its own key, is
//! refused (`reused`) rather than answered: a restart forgot what it answered.
//!
//! The same tools are MCP tools at `/mcp` ([`crate::demo_mcp`]), answered by the same code
//! from the same ledger ([`crate::demo_ledger`]); there a refused receipt is an error result
//! naming the refusal.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use countersign_receipt::{Claims, FileJtis, Jwks, RECEIPT_HEADER, Refresh, Verifier};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::demo_ledger::{DemoVerifier, Outcome, Request, Service};
use crate::demo_mcp;

/// Where the refunds service checks receipts against: the gateway's JWK Set
/// (`GET /.well-known/jwks.json`) and the issuer it signs as.
pub struct Countersigned {
    /// The gateway's JWK Set URL.
    pub jwks_url: String,
    /// The issuer the gateway signs receipts as (its public base URL).
    pub issuer: String,
    /// Where the receipts it ran are remembered ([`FileJtis`]): kept across restarts.
    pub jtis_file: PathBuf,
}

/// A running demo tools service.
#[derive(Clone)]
pub struct DemoTools {
    /// Where the service is reached, `http://127.0.0.1:PORT`.
    pub base_url: String,
    service: Service,
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
        let verifier = countersigned
            .map(|c| -> std::io::Result<_> {
                let keys = Jwks::from_url(c.jwks_url, Refresh::default());
                let jtis = FileJtis::open(&c.jtis_file)?;
                // The agent's tools name themselves by their tool names (no `audience` set).
                Ok(Arc::new(Verifier::new(
                    keys,
                    c.issuer,
                    "issue_refund",
                    jtis,
                )))
            })
            .transpose()?;
        let service = Service::new(verifier);
        let app = Router::new()
            .route("/orders/lookup", post(lookup))
            .route("/refunds", post(refund))
            .with_state(service.clone())
            .nest_service("/mcp", demo_mcp::service(service.clone()));
        let task = tokio::spawn(async move { axum::serve(listener, app).await });
        Ok((Self { base_url, service }, task))
    }

    /// The MCP endpoint (Streamable HTTP) serving the same tools.
    pub fn mcp_url(&self) -> String {
        format!("{}/mcp", self.base_url)
    }

    /// The receipts refunds ran with, in order.
    pub fn receipts(&self) -> Vec<Claims> {
        self.service.ledger().receipts.clone()
    }

    /// How many requests `path` received with a receipt. Here and below `path` is the HTTP
    /// path, or for MCP calls `mcp:` and the tool's name (`mcp:issue_refund`).
    pub fn carrying_receipts(&self, path: &str) -> u32 {
        let ledger = self.service.ledger();
        ledger.carrying_receipts.get(path).copied().unwrap_or(0)
    }

    /// The codes of the receipt refusals the refunds service answered, in order.
    pub fn refused(&self) -> Vec<String> {
        self.service.ledger().refused.clone()
    }

    /// How many requests `path` received with this idempotency key.
    pub fn received(&self, path: &str, key: &str) -> u32 {
        let ledger = self.service.ledger();
        ledger
            .received
            .get(&(path.to_string(), key.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Requests `path` received, per idempotency key.
    pub fn received_by_key(&self, path: &str) -> HashMap<String, u32> {
        let ledger = self.service.ledger();
        ledger
            .received
            .iter()
            .filter(|((p, _), _)| p == path)
            .map(|((_, k), n)| (k.clone(), *n))
            .collect()
    }

    /// Refunds applied (each once per idempotency key), in order.
    pub fn refunds(&self) -> Vec<Value> {
        self.service.ledger().refunds.clone()
    }
}

/// A request as HTTP carries it: the idempotency key and receipt in headers.
fn http_request<'a>(path: &'a str, headers: &'a HeaderMap) -> Request<'a> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    Request {
        path,
        idempotency_key: header("idempotency-key"),
        receipt: header(RECEIPT_HEADER),
    }
}

/// An outcome as HTTP answers it.
fn http_answer(outcome: Outcome) -> Response {
    match outcome {
        Outcome::Done(answer) => (StatusCode::OK, Json(answer)).into_response(),
        Outcome::NotFound(error) => {
            (StatusCode::NOT_FOUND, Json(json!({"error": error}))).into_response()
        }
        Outcome::Refused(refusal) => countersign_receipt::refused(&refusal),
    }
}

async fn lookup(
    State(service): State<Service>,
    headers: HeaderMap,
    Json(input): Json<Value>,
) -> Response {
    http_answer(service.lookup(&http_request("/orders/lookup", &headers), &input))
}

async fn refund(State(service): State<Service>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(input) = serde_json::from_slice::<Value>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "the body is not JSON"})),
        )
            .into_response();
    };
    let request = http_request("/refunds", &headers);
    let (receipt, key) = (request.receipt, request.idempotency_key);
    // The receipt signs the body exactly as it came.
    let check = move |verifier: Arc<DemoVerifier>| async move {
        verifier.check(receipt, "issue_refund", key, &body).await
    };
    http_answer(service.refund(&request, &input, check).await)
}
