//! `DELETE /v1/people/{principal}/sessions`: an admin ends every inbox session of a person
//! (a lost laptop, someone leaving), whatever signed them in. Sessions the configuration no
//! longer grants end by themselves at their next request (`crate::pages::session`).

use crate::auth::{Caller, Permission};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::routing::delete;
use axum::{Json, Router};
use serde_json::{Value, json};

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/v1/people/{principal}/sessions", delete(end_sessions))
}

async fn end_sessions(
    State(state): State<AppState>,
    caller: Caller,
    Path(principal): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Administer)?;
    let ended = state.store.end_sessions_of(&principal).await?;
    tracing::info!(%principal, ended, by = %caller.principal, "sessions ended by an admin");
    Ok(Json(json!({"principal": principal, "ended": ended})))
}
