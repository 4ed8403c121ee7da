//! `GET /v1/runs/{run_id}/events`: a run's live events as server-sent events (see
//! `crate::live`), for whoever may read the run.

use super::runs::load_run;
use crate::auth::{Caller, Permission, QueryParams};
use crate::error::ApiError;
use crate::live;
use crate::server::ConnectionSlot;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

pub(super) fn router(stop: CancellationToken) -> Router<AppState> {
    Router::new().route(
        "/v1/runs/{run_id}/events",
        get(move |state, caller, slot, path, headers, query| {
            events(state, caller, slot, path, headers, query, stop)
        }),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resume {
    /// For clients that cannot set `Last-Event-ID`: the last event's `id` they have.
    after: Option<String>,
}

/// The run's events from the first (or after `Last-Event-ID`), then live until the run ends
/// (see `live::answer`), counted against the caller's principal.
async fn events(
    State(state): State<AppState>,
    caller: Caller,
    slot: Option<Extension<ConnectionSlot>>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    QueryParams(resume): QueryParams<Resume>,
    stop: CancellationToken,
) -> Result<Response, ApiError> {
    caller.require(Permission::Read)?;
    let run = load_run(&state, &run_id).await?;
    caller.reading(&run_id, run.requested_by.as_deref())?;
    let after = live::resume_point(&headers, resume.after.as_deref())?;
    let follower = live::Follower {
        principal: &caller.principal,
        slot: slot.map(|Extension(slot)| slot),
    };
    live::answer(&state, &run, after, follower, stop).await
}
