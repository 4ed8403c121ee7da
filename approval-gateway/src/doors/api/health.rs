//! Probes, no key needed. `/livez`: the process answers (it touches nothing, so a restart is
//! not ordered because Redis or NATS is away). `/readyz`: Redis, NATS and every stream answer
//! for real and the deliveries' work loop pulls from its consumers (see
//! [`countersign_runtime::health`]); `/healthz` is the same, kept for callers that know it.
//! (`/metrics` is [`countersign_runtime::metrics_http`]'s.)

use crate::state::AppState;
use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use countersign_runtime::health::Readiness;
use serde_json::{Value, json};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/livez", get(live))
        .route("/readyz", get(ready))
        .route("/healthz", get(ready))
}

async fn live() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let readiness = Readiness::check(state.store.ping(), &state.bus, &state.consumers).await;
    let status = StatusCode::from_u16(readiness.status()).expect("200 or 503");
    (status, Json(readiness.body()))
}
