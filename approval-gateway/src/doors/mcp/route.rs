//! `/mcp/{agent}`: the MCP endpoint (Streamable HTTP) of each `mcp_client` agent
//! (`super`), for MCP clients countersign does not run. Every request must carry a
//! countersign API key that may start runs, as `Authorization: Bearer <key>`: it is checked
//! here, before rmcp reads the request, and the caller rides in the request's extensions to
//! the handler (rmcp hands it the request's `http::request::Parts`). A request naming an MCP
//! session is let in only for the principal that opened it (`super::owners`). Any other
//! agent's path is a 404 that says why.

use crate::auth::{Caller, Permission};
use crate::error::ApiError;
use crate::state::AppState;
use axum::Router;
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use countersign_model::agent::Provider;
use tokio_util::sync::CancellationToken;

/// The endpoints of the catalog's `mcp_client` agents, which `stop` closes.
pub(in crate::doors) fn router(
    state: &AppState,
    stop: &CancellationToken,
) -> anyhow::Result<Router<AppState>> {
    let mut router = Router::new().route("/mcp/{agent}", any(not_a_proxy));
    let catalog = state.catalog();
    let proxies = catalog
        .iter()
        .filter(|a| a.def.model.provider == Provider::McpClient);
    for agent in proxies {
        let path = format!("/mcp/{}", agent.def.name);
        router = router.nest_service(&path, super::service(state, agent.clone(), stop.clone())?);
    }
    Ok(router.layer(from_fn_with_state(state.clone(), authenticate)))
}

/// Lets in a request whose key may start runs, with its [`Caller`] in its extensions: 401
/// without a known key, 403 for one that may not start runs, 404 for a session its principal
/// did not open.
async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let caller = match Caller::from_request_parts(&mut parts, &state).await {
        Ok(caller) => caller,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = caller.require(Permission::Start) {
        return e.into_response();
    }
    parts.extensions.insert(caller.clone());
    super::owners::admit(&state, &caller, Request::from_parts(parts, body), next).await
}

async fn not_a_proxy(State(state): State<AppState>, Path(agent): Path<String>) -> ApiError {
    match state.catalog().get(&agent) {
        Some(_) => ApiError::not_found(format!(
            "agent {agent:?} is not an MCP proxy: only an agent whose [model] provider is \
             \"mcp_client\" has an MCP endpoint"
        )),
        None => ApiError::not_found(format!("no agent named {agent:?}")),
    }
}
