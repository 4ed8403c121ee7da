//! `agent-worker`: the worker service's process (or, as `agent-worker probe URL`, a
//! container's health probe). Everything else is in the library.

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
    agent_worker::main_from_env().await
}
