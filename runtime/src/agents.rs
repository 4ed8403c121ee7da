//! Reading the agents' folder: every `*.toml` file but the scripted model's turns
//! (`*.script.toml`), in name order, made into a [`Catalog`] by the model's rules, with the
//! tools of each agent's MCP servers as those servers list them now.

use crate::mcp::McpClients;
use countersign_model::agent::{Agent, AgentDef, AgentError, Catalog, SCRIPT_SUFFIX};
use countersign_model::mcp::{McpServerDef, McpTool};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Loads every agent of `dir`, listing their MCP servers' tools through `mcp` (whose sessions
/// the agents' calls then use).
pub async fn load_dir(dir: &Path, mcp: &McpClients) -> Result<Catalog, AgentError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |error| AgentError::Read { path, error }
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".toml") && !name.ends_with(SCRIPT_SUFFIX)
        })
        .collect();
    paths.sort();
    let mut agents = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).map_err(read_err(&path))?;
        let agent = load(&text, dir, mcp)
            .await
            .map_err(|e| AgentError::InFile {
                path,
                error: Box::new(e),
            })?;
        agents.push(agent);
    }
    Catalog::new(agents)
}

async fn load(text: &str, dir: &Path, mcp: &McpClients) -> Result<Agent, AgentError> {
    let def = AgentDef::parse(text)?;
    let mut discovered = BTreeMap::new();
    for server in &def.mcp_servers {
        let tools = discover(&def.name, server, mcp).await?;
        discovered.insert(server.name.clone(), tools);
    }
    Agent::from_def(text, def, dir, &discovered)
}

/// The server's tools, asked again for as long as one answer may take (a server starting
/// beside this process may not be up yet), then the last error.
async fn discover(
    agent: &str,
    server: &McpServerDef,
    mcp: &McpClients,
) -> Result<Vec<McpTool>, AgentError> {
    let give_up = Instant::now() + Duration::from_millis(server.timeout_ms);
    loop {
        match mcp.list_tools(agent, server).await {
            Ok(tools) => return Ok(tools),
            Err(crate::mcp::McpError::BackingOff { wait_ms, .. })
                if Instant::now() + Duration::from_millis(wait_ms) < give_up =>
            {
                tokio::time::sleep(Duration::from_millis(wait_ms)).await;
            }
            Err(crate::mcp::McpError::Connect(_)) if Instant::now() < give_up => {}
            Err(e) => {
                return Err(AgentError::Discovery {
                    server: server.name.clone(),
                    error: e.to_string(),
                });
            }
        }
    }
}
