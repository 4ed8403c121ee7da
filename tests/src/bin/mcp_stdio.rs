//! An MCP server on stdio with one tool, `echo`, which answers its arguments as text: what a
//! test agent's `mcp_servers[].command` runs (`CARGO_BIN_EXE_mcp_stdio`).

use countersign_tests::mcp_server::{TestAnswer, TestTool, serve_stdio};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let echo = TestTool::new("echo", TestAnswer::Text("echoed".into()));
    serve_stdio(vec![echo], 10).await
}
