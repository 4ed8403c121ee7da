fn main() -> anyhow::Result<()> {
    countersign_runtime::probe::exit_if_asked();
    serve()
}

#[tokio::main]
async fn serve() -> anyhow::Result<()> {
    agent_worker::main_from_env().await
}
