//! `approval-gateway`: the gateway service's process (or, as `approval-gateway probe URL`, a
//! container's health probe). It loads the configuration, binds the listener and serves
//! until SIGINT or SIGTERM; everything else is in the library.

use approval_gateway::config::Config;
use countersign_runtime::telemetry;
use tokio_util::sync::CancellationToken;

/// mimalloc rather than glibc's malloc: allocation was a sixth of the services' CPU, and
/// mimalloc's thread-local free lists cost less per cycle here (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    countersign_runtime::probe::exit_if_asked();
    serve()
}

#[tokio::main]
async fn serve() -> anyhow::Result<()> {
    let _telemetry = telemetry::init("approval-gateway");
    let config = Config::load()?;
    let listener = tokio::net::TcpListener::bind(&config.listen).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(countersign_runtime::shutdown::on_signal(shutdown.clone()));
    approval_gateway::run(config, listener, shutdown).await
}
