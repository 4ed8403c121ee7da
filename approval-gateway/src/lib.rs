//! approval-gateway: the HTTP face of countersign. Starts runs, shows them, and records
//! reviewers' decisions atomically before announcing them to the workers.

pub mod config;
pub mod decide;
pub mod email;
pub mod error;
pub mod extract;
pub mod notify;
pub mod routes;
pub mod server;
pub mod slack;
pub mod state;

use config::Config;
use countersign_shared::agent::Catalog;
use countersign_shared::bus::Bus;
use countersign_shared::names::Names;
use countersign_shared::store::Store;
use state::AppState;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves the API on `listener` until `shutdown` is cancelled; in-flight requests finish.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let names = Names::new(&config.infra.namespace)?;
    let catalog = Catalog::load_dir(&config.agents_dir)?;
    config.check_channels(&catalog)?;
    let store = Store::connect(&config.infra.redis_url, names.clone()).await?;
    let bus = Bus::connect(&config.infra.nats_url, names).await?;
    let state = AppState::new(store, bus, catalog, config)?;
    let notifier = tokio::spawn(notify::run(state.clone(), shutdown.clone()));
    let outbox = tokio::spawn(state.outbox.clone().run_sweeper(shutdown.clone()));
    let app = routes::router(state.clone());
    tracing::info!(addr = %listener.local_addr()?, "gateway listening");
    server::serve(listener, app, &state.config, shutdown.clone()).await;
    shutdown.cancel();
    notifier.await??;
    outbox.await?;
    Ok(())
}
