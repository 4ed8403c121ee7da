use agent_worker::config::Config;
use countersign_shared::telemetry;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::init();
    let config = Config::load()?;
    let shutdown = CancellationToken::new();
    tokio::spawn(countersign_shared::shutdown::on_signal(shutdown.clone()));
    agent_worker::run(config, shutdown).await
}
