//! Talking to the MCP servers agents take tools from, with the protocol's official SDK
//! (`rmcp`) as the client: Streamable HTTP, or stdio to a program run beside this process.
//!
//! One session per server per process, opened when the agent loads (to list its tools) and
//! reused by every call. A session that fails is dropped and opened again on the next call,
//! no sooner than a backoff that doubles per failure (100 ms to 30 s), so a server that is down
//! fails its calls at once instead of being hammered. A call is never sent twice here: one
//! that fails is an error result for the model, as an HTTP tool's would be (the SDK itself
//! repeats a request only when the server answers that the session expired, which means the
//! request was not processed).
//!
//! A server that says its tools changed (`notifications/tools/list_changed`) is heard on its
//! session: [`McpClients::tools_changed`] tells the agents' watcher, which lists every
//! server's tools again at once instead of at the next change of the agents' folder.

use countersign_model::mcp::{McpServerDef, McpTool};
use rmcp::model::{CallToolRequestParams, ClientConfig, Implementation};
use rmcp::service::{NotificationContext, RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};
use rmcp::{ClientHandler, Peer, ServiceExt};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why an MCP server could not be used or a call to it failed.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The server's entry cannot be used (no `url` or `command`).
    #[error("{0}")]
    Config(String),
    /// No session could be opened: the server is unreachable, refused, or its program did not
    /// start.
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error(
        "not reachable (the last attempt failed {failures} time(s) in a row; the next is allowed in {wait_ms} ms)"
    )]
    /// The last sessions failed, and the backoff has not passed yet: the call fails at once.
    BackingOff {
        /// How many attempts in a row failed.
        failures: u32,
        /// Milliseconds until the next attempt is allowed.
        wait_ms: u64,
    },
    /// The server did not answer within its `timeout_ms` (given, in milliseconds).
    #[error("did not answer within {0} ms")]
    Timeout(u64),
    /// The server answered the call with an error, or with something the client cannot read.
    #[error("{0}")]
    Call(String),
}

/// The sessions of one process, by `AGENT/SERVER`.
#[derive(Clone)]
pub struct McpClients {
    sessions: Arc<Mutex<HashMap<String, Arc<Session>>>>,
    /// Counts the servers' `notifications/tools/list_changed`.
    changed: Arc<watch::Sender<u64>>,
}

impl Default for McpClients {
    fn default() -> Self {
        Self {
            sessions: Default::default(),
            changed: Arc::new(watch::Sender::new(0)),
        }
    }
}

/// What a session's server is told about this client, and hears from it.
#[derive(Clone)]
struct Listener {
    info: ClientConfig,
    changed: Arc<watch::Sender<u64>>,
}

impl ClientHandler for Listener {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.changed.send_modify(|heard| *heard += 1);
    }
}

struct Session {
    server: McpServerDef,
    state: tokio::sync::Mutex<State>,
    changed: Arc<watch::Sender<u64>>,
}

#[derive(Default)]
struct State {
    client: Option<RunningService<RoleClient, Listener>>,
    failures: u32,
    retry_at: Option<Instant>,
}

impl McpClients {
    /// Changes each time a server says its tools changed (`notifications/tools/list_changed`).
    pub fn tools_changed(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The tools `server` (of `agent`) lists, every page of them; opens the session later
    /// calls use.
    pub async fn list_tools(
        &self,
        agent: &str,
        server: &McpServerDef,
    ) -> Result<Vec<McpTool>, McpError> {
        let session = self.session(agent, server);
        let timeout = session.timeout();
        let peer = session.peer().await?;
        let tools = tokio::time::timeout(timeout, peer.list_all_tools())
            .await
            .map_err(|_| McpError::Timeout(session.server.timeout_ms))?;
        let tools = session.checked(tools).await?;
        tools
            .into_iter()
            .map(|tool| {
                let json = serde_json::to_value(&tool).expect("tools serialize");
                serde_json::from_value(json).map_err(|e| {
                    McpError::Call(format!("tool {:?} is not described right: {e}", tool.name))
                })
            })
            .collect()
    }

    /// Calls `tool` of `agent`'s server `server` with `arguments` and `meta` (`_meta`);
    /// answers MCP's `CallToolResult` as JSON.
    pub async fn call(
        &self,
        agent: &str,
        server: &McpServerDef,
        tool: &str,
        arguments: &Value,
        meta: Map<String, Value>,
    ) -> Result<Value, McpError> {
        let session = self.session(agent, server);
        let params: CallToolRequestParams = serde_json::from_value(json!({
            "name": tool, "arguments": arguments, "_meta": meta,
        }))
        .map_err(|e| McpError::Call(format!("the arguments are not an object: {e}")))?;
        let peer = session.peer().await?;
        let result = tokio::time::timeout(session.timeout(), peer.call_tool(params))
            .await
            .map_err(|_| McpError::Timeout(session.server.timeout_ms))?;
        let result = session.checked(result).await?;
        Ok(serde_json::to_value(result).expect("results serialize"))
    }

    fn session(&self, agent: &str, server: &McpServerDef) -> Arc<Session> {
        let mut sessions = self.sessions.lock().unwrap();
        sessions
            .entry(format!("{agent}/{}", server.name))
            .or_insert_with(|| {
                Arc::new(Session {
                    server: server.clone(),
                    state: Default::default(),
                    changed: self.changed.clone(),
                })
            })
            .clone()
    }
}

impl Session {
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.server.timeout_ms)
    }

    /// The open session's peer, opening it first if there is none (or it closed).
    async fn peer(&self) -> Result<Peer<RoleClient>, McpError> {
        let mut state = self.state.lock().await;
        if let Some(client) = &state.client
            && !client.is_closed()
        {
            return Ok(client.peer().clone());
        }
        if let Some(at) = state.retry_at
            && let Some(wait) = at.checked_duration_since(Instant::now())
        {
            return Err(McpError::BackingOff {
                failures: state.failures,
                wait_ms: wait.as_millis() as u64,
            });
        }
        match tokio::time::timeout(self.timeout(), self.connect()).await {
            Ok(Ok(client)) => {
                let peer = client.peer().clone();
                let protocol = peer.peer_info().map(|i| i.protocol_version.to_string());
                tracing::info!(server = %self.server.name, protocol, "MCP session open");
                *state = State {
                    client: Some(client),
                    ..State::default()
                };
                Ok(peer)
            }
            Ok(Err(e)) => Err(state.failed(e)),
            Err(_) => Err(state.failed(McpError::Timeout(self.server.timeout_ms))),
        }
    }

    async fn connect(&self) -> Result<RunningService<RoleClient, Listener>, McpError> {
        let info = Listener {
            info: ClientConfig::new(
                Default::default(),
                Implementation::new("countersign", env!("CARGO_PKG_VERSION")),
            ),
            changed: self.changed.clone(),
        };
        let connected = match (&self.server.url, &self.server.command) {
            (Some(url), _) => {
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(resolve_headers(&self.server.headers)?)
                    .reinit_on_expired_session(true);
                info.serve(StreamableHttpClientTransport::from_config(config))
                    .await
            }
            (None, Some(command)) => {
                let mut process = tokio::process::Command::new(&command[0]);
                process.args(&command[1..]);
                let transport = TokioChildProcess::new(process)
                    .map_err(|e| McpError::Connect(format!("cannot start {command:?}: {e}")))?;
                info.serve(transport).await
            }
            (None, None) => return Err(McpError::Config("no url or command".into())),
        };
        connected.map_err(|e| McpError::Connect(e.to_string()))
    }

    /// Passes a request's outcome on; a transport failure drops the session, so the next
    /// request opens a new one (after the backoff).
    async fn checked<T>(&self, outcome: Result<T, ServiceError>) -> Result<T, McpError> {
        match outcome {
            Ok(value) => Ok(value),
            Err(ServiceError::McpError(e)) => Err(McpError::Call(e.message.to_string())),
            Err(e) => {
                let mut state = self.state.lock().await;
                state.client = None;
                Err(state.failed(McpError::Connect(e.to_string())))
            }
        }
    }
}

impl State {
    fn failed(&mut self, error: McpError) -> McpError {
        self.client = None;
        self.failures += 1;
        let backoff = FIRST_BACKOFF
            .saturating_mul(1 << self.failures.min(16).saturating_sub(1))
            .min(MAX_BACKOFF);
        self.retry_at = Some(Instant::now() + backoff);
        error
    }
}

/// The headers to send, with `${NAME}` taken from the environment and `${file:PATH}` from a
/// file (its content, trimmed), so secrets stay out of agent files.
fn resolve_headers(
    headers: &std::collections::BTreeMap<String, String>,
) -> Result<HashMap<http::HeaderName, http::HeaderValue>, McpError> {
    headers
        .iter()
        .map(|(name, template)| {
            let value = fill(template)?;
            let name = http::HeaderName::try_from(name.as_str())
                .map_err(|e| McpError::Config(format!("header {name:?}: {e}")))?;
            let value = http::HeaderValue::try_from(value)
                .map_err(|e| McpError::Config(format!("header {name}: {e}")))?;
            Ok((name, value))
        })
        .collect()
}

fn fill(template: &str) -> Result<String, McpError> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find('}') else {
            return Err(McpError::Config(format!("unclosed ${{ in {template:?}")));
        };
        let reference = &rest[start + 2..start + len];
        let value = match reference.strip_prefix("file:") {
            Some(path) => std::fs::read_to_string(path)
                .map(|text| text.trim().to_string())
                .map_err(|e| McpError::Config(format!("cannot read {path}: {e}")))?,
            None => std::env::var(reference)
                .map_err(|_| McpError::Config(format!("the environment has no {reference}")))?,
        };
        out.push_str(&value);
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_come_from_the_environment_and_files() {
        let dir = std::env::temp_dir().join(format!("mcp-headers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        // PATH is set in every environment tests run in.
        let path = std::env::var("PATH").unwrap();
        assert_eq!(fill("Bearer ${PATH}").unwrap(), format!("Bearer {path}"));
        assert_eq!(
            fill(&format!("x ${{file:{}}} y", file.display())).unwrap(),
            "x from-file y"
        );
        assert_eq!(fill("plain").unwrap(), "plain");
        assert!(fill("${COUNTERSIGN_SURELY_UNSET_VARIABLE}").is_err());
        assert!(fill("${unclosed").is_err());
    }

    #[test]
    fn backoff_doubles_to_a_ceiling() {
        let mut state = State::default();
        let mut waits = Vec::new();
        for _ in 0..12 {
            state.failed(McpError::Connect("down".into()));
            let wait = state.retry_at.unwrap() - Instant::now();
            waits.push(wait);
        }
        assert!(waits[0] <= FIRST_BACKOFF);
        assert!(waits[1] > FIRST_BACKOFF && waits[1] <= FIRST_BACKOFF * 2);
        assert!(waits.iter().all(|w| *w <= MAX_BACKOFF));
        assert!(waits[11] > MAX_BACKOFF / 2);
        assert_eq!(state.failures, 12);
    }
}
