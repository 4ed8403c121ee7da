//! The HTTP API, one router per file.

mod approvals;
mod audit;
mod decisions;
mod email;
mod health;
mod runs;
mod slack;
mod view;

use crate::state::AppState;

use axum::Router;
use axum::extract::DefaultBodyLimit;
pub use runs::load_run;
pub use view::rfc3339;

pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .merge(runs::router())
        .merge(decisions::router())
        .merge(audit::router())
        .merge(approvals::router())
        .merge(health::router())
        .merge(slack::router())
        .merge(email::router())
        .fallback(|| async { crate::error::ApiError::not_found("no such route") })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}
