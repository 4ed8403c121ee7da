//! Probes, no key needed. `/livez`: the process answers (it touches nothing, so a restart is
//! not ordered because Redis or NATS is away). `/readyz`: Redis, NATS and every stream answer
//! for real and the notifier pulls from its consumers (see [`countersign_shared::health`]); `/healthz` is the same, kept for callers
//! that know it. `/metrics`: the gateway's metrics in Prometheus's text format (see
//! [`countersign_shared::metrics`]).

use crate::state::AppState;
use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use countersign_shared::health::Readiness;
use countersign_shared::metrics::Metrics;
use serde_json::{Value, json};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/livez", get(live))
        .route("/readyz", get(ready))
        .route("/healthz", get(ready))
        .route("/metrics", get(metrics))
}

async fn metrics(State(state): State<AppState>) -> impl axum::response::IntoResponse {
    let metrics = state.store.metrics();
    ([(CONTENT_TYPE, Metrics::CONTENT_TYPE)], metrics.encode())
}

async fn live() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let readiness = Readiness::check(&state.store, &state.bus, &state.consumers).await;
    let status = StatusCode::from_u16(readiness.status()).expect("200 or 503");
    (status, Json(readiness.body()))
}
