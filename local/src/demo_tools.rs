//! The demo's orders and refunds service: the refund agent's tools. It honours
//! `Idempotency-Key` (a repeated key answers the first answer and refunds nothing more) and
//! counts what it receives per key, which is how the tests prove a refund ran exactly once.
//!
//! Served [`Countersigned`], it checks receipts as a tool author would: a refund over
//! [`REFUND_LIMIT`] (what the demo policy sends to a person) runs only with a valid
//! countersignature receipt for exactly that refund, and any receipt a smaller one carries
//! must be valid too; otherwise it answers 401 and refunds nothing. It remembers the
//! receipts it ran in a file ([`FileReplay`], `receipts-run.jsonl` in the runner's data
//! folder), so a receipt stays spent after the service restarts; its answers it keeps in
//! memory only, so a receipt that comes again after a restart, even under its own key, is
//! refused (`replayed`) rather than answered: a restart forgot what it answered.
//!
//! The same tools are MCP tools at `/mcp` ([`crate::demo_mcp`]), answered by the same code
//! from the same ledger; there a refused receipt is an error result naming the refusal.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use countersign_receipt::{
    Checked, Claims, FileReplay, Jwks, RECEIPT_HEADER, Refresh, Refusal, Verifier,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::demo_mcp;

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
    /// Where the receipts it ran are remembered ([`FileReplay`]): kept across restarts.
    pub replay_file: PathBuf,
}

/// The verifier of the demo's refunds: receipts remembered in a file.
pub(crate) type DemoVerifier = Verifier<FileReplay>;

#[derive(Clone)]
pub(crate) struct Service {
    ledger: Arc<Mutex<Ledger>>,
    verifier: Option<Arc<DemoVerifier>>,
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
        let verifier = countersigned
            .map(|c| -> std::io::Result<_> {
                let keys = Jwks::from_url(c.jwks_url, Refresh::default());
                let replay = FileReplay::open(&c.replay_file)?;
                // The agent's tools name themselves by their tool names (no `audience` set).
                Ok(Arc::new(Verifier::new(
                    keys,
                    c.issuer,
                    "issue_refund",
                    replay,
                )))
            })
            .transpose()?;
        let service = Service {
            ledger: ledger.clone(),
            verifier,
        };
        let app = Router::new()
            .route("/orders/lookup", post(lookup))
            .route("/refunds", post(refund))
            .with_state(service.clone())
            .nest_service("/mcp", demo_mcp::service(service));
        let task = tokio::spawn(async move { axum::serve(listener, app).await });
        Ok((Self { base_url, ledger }, task))
    }

    /// The MCP endpoint (Streamable HTTP) serving the same tools.
    pub fn mcp_url(&self) -> String {
        format!("{}/mcp", self.base_url)
    }

    /// The receipts refunds ran with, in order.
    pub fn receipts(&self) -> Vec<Claims> {
        self.ledger.lock().unwrap().receipts.clone()
    }

    /// How many requests `path` received with a receipt. Here and below `path` is the HTTP
    /// path, or for MCP calls `mcp:` and the tool's name (`mcp:issue_refund`).
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

/// The demo's orders: one per README example, each with its amount and what went wrong (which
/// the scripted model reads to decide its refund).
fn orders() -> HashMap<&'static str, Value> {
    [
        ("A-1001", json!(129), "arrived broken"),
        ("A-1002", json!(15.5), "arrived late"),
        ("A-1003", json!(30), "the wrong size was sent"),
        ("A-1004", json!(45), "arrived late"),
        ("A-1005", json!(80), "arrived damaged"),
        ("A-1006", json!(60), "never arrived"),
    ]
    .into_iter()
    .map(|(id, amount, problem)| {
        let order = json!({"order_id": id, "status": "delivered", "amount": amount,
                           "payments": [{"method": "card", "amount": amount}],
                           "problem": problem});
        (id, order)
    })
    .collect()
}

/// A request as the ledger sees it, however it came (HTTP or MCP).
pub(crate) struct Request<'a> {
    /// The ledger's name for what was asked: the HTTP path, or `mcp:` and the tool's name.
    pub path: &'a str,
    pub idempotency_key: Option<&'a str>,
    pub receipt: Option<&'a str>,
}

/// What the service answers a request, before HTTP or MCP puts it in its own terms.
pub(crate) enum Outcome {
    /// The tool's answer; for a repeated idempotency key, the first one again.
    Done(Value),
    /// What was asked about does not exist.
    NotFound(String),
    /// The request's receipt was refused: nothing ran.
    Refused(Refusal),
}

impl Service {
    /// Counts the request and replays the first answer for a repeated key.
    fn once(&self, request: &Request, apply: impl FnOnce(&mut Ledger) -> Outcome) -> Outcome {
        let mut ledger = self.ledger.lock().unwrap();
        if request.receipt.is_some() {
            *ledger
                .carrying_receipts
                .entry(request.path.to_string())
                .or_default() += 1;
        }
        let key = request.idempotency_key.unwrap_or("").to_string();
        let slot = (request.path.to_string(), key);
        *ledger.received.entry(slot.clone()).or_default() += 1;
        if let Some(answer) = ledger.answers.get(&slot) {
            return Outcome::Done(answer.clone());
        }
        let outcome = apply(&mut ledger);
        if let Outcome::Done(answer) = &outcome
            && !slot.1.is_empty()
        {
            ledger.answers.insert(slot, answer.clone());
        }
        outcome
    }

    /// `get_order`: the order named by `input.order_id`.
    pub(crate) fn lookup(&self, request: &Request, input: &Value) -> Outcome {
        self.once(request, |_| {
            let id = input["order_id"].as_str().unwrap_or_default();
            match orders().remove(id) {
                Some(order) => Outcome::Done(order),
                None => Outcome::NotFound(format!("no order {id}")),
            }
        })
    }

    /// `issue_refund`: refunds `input.amount` for `input.order_id`. With a verifier, a refund
    /// over [`REFUND_LIMIT`], or one that carries a receipt, runs only if `check` (the
    /// verifier's check of the receipt against the request as it came) accepts it.
    pub(crate) async fn refund<F>(
        &self,
        request: &Request<'_>,
        input: &Value,
        check: impl FnOnce(Arc<DemoVerifier>) -> F,
    ) -> Outcome
    where
        F: Future<Output = Result<Checked, Refusal>>,
    {
        let mut receipt = None;
        let mut again = false;
        if let Some(verifier) = &self.verifier {
            let needed = input["amount"].as_f64().is_none_or(|a| a > REFUND_LIMIT);
            if needed || request.receipt.is_some() {
                match check(verifier.clone()).await {
                    Ok(checked) => {
                        again = checked.again;
                        receipt = Some(checked.claims);
                    }
                    Err(refusal) => {
                        let mut ledger = self.ledger.lock().unwrap();
                        ledger.refused.push(refusal.code().to_string());
                        return Outcome::Refused(refusal);
                    }
                }
            }
        }
        self.once(request, |ledger| {
            // A receipt run before whose answer this process does not hold (it restarted
            // since): answering would mean running it again.
            if again {
                ledger.refused.push(Refusal::Replayed.code().to_string());
                return Outcome::Refused(Refusal::Replayed);
            }
            let refund = json!({
                "refund_id": format!("rf_{}", ledger.refunds.len() + 1),
                "order_id": input["order_id"],
                "amount": input["amount"],
                "status": "refunded",
            });
            ledger.refunds.push(refund.clone());
            ledger.receipts.extend(receipt);
            Outcome::Done(refund)
        })
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
