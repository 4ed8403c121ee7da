#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agent_worker::main_from_env().await
}
