//! Reading the agents' folder: every `*.toml` file but the scripted model's turns
//! (`*.script.toml`), in name order, made into a [`Catalog`] by the model's rules, with the
//! tools of each agent's MCP servers as those servers list them now.

use crate::mcp::McpClients;
use crate::metrics::Metrics;
use countersign_model::agent::{Agent, AgentDef, AgentError, Catalog, SCRIPT_SUFFIX};
use countersign_model::mcp::{McpServerDef, McpTool};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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

/// Notices a changed agents' folder: any of its `*.toml` files (agents and scripts) added,
/// removed or edited, checked every `interval`. Each change is loaded whole; a folder that
/// does not load is answered with its error, and the service keeps what it had.
pub struct Watcher {
    dir: PathBuf,
    mcp: McpClients,
    interval: Duration,
    seen: String,
    /// The MCP servers' word that their tools changed: the folder is loaded again at once.
    tools_changed: tokio::sync::watch::Receiver<u64>,
}

impl Watcher {
    /// Watches `dir`, whose present contents are what the service loaded, and the tools of
    /// the MCP servers `mcp` has sessions with.
    pub fn new(dir: &Path, mcp: McpClients, interval: Duration) -> Self {
        Self {
            seen: fingerprint(dir),
            dir: dir.to_path_buf(),
            tools_changed: mcp.tools_changed(),
            mcp,
            interval,
        }
    }

    /// Until `stop`: loads the folder at each change and hands what loaded to `install`,
    /// which checks it and puts it in place, or says why not. A folder that does not load or
    /// that `install` refuses is logged with its error and counted, and the agents loaded
    /// before stay.
    pub async fn follow<F>(
        mut self,
        stop: CancellationToken,
        metrics: Metrics,
        mut install: impl FnMut(Catalog) -> F,
    ) where
        F: Future<Output = anyhow::Result<()>>,
    {
        loop {
            let loaded = tokio::select! {
                _ = stop.cancelled() => return,
                loaded = self.next() => loaded,
            };
            let installed = match loaded {
                Ok(catalog) => install(catalog).await,
                Err(e) => Err(e.into()),
            };
            match installed {
                Ok(()) => {
                    info!("agents reloaded");
                    metrics.agent_reload("loaded");
                }
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "the agents' folder changed but does not load; the agents loaded before stay");
                    metrics.agent_reload("refused");
                }
            }
        }
    }

    /// Waits for the next change, of the folder or of an MCP server's tools, and loads the
    /// folder.
    async fn next(&mut self) -> Result<Catalog, AgentError> {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                Ok(()) = self.tools_changed.changed() => {
                    info!("an MCP server's tools changed: listing them again");
                    self.seen = fingerprint(&self.dir);
                    return load_dir(&self.dir, &self.mcp).await;
                }
            }
            let now = fingerprint(&self.dir);
            if now != self.seen {
                self.seen = now;
                return load_dir(&self.dir, &self.mcp).await;
            }
        }
    }
}

/// A digest of the folder's `*.toml` files, names and contents; empty when it cannot be read.
/// What a folder's `*.toml` files hold, names and contents, as one digest: equal while
/// nothing in them changed.
pub fn fingerprint(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return String::new();
    };
    let mut files: Vec<(String, Vec<u8>)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| {
            let text = std::fs::read(&p).unwrap_or_default();
            (p.display().to_string(), text)
        })
        .collect();
    files.sort();
    let mut all = Vec::new();
    for (name, text) in files {
        all.extend_from_slice(name.as_bytes());
        all.push(0);
        all.extend_from_slice(&(text.len() as u64).to_le_bytes());
        all.extend_from_slice(&text);
    }
    countersign_model::digest::sha256_hex(all)
}
