//! Every inbound way a person or a client acts, one door each, merged into one router here:
//! the HTTP API (`api`), the web inbox (`inbox`), email's link pages (`email`), Slack's
//! interactivity endpoint (`slack`), the MCP proxy (`mcp`, at `/mcp/{agent}`) and the door
//! of external agents (`calls`, at `/v1/agents/{agent}/calls`). Each door decides through `crate::decide` and shows what it shows with
//! `crate::pages`; no door imports another.

mod api;
mod calls;
mod email;
mod inbox;
pub(crate) mod mcp;
pub mod slack;

use crate::error::ApiError;
use crate::pages::same_origin;
use crate::state::AppState;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;

/// Every route, with `metrics` (`/metrics`) unless it is served on an address of its own;
/// `stop` closes the MCP endpoints' sessions and streams.
pub(crate) fn router(
    state: AppState,
    metrics: Option<Router<AppState>>,
    stop: &CancellationToken,
) -> anyhow::Result<Router> {
    let limit = state.config.max_body_bytes;
    let app = Router::new()
        .merge(metrics.unwrap_or_default())
        .merge(api::router(stop))
        .merge(calls::router(stop))
        .merge(mcp::route::router(&state, stop)?)
        .merge(slack::router())
        .merge(
            // The reviewers' pages: none changes anything for a form sent from another site.
            email::router()
                .merge(inbox::router(stop))
                .route_layer(from_fn_with_state(state.clone(), same_origin::check)),
        )
        // A person who mistyped an inbox address gets a page, with the way back; anyone
        // else the API's JSON.
        .fallback(|uri: Uri| async move {
            let path = uri.path();
            if path == "/inbox" || path.starts_with("/inbox/") {
                let missing = ApiError::not_found("There is no such page in the inbox.");
                crate::pages::layout::PageError(missing).into_response()
            } else {
                ApiError::not_found("no such route").into_response()
            }
        })
        // After the merges: it applies to the routes present when it is called.
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::method_not_allowed(format!("{method} is not allowed on {}", uri.path()))
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(state);
    Ok(app)
}

/// Rewrites an error answer that is neither JSON nor a page into the API's JSON error: axum's
/// own rejections, such as the 413 of a route that reads its body as raw bytes, are plain
/// text. The pages (email links, inbox) stay HTML.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !(status.is_client_error() || status.is_server_error())
        || content_type.starts_with("application/json")
        || content_type.starts_with("text/html")
    {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Rejection texts are a line; a longer body is not one of them, and is not shown.
    let text = axum::body::to_bytes(body, 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_lowercase()
    } else {
        text
    };
    let json = ApiError::for_status(status, message).into_response();
    parts.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in json.headers() {
        parts.headers.insert(name, value.clone());
    }
    Response::from_parts(parts, json.into_body())
}
