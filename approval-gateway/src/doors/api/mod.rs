//! The HTTP API, one router per file.

mod approvals;
mod audit;
mod decisions;
mod delegations;
mod events;
mod grants;
mod health;
mod jwks;
mod policy;
mod runs;
mod sessions;

use crate::error::ApiError;
use crate::state::AppState;
use axum::Router;
use tokio_util::sync::CancellationToken;

/// The API's routes; `stop` ends the live events streams.
pub(super) fn router(stop: &CancellationToken) -> Router<AppState> {
    Router::new()
        .merge(runs::router())
        .merge(events::router(stop.clone()))
        .merge(decisions::router())
        .merge(grants::router())
        .merge(delegations::router())
        .merge(audit::router())
        .merge(policy::router())
        .merge(approvals::router())
        .merge(sessions::router())
        .merge(health::router())
        .merge(jwks::router())
}

/// Whether a listing's `?status=` asks for standing entries only: `active`, or `all` (the
/// default); anything else is refused.
fn active_only(status: Option<&str>) -> Result<bool, ApiError> {
    match status {
        None | Some("all") => Ok(false),
        Some("active") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "status {other:?} is not one of active, all"
        ))),
    }
}
