//! `GET /v1/runs/{run_id}/events`: a run's live events as server-sent events (see
//! `crate::live`), for whoever may read the run.

use super::runs::load_run;
use crate::auth::{Caller, Permission};
use crate::error::ApiError;
use crate::live::{self, Follow};
use crate::state::AppState;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub(super) fn router(stop: CancellationToken) -> Router<AppState> {
    Router::new().route(
        "/v1/runs/{run_id}/events",
        get(move |state, caller, path, headers, query| {
            events(state, caller, path, headers, query, stop)
        }),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resume {
    /// For clients that cannot set `Last-Event-ID`: the last event's `id` they have.
    after: Option<String>,
}

/// The run's events from the first (or after `Last-Event-ID`), then live until the run ends.
/// A client that has every event of a run that ended is told `204 No Content`, which stops
/// an `EventSource` from reconnecting.
async fn events(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    Query(resume): Query<Resume>,
    stop: CancellationToken,
) -> Result<Response, ApiError> {
    caller.require(Permission::Read)?;
    let run = load_run(&state, &run_id).await?;
    caller.reading(&run_id, run.requested_by.as_deref())?;
    let last_id = headers
        .get("last-event-id")
        .map(|v| v.to_str().unwrap_or("?").to_string())
        .or(resume.after);
    let after = match last_id.as_deref().map(str::trim) {
        None | Some("") => 0,
        Some(id) => id.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "Last-Event-ID {id:?} is not an id of this stream (its ids are 1, 2, 3, …)"
            ))
        })?,
    };
    if run.status.is_terminal()
        && after > 0
        && after >= live::stored(&state.bus, &run.run_id).await?
    {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let follow = Follow {
        run: &run.run_id,
        after,
        patience: Duration::from_millis(state.config.live_slow_reader_ms),
        stop,
    };
    let stream = live::follow(&state.bus, state.metrics.clone(), follow).await?;
    let heartbeat = Duration::from_millis(state.config.live_heartbeat_ms);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(heartbeat))
        .into_response())
}
