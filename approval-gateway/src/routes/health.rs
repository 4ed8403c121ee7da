//! Readiness: touches Redis and NATS for real.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(health))
}

async fn health(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    state.store.ping().await?;
    state
        .bus
        .client
        .flush()
        .await
        .map_err(ApiError::unavailable)?;
    Ok(Json(json!({"status": "ok"})))
}
