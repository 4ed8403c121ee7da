//! A policy change tried before it ships (admin; both read, never write):
//! - `POST /v1/agents/{agent}/replay` `{candidate, since?}`: what a candidate version of an
//!   agent's file would have done to its recorded calls and would do to those waiting now
//!   (see [`crate::replay`]);
//! - `GET /v1/agents/{agent}/suggestions?since=&min_calls=&min_deciders=`: the changes the
//!   agent's own recorded decisions support, each replayed (see [`crate::suggest`]);
//! - `GET /v1/agents/{agent}/reviewer?since=`: how the agent's reviewer models agreed with its
//!   people (see [`crate::agreement`]);
//! - `POST /v1/agents/{agent}/reviewer/replay` `{since?, limit?}`: the same, the reviewer
//!   models asked now about the calls people settled (see [`crate::reviewer_replay`]): it
//!   asks the providers, and writes nothing.

use crate::agreement::{self, Agreement};
use crate::auth::{Authenticated, Caller, Permission, QueryParams};
use crate::error::ApiError;
use crate::replay::{self, Replayed};
use crate::reviewer_replay;
use crate::state::AppState;
use crate::suggest::{self, Suggested};
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use countersign_model::span::Span;
use countersign_model::suggest::Thresholds;
use serde::Deserialize;
use std::time::Duration;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/agents/{agent}/replay", post(replay_agent))
        .route("/v1/agents/{agent}/suggestions", get(suggestions))
        .route("/v1/agents/{agent}/reviewer", get(reviewer_agreement))
        .route(
            "/v1/agents/{agent}/reviewer/replay",
            post(reviewer_replayed),
        )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    /// The candidate agent file, whole.
    candidate: String,
    /// How far back (`7d`, `24h`); default 7 days.
    since: Option<Span>,
}

/// The longest window either reads: what the `AUDIT` stream keeps at most.
const MAX_WINDOW_SECS: u64 = 90 * 86_400;

/// The window `since` names, `default` if none; refused if empty or longer than the `AUDIT`
/// stream keeps.
fn window(since: Option<Span>, default: Duration) -> Result<Duration, ApiError> {
    let window = since.map_or(default, |s| s.duration);
    if window.as_secs() > MAX_WINDOW_SECS || window.is_zero() {
        return Err(ApiError::bad_request(
            "since must be more than nothing and at most 90d",
        ));
    }
    Ok(window)
}

async fn replay_agent(
    State(state): State<AppState>,
    Path(agent): Path<String>,
    Authenticated { caller, body, .. }: Authenticated<ReplayBody>,
) -> Result<Json<Replayed>, ApiError> {
    caller.require(Permission::Administer)?;
    let window = window(body.since, Duration::from_secs(7 * 86_400))?;
    Ok(Json(
        replay::replay(&state, &agent, &body.candidate, window).await?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SuggestQuery {
    /// How far back (`30d`, `24h`); default 30 days.
    since: Option<String>,
    /// Approvals within a bound a suggestion needs, at least; default 10.
    min_calls: Option<usize>,
    /// Distinct people among their approvers, at least; default 2.
    min_deciders: Option<usize>,
}

async fn suggestions(
    State(state): State<AppState>,
    Path(agent): Path<String>,
    caller: Caller,
    QueryParams(query): QueryParams<SuggestQuery>,
) -> Result<Json<Suggested>, ApiError> {
    caller.require(Permission::Administer)?;
    let window = queried_window(query.since)?;
    let thresholds = Thresholds {
        min_calls: query.min_calls.unwrap_or(10),
        min_deciders: query.min_deciders.unwrap_or(2),
    };
    if thresholds.min_calls == 0 || thresholds.min_deciders == 0 {
        return Err(ApiError::bad_request(
            "min_calls and min_deciders must be at least 1",
        ));
    }
    Ok(Json(
        suggest::suggest(&state, &agent, window, thresholds).await?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowQuery {
    /// How far back (`30d`, `24h`); default 30 days.
    since: Option<String>,
}

/// The window a query's `since` names, 30 days if none.
fn queried_window(since: Option<String>) -> Result<Duration, ApiError> {
    let since = since
        .map(|s| s.parse::<Span>())
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("since: {e}")))?;
    window(since, Duration::from_secs(30 * 86_400))
}

async fn reviewer_agreement(
    State(state): State<AppState>,
    Path(agent): Path<String>,
    caller: Caller,
    QueryParams(query): QueryParams<WindowQuery>,
) -> Result<Json<Agreement>, ApiError> {
    caller.require(Permission::Administer)?;
    let window = queried_window(query.since)?;
    Ok(Json(agreement::agreement(&state, &agent, window).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewerReplayBody {
    /// How far back (`30d`, `24h`); default 30 days.
    since: Option<Span>,
    /// The most calls put to the models, the most recent first; default 50.
    limit: Option<usize>,
}

async fn reviewer_replayed(
    State(state): State<AppState>,
    Path(agent): Path<String>,
    Authenticated { caller, body, .. }: Authenticated<ReviewerReplayBody>,
) -> Result<Json<Agreement>, ApiError> {
    caller.require(Permission::Administer)?;
    let window = window(body.since, Duration::from_secs(30 * 86_400))?;
    let limit = body.limit.unwrap_or(50);
    if !(1..=reviewer_replay::MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be 1 to {}",
            reviewer_replay::MAX_LIMIT
        )));
    }
    Ok(Json(
        reviewer_replay::replay(&state, &agent, window, limit).await?,
    ))
}
