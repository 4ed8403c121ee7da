//! The reviewers' web pages: the inbox at `/inbox` (sign-in, the queue, a request, a run,
//! the standing grants)
//! and the layout, request view and decision forms the email link pages share with it.
//!
//! Server-rendered with maud, whose templates are Rust checked at compile time and escape
//! everything not marked otherwise. Every core action is a plain form that works with
//! JavaScript off; a small inline script only refreshes what changed elsewhere. Decisions go
//! through `crate::decide`, like every other channel's, as channel `web`.

mod allow_similar;
mod batch;
pub(crate) mod forms;
mod grants_page;
mod inbox;
pub(crate) mod layout;
mod live_view;
mod next;
mod pre_session;
mod queue;
mod request;
pub(crate) mod request_view;
mod run_page;
pub(crate) mod same_origin;
pub(crate) mod session;
mod sign_in;

use crate::state::AppState;
use axum::Router;
use std::collections::HashMap;

/// The pages; `stop` ends the live events streams they follow.
pub(crate) fn router(stop: &tokio_util::sync::CancellationToken) -> Router<AppState> {
    Router::new()
        .merge(sign_in::router())
        .merge(inbox::router())
        .merge(batch::router())
        .merge(grants_page::router())
        .merge(request::router())
        .merge(run_page::router())
        .merge(live_view::router(stop.clone()))
}

/// The channel inbox decisions are recorded as coming from.
const CHANNEL: &str = "web";

/// A form body's fields; a body that is not a form has none.
pub(crate) fn form_fields(body: &[u8]) -> HashMap<String, String> {
    serde_urlencoded::from_bytes(body).unwrap_or_default()
}
