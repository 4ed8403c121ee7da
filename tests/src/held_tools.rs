//! A refunds service (the demo agent's `get_order` and `issue_refund`, at the same paths) whose
//! answers on the paths it holds wait until the test lets them go: a call stays in flight for
//! as long as a test needs to kill its worker or cancel its run meanwhile. It logs every
//! request it receives, which is how a test counts what a tool was really sent.

use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// One request as the service received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    /// Its `Idempotency-Key`: `{run}:{turn}:{call}`.
    pub key: String,
    pub body: Value,
}

impl Received {
    /// The call id its idempotency key names.
    pub fn call_id(&self) -> &str {
        self.key.rsplit(':').next().unwrap_or_default()
    }
}

#[derive(Clone)]
struct Shared {
    held: Arc<Vec<String>>,
    log: Arc<Mutex<Vec<Received>>>,
    open: watch::Receiver<bool>,
}

pub struct HeldTools {
    pub base_url: String,
    log: Arc<Mutex<Vec<Received>>>,
    open: watch::Sender<bool>,
}

impl HeldTools {
    /// Serves on a port of its own; requests to `held` paths wait for [`HeldTools::release`].
    pub async fn start(held: &[&str]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let (open, opened) = watch::channel(false);
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            held: Arc::new(held.iter().map(std::string::ToString::to_string).collect()),
            log: log.clone(),
            open: opened,
        };
        let app = Router::new()
            .route("/orders/lookup", post(answer))
            .route("/refunds", post(answer))
            .with_state(shared);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            base_url,
            log,
            open,
        }
    }

    /// Lets every held request and every later one answer at once.
    pub fn release(&self) {
        self.open.send_replace(true);
    }

    /// The requests `path` received, in order.
    pub fn received(&self, path: &str) -> Vec<Received> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|r| r.path == path).cloned().collect()
    }
}

async fn answer(
    State(shared): State<Shared>,
    uri: Uri,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Json<Value> {
    let path = uri.path().to_string();
    let key = headers
        .get("idempotency-key")
        .and_then(|k| k.to_str().ok())
        .unwrap_or_default()
        .to_string();
    shared.log.lock().unwrap().push(Received {
        path: path.clone(),
        key,
        body: body.clone(),
    });
    if shared.held.contains(&path) {
        let mut open = shared.open.clone();
        // The sender lives as long as the test's `HeldTools`; a test that ended answers nobody.
        let _ = open.wait_for(|open| *open).await;
    }
    Json(match path.as_str() {
        "/refunds" => json!({"refunded": body["amount"], "order_id": body["order_id"]}),
        _ => json!({"order_id": body["order_id"], "status": "delivered", "amount": 15.5}),
    })
}
