//! `POST /v1/agents/{agent}/replay` `{candidate, since?}` (admin): what a candidate version of
//! an agent's file would have done to its recorded calls and would do to those waiting now
//! (see [`crate::replay`]). It reads, never writes.

use crate::auth::{Authenticated, Permission};
use crate::error::ApiError;
use crate::replay::{self, Replayed};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use countersign_model::span::Span;
use serde::Deserialize;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/v1/agents/{agent}/replay", post(replay_agent))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    /// The candidate agent file, whole.
    candidate: String,
    /// How far back (`7d`, `24h`); default 7 days.
    since: Option<Span>,
}

/// The longest window a replay reads: what the `AUDIT` stream keeps at most.
const MAX_WINDOW_SECS: u64 = 90 * 86_400;

async fn replay_agent(
    State(state): State<AppState>,
    Path(agent): Path<String>,
    Authenticated { caller, body, .. }: Authenticated<ReplayBody>,
) -> Result<Json<Replayed>, ApiError> {
    caller.require(Permission::Administer)?;
    let window = body
        .since
        .map_or(std::time::Duration::from_secs(7 * 86_400), |s| s.duration);
    if window.as_secs() > MAX_WINDOW_SECS || window.is_zero() {
        return Err(ApiError::bad_request(
            "since must be more than nothing and at most 90d",
        ));
    }
    Ok(Json(
        replay::replay(&state, &agent, &body.candidate, window).await?,
    ))
}
