//! approval-gateway: the HTTP face of countersign. Starts runs, shows them, and records
//! reviewers' decisions atomically before announcing them to the workers.
//!
//! Its rooms, and which may import which, are in ARCHITECTURE.md ("The gateway's rooms"),
//! held by `tests/rooms.rs`: `doors/` (every inbound way a person or a client acts: the API,
//! the inbox, email links, Slack, the MCP proxy), `pages/` (what a reviewer is shown), the
//! verbs below them (`decide/`, `grants`, `runs`, `live/`, `replay`, `suggest`, `agreement`,
//! `receipts`), the outbound side (`deliveries/`, `channels/`, `mail`), and the frame they
//! share (`state`, `error`, `server`, `view`, `config`, `time`, `auth/`).

#![warn(unreachable_pub)]

pub(crate) mod agreement;
pub(crate) mod auth;
pub(crate) mod channels;
pub mod config;
pub(crate) mod decide;
pub(crate) mod delegations;
pub(crate) mod deliveries;
pub(crate) mod doors;
pub(crate) mod error;
pub(crate) mod grants;
pub(crate) mod live;
pub(crate) mod mail;
pub(crate) mod model_approvals;
pub(crate) mod pages;
pub(crate) mod receipts;
pub(crate) mod replay;
pub(crate) mod reviewer_replay;
pub(crate) mod runs;
pub(crate) mod server;
pub(crate) mod state;
pub(crate) mod suggest;
pub(crate) mod time;
pub(crate) mod view;

/// Slack's request signing, for clients and tests that call the interactivity endpoint.
pub use doors::slack;

use config::Config;
use countersign_runtime::agents::Watcher;
use countersign_runtime::bus::Bus;
use countersign_runtime::mcp::McpClients;
use countersign_runtime::metrics::Metrics;
use countersign_runtime::metrics_http::Placed;
use countersign_runtime::names::{Names, Service};
use countersign_store::Store;
use state::AppState;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Loads the agents again whenever their folder changes, until `stop`; a folder that does
/// not load (or names a channel that is not configured) is refused with its error, and the
/// agents loaded before stay. The MCP endpoints of `mcp_client` agents are the ones found at
/// start.
async fn reload(state: AppState, watcher: Watcher, stop: CancellationToken) {
    let metrics = state.metrics.clone();
    watcher
        .follow(stop, metrics, |catalog| {
            let state = state.clone();
            async move {
                state.config.check_channels(&catalog)?;
                state.replace_catalog(catalog);
                Ok(())
            }
        })
        .await;
}

/// Serves the API on `listener` until `shutdown` is cancelled; in-flight requests finish, the
/// deliveries in flight get a bounded time to, and the NATS connection is drained. Should the
/// deliveries fail, the gateway stops the same way and returns its error.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let names = Names::new(&config.connections.namespace)?;
    let mcp = McpClients::default();
    let catalog = countersign_runtime::agents::load_dir(&config.agents_dir, &mcp).await?;
    config.check_channels(&catalog)?;
    let metrics = Metrics::default();
    let store = Store::connect_waiting(&config.connections, names.clone(), metrics.clone())
        .await?
        .gateway();
    let bus = Bus::connect(&config.connections, names).await?;
    let watcher = Watcher::new(
        &config.agents_dir,
        mcp,
        std::time::Duration::from_millis(config.agents_reload_ms),
    );
    let state = AppState::new(store, bus, catalog, config, metrics)?;
    // The gateway's own stop: a shutdown, or its deliveries failing, which stops it rather
    // than leave it answering while nobody is told.
    let stop = shutdown.child_token();
    let deliveries = tokio::spawn({
        let (state, stop) = (state.clone(), stop.clone());
        async move {
            let delivered = deliveries::run(state, stop.clone()).await;
            if delivered.is_err() {
                stop.cancel();
            }
            delivered
        }
    });
    let outbox = tokio::spawn(
        state
            .outbox
            .clone()
            .run_sweeper(Service::Gateway, stop.clone()),
    );
    let reloader = tokio::spawn(reload(state.clone(), watcher, stop.clone()));
    let mut served = Placed::new(
        state.metrics.clone(),
        state.config.metrics_listen.as_deref(),
        state.config.metrics_token.as_ref(),
        stop.clone(),
    )
    .await?;
    let app = doors::router(state.clone(), served.route.take(), &stop)?;
    tracing::info!(addr = %listener.local_addr()?, "gateway listening");
    server::serve(listener, app, &state.config, stop.clone()).await;
    stop.cancel();
    served.stopped().await?;
    deliveries.await??;
    outbox.await?;
    reloader.await?;
    state.bus.client.drain().await?;
    tracing::info!("gateway stopped");
    Ok(())
}
