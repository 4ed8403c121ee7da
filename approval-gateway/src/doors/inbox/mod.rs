//! The web inbox's door: the pages at `/inbox` (sign-in, the queue, a request, a run, the
//! standing grants) and what their forms do. What the pages are made of (the layout, the
//! request view, the decision forms, the session), shared with the email door, is in
//! `crate::pages`.
//!
//! Server-rendered with maud, whose templates are Rust checked at compile time and escape
//! everything not marked otherwise. Every core action is a plain form that works with
//! JavaScript off; a small inline script only refreshes what changed elsewhere. Decisions go
//! through `crate::decide`, like every other channel's, as channel `web`.

mod allow_similar;
mod batch;
mod delegations_page;
mod grants_page;
mod live_view;
mod next;
mod pre_session;
mod queue;
mod queue_page;
mod request;
mod run_page;
mod sign_in;

use crate::state::AppState;
use axum::Router;

/// The pages; `stop` ends the live events streams they follow.
pub(super) fn router(stop: &tokio_util::sync::CancellationToken) -> Router<AppState> {
    Router::new()
        .merge(sign_in::router())
        .merge(queue_page::router())
        .merge(batch::router())
        .merge(grants_page::router())
        .merge(delegations_page::router())
        .merge(request::router())
        .merge(run_page::router())
        .merge(live_view::router(stop.clone()))
}

/// The channel inbox decisions are recorded as coming from.
const CHANNEL: &str = "web";
