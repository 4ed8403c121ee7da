//! The third parties of the refund scenario, lean so their cost does not blur the figures:
//! the fake model playing the refund conversation, keeping no request, and the
//! orders/refunds tools service, which counts every request per `Idempotency-Key`.
//!
//! They run on their own Tokio runtime whose threads are named `fakes`, so their CPU time is
//! read apart from the load generator's (see [`crate::measure::own_threads_ticks`]).
//! `countersign-local`'s demo tools keep every answer; that cost does not belong in a
//! benchmark, so the tools service is written here. The same server takes the services'
//! spans when they export them (`--otlp`), answering as an OTLP/HTTP collector does.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use countersign_fake_model::{FakeModel, REFUND_SCRIPT};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The name prefix of the fake servers' threads.
pub const THREADS: &str = "fakes";

/// What the tools service received for one run.
#[derive(Clone, Debug, Default)]
pub struct RunCalls {
    /// `get_order` requests.
    pub lookups: u32,
    /// `issue_refund` requests per call id (the part of the key after `run_id:`).
    pub refunds: HashMap<String, u32>,
}

impl RunCalls {
    pub fn refund_requests(&self) -> u32 {
        self.refunds.values().sum()
    }
}

type Ledger = Arc<Mutex<HashMap<String, RunCalls>>>;

/// The running fakes. They stop when the process ends.
pub struct Fakes {
    pub model_url: String,
    pub tools_url: String,
    ledger: Ledger,
}

impl Fakes {
    /// Starts both servers on loopback ports of their own, on a runtime of `threads` threads.
    pub fn start(threads: usize) -> anyhow::Result<Self> {
        let model = std::net::TcpListener::bind("127.0.0.1:0")?;
        let tools = std::net::TcpListener::bind("127.0.0.1:0")?;
        model.set_nonblocking(true)?;
        tools.set_nonblocking(true)?;
        let model_url = format!("http://{}", model.local_addr()?);
        let tools_url = format!("http://{}", tools.local_addr()?);
        let ledger = Ledger::default();

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name(THREADS)
            .enable_all()
            .build()?;
        let tools_app = Router::new()
            .route("/orders/lookup", post(lookup))
            .route("/refunds", post(refund))
            .route("/v1/traces", post(traces))
            .with_state(ledger.clone());
        std::thread::Builder::new()
            .name(THREADS.into())
            .spawn(move || {
                runtime.block_on(async move {
                    let model = tokio::net::TcpListener::from_std(model).expect("model listener");
                    let tools = tokio::net::TcpListener::from_std(tools).expect("tools listener");
                    let served = tokio::try_join!(
                        FakeModel::serve_unrecorded(model, &*REFUND_SCRIPT),
                        axum::serve(tools, tools_app).into_future(),
                    );
                    if let Err(e) = served {
                        eprintln!("the fake model or tools server stopped: {e}");
                    }
                });
            })?;
        Ok(Self {
            model_url,
            tools_url,
            ledger,
        })
    }

    /// What the tools service received for `run_id` so far.
    pub fn calls(&self, run_id: &str) -> RunCalls {
        self.ledger
            .lock()
            .unwrap()
            .get(run_id)
            .cloned()
            .unwrap_or_default()
    }
}

/// An OTLP/HTTP export of spans, taken and dropped: an empty `ExportTraceServiceResponse`
/// (no rejected spans) in protobuf.
async fn traces() -> (StatusCode, [(&'static str, &'static str); 1]) {
    (StatusCode::OK, [("content-type", "application/x-protobuf")])
}

/// `run_id` and `call_id` of an `Idempotency-Key: run_id:turn:call_id` header.
fn key_of(headers: &HeaderMap) -> Option<(String, String)> {
    let key = headers.get("idempotency-key")?.to_str().ok()?;
    let (run, rest) = key.split_once(':')?;
    let (_turn, call) = rest.split_once(':')?;
    Some((run.to_string(), call.to_string()))
}

async fn lookup(State(ledger): State<Ledger>, headers: HeaderMap) -> (StatusCode, Json<Value>) {
    let Some((run, _)) = key_of(&headers) else {
        return missing_key();
    };
    ledger.lock().unwrap().entry(run).or_default().lookups += 1;
    (
        StatusCode::OK,
        Json(
            json!({"order_id": "A-1001", "status": "delivered", "amount": 129.0,
                    "payments": [{"method": "card", "amount": 129.0}],
                    "note": "customer reports the item arrived broken"}),
        ),
    )
}

/// Every request is counted; the benchmark fails a run whose refund was requested other
/// than exactly once (the tool is not declared idempotent, so even a repeat is a fault).
async fn refund(State(ledger): State<Ledger>, headers: HeaderMap) -> (StatusCode, Json<Value>) {
    let Some((run, call)) = key_of(&headers) else {
        return missing_key();
    };
    *ledger
        .lock()
        .unwrap()
        .entry(run)
        .or_default()
        .refunds
        .entry(call)
        .or_default() += 1;
    (
        StatusCode::OK,
        Json(json!({"refund_id": "rf_bench", "status": "refunded", "amount": 129.0})),
    )
}

fn missing_key() -> (StatusCode, Json<Value>) {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": "Idempotency-Key run_id:turn:call_id is required"})),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idempotency_key_names_the_run_and_the_call() {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", "run_01:1:toolu_2".parse().unwrap());
        assert_eq!(
            key_of(&headers),
            Some(("run_01".to_string(), "toolu_2".to_string()))
        );
        assert_eq!(key_of(&HeaderMap::new()), None);
    }
}
