use approval_gateway::config::Config;
use countersign_shared::telemetry;
use tokio_util::sync::CancellationToken;

fn main() -> anyhow::Result<()> {
    countersign_shared::probe::exit_if_asked();
    serve()
}

#[tokio::main]
async fn serve() -> anyhow::Result<()> {
    let _telemetry = telemetry::init("approval-gateway");
    let config = Config::load()?;
    let listener = tokio::net::TcpListener::bind(&config.listen).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(countersign_shared::shutdown::on_signal(shutdown.clone()));
    approval_gateway::run(config, listener, shutdown).await
}
