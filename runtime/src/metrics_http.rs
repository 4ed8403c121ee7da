//! `GET /metrics` over HTTP, as both services serve it: on their own listener (the gateway's
//! API port, a worker's probes port) or, when `metrics_listen` is set, alone on that address
//! (the service's other port then answers 404 there); and with a `metrics_token`, only to
//! requests carrying `Authorization: Bearer <token>` (401 otherwise). Operators choose either
//! or both, so the figures reach Prometheus and nobody else who can reach a port.

use crate::metrics::Metrics;
use crate::secret::Secret;
use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use countersign_model::digest::sha256_hex;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
struct Scrape {
    metrics: Metrics,
    /// The SHA-256 of the token: requests are compared by digest, so how long a comparison
    /// takes says nothing about how much of a guessed token was right.
    token_digest: Option<String>,
}

/// The `/metrics` route for `metrics`, behind `token` when there is one.
fn route<S: Clone + Send + Sync + 'static>(metrics: Metrics, token: Option<&Secret>) -> Router<S> {
    let scrape = Scrape {
        metrics,
        token_digest: token.map(|t| sha256_hex(t.expose())),
    };
    Router::new()
        .route("/metrics", get(answer))
        .with_state(scrape)
}

/// `/metrics` where the configuration puts it: a route for the service's own listener, or
/// alone on `listen` (bound here, so a wrong address stops the service at start).
pub struct Placed<S> {
    /// For the service's own listener; `None` when `/metrics` is served apart.
    pub route: Option<Router<S>>,
    apart: Option<JoinHandle<std::io::Result<()>>>,
}

impl<S: Clone + Send + Sync + 'static> Placed<S> {
    /// Places `metrics`, behind `token` if any, served apart on `listen` until `shutdown`
    /// when one is given.
    pub async fn new(
        metrics: Metrics,
        listen: Option<&str>,
        token: Option<&Secret>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let Some(addr) = listen else {
            return Ok(Self {
                route: Some(route(metrics, token)),
                apart: None,
            });
        };
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("bind metrics_listen {addr}"))?;
        tracing::info!(addr = %listener.local_addr()?, "metrics listening");
        let app: Router = route(metrics, token);
        let apart = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        });
        Ok(Self {
            route: None,
            apart: Some(apart),
        })
    }

    /// Waits for the separate listener, if any, to stop (after `shutdown`).
    pub async fn stopped(self) -> anyhow::Result<()> {
        if let Some(apart) = self.apart {
            apart.await??;
        }
        Ok(())
    }
}

async fn answer(State(scrape): State<Scrape>, headers: HeaderMap) -> Response {
    if let Some(wanted) = &scrape.token_digest {
        let given = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| sha256_hex(t.trim()));
        if given.as_ref() != Some(wanted) {
            let error = json!({"error": {
                "code": "unauthorized",
                "message": "/metrics needs Authorization: Bearer <metrics_token>",
            }});
            return (
                StatusCode::UNAUTHORIZED,
                [(WWW_AUTHENTICATE, "Bearer")],
                axum::Json(error),
            )
                .into_response();
        }
    }
    (
        [(CONTENT_TYPE, Metrics::CONTENT_TYPE)],
        scrape.metrics.encode(),
    )
        .into_response()
}

/// Refuses a `metrics_token` too short to be one.
pub fn check_token(token: Option<&Secret>) -> anyhow::Result<()> {
    if let Some(token) = token {
        anyhow::ensure!(
            token.expose().trim().len() >= 16,
            "metrics_token must be at least 16 characters"
        );
    }
    Ok(())
}
