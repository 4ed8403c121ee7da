//! Whose each MCP session is. A session of the proxy is opened by a key (rmcp answers the
//! `initialize` with an `Mcp-Session-Id`), and from then on it answers that key's principal
//! alone: a request that names a session another principal opened, or one the store does not
//! know, is answered `404 Session not found`, as the MCP Streamable HTTP transport answers an
//! unknown or ended session (the client then opens a new one), so a session id read elsewhere
//! (run metadata shows it to every reader) neither calls into the session, opens its stream
//! nor ends it, and does not tell that the session exists.
//!
//! The binding is kept in Redis under the SHA-256 of the session id (`keys::mcp_session_key`),
//! so every gateway checks it and a copy of Redis names no usable session. It is written
//! before the client is answered, so no request can name the session unbound; a binding that
//! cannot be written fails the `initialize` (503) and the session, whose id nobody learned,
//! ends idle. Each use makes it last [`BINDING_TTL`] again; an owner's `DELETE` removes it.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use countersign_model::digest::sha256_hex;
use std::time::Duration;

/// The header a session's requests carry its id in (protocol versions before 2026-07-28).
pub(crate) const SESSION_HEADER: &str = "mcp-session-id";

/// How long a binding lasts unused: far longer than rmcp keeps an idle session (5 minutes),
/// so a binding ends after its session does.
pub(crate) const BINDING_TTL: Duration = Duration::from_secs(24 * 3600);

/// The SHA-256 of the session id `headers` carry, if they carry one.
fn session_hash(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .map(|id| sha256_hex(id.as_bytes()))
}

/// What rmcp answers for a session it does not hold, word for word: a session of another
/// principal is not told apart from one that does not exist.
fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

/// Passes `request` of `caller` on to the MCP service if it names no session, or a session
/// `caller`'s principal opened; binds a session the answer opens to that principal.
pub(crate) async fn admit(
    state: &AppState,
    caller: &Caller,
    request: Request<Body>,
    next: Next,
) -> Response {
    let Some(hash) = session_hash(request.headers()) else {
        return opened(state, caller, next.run(request).await).await;
    };
    match state.store.mcp_session_owner(&hash, BINDING_TTL).await {
        Ok(Some(owner)) if owner == caller.principal => {}
        Ok(_) => {
            tracing::info!(principal = %caller.principal, "a request named an MCP session its principal did not open");
            return not_found();
        }
        Err(e) => return ApiError::from(e).into_response(),
    }
    let ending = request.method() == Method::DELETE;
    let response = next.run(request).await;
    if !ending || !response.status().is_success() {
        return response;
    }
    if let Err(e) = state.store.unbind_mcp_session(&hash).await {
        tracing::warn!(error = %e, "an ended MCP session's binding is left to expire");
    }
    // rmcp answers an ended session 202, once it is closed; the official Python SDK takes
    // anything but 200 or 204 for a failed termination and says so to its user.
    match response.status() {
        StatusCode::ACCEPTED => StatusCode::NO_CONTENT.into_response(),
        _ => response,
    }
}

/// `response` once the session it opens, if any, is bound to `caller`'s principal.
async fn opened(state: &AppState, caller: &Caller, response: Response) -> Response {
    let Some(hash) = session_hash(response.headers()) else {
        return response;
    };
    match state
        .store
        .bind_mcp_session(&hash, &caller.principal, BINDING_TTL)
        .await
    {
        Ok(()) => response,
        Err(e) => ApiError::unavailable(e).into_response(),
    }
}
