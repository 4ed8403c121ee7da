//! `GET /.well-known/jwks.json`, no key needed: the public keys receipts are signed with (the
//! current one and the retired ones still accepted), as a JWK Set (RFC 7517) any JWT library
//! reads. Tools cache it; an unknown `kid` is their cue to fetch it again.

use crate::state::AppState;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/.well-known/jwks.json", get(jwks))
}

async fn jwks(State(state): State<AppState>) -> impl IntoResponse {
    (
        [
            (header::CACHE_CONTROL, "public, max-age=300"),
            (header::CONTENT_TYPE, "application/json"),
        ],
        state.receipts.published().to_string(),
    )
}
