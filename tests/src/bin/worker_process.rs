//! agent-worker as a process of this package, so tests can SIGKILL and restart it
//! (`CARGO_BIN_EXE_worker_process`).

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agent_worker::main_from_env().await
}
