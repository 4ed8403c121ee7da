//! The worker's probes on a small HTTP server of their own: `/livez` (the process answers)
//! and `/readyz` (Redis, NATS and every stream answer, and the worker pulls from its shared
//! consumers, as [`countersign_runtime::health`] checks them), and `/metrics`, the worker's
//! metrics in Prometheus's text format, unless it is served on an address of its own (see
//! [`countersign_runtime::metrics_http`]).

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Json;
use axum::routing::get;
use countersign_runtime::bus::Bus;
use countersign_runtime::health::{Consumers, Readiness};
use countersign_store::WorkerStore;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
struct Probes {
    store: WorkerStore,
    bus: Bus,
    consumers: Consumers,
}

/// Serves the probes, and `metrics` when given, on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: TcpListener,
    store: WorkerStore,
    bus: Bus,
    consumers: Consumers,
    metrics: Option<Router>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/livez", get(live))
        .route("/readyz", get(ready))
        .with_state(Probes {
            store,
            bus,
            consumers,
        })
        .merge(metrics.unwrap_or_default());
    tracing::info!(addr = %listener.local_addr()?, "health probes listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn live() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn ready(State(probes): State<Probes>) -> (StatusCode, Json<Value>) {
    let readiness = Readiness::check(probes.store.ping(), &probes.bus, &probes.consumers).await;
    let status = StatusCode::from_u16(readiness.status()).expect("200 or 503");
    (status, Json(readiness.body()))
}
