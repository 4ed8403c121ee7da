//! Agent definitions: one TOML file per agent, with its model, its tools and each tool's
//! approval policy. Both services load the same directory: the worker to run agents, the
//! gateway to refuse unknown agents and to check reviewers' edits against tool schemas.

use crate::approval::{ApprovalDef, Channel, OnExpiry, Reviewers, Risk};
use crate::digest::{canonical_json, sha256_hex};
use crate::edit;
use crate::input_problem::InputProblem;
use crate::mcp::{self, McpServerDef, McpTool};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An agent as its TOML file defines it: its model, its tools and their approval policies.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentDef {
    /// The agent's name, as runs and the API ask for it; unique in its directory.
    pub name: String,
    /// The system prompt; none for an `mcp_client` agent, whose model is not a language
    /// model.
    #[serde(default)]
    pub system: String,
    /// How many model calls one run may make before it fails.
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
    /// The model the agent talks to (`[model]`).
    pub model: ModelDef,
    /// The tools the agent may call (`[[tools]]`), its own HTTP tools and the policies of its
    /// MCP servers' tools.
    #[serde(default)]
    pub tools: Vec<ToolDef>,
    /// MCP servers whose tools the agent uses besides its own `tools`.
    #[serde(default)]
    pub mcp_servers: Vec<McpServerDef>,
}

impl AgentDef {
    /// The definition in `text`, a TOML agent file, as written (its MCP tools not yet taken
    /// in).
    pub fn parse(text: &str) -> Result<Self, AgentError> {
        toml::from_str(text).map_err(|e| AgentError::Parse(e.to_string()))
    }

    /// Makes the tools of its MCP servers its own, from what each server listed: an entry in
    /// `tools` naming a server takes its description and schema from it, and every other tool
    /// the agent selects gets the default policy. A tool nobody found, or found twice, refuses
    /// the file.
    fn take_mcp_tools(
        &mut self,
        discovered: &BTreeMap<String, Vec<McpTool>>,
    ) -> Result<(), AgentError> {
        let servers = listed_servers(&self.mcp_servers, discovered)?;
        let shared = shared_names(&servers)?;
        let exposed = |server: &str, tool: &str| match shared.contains(tool) {
            true => format!("{server}__{tool}"),
            false => tool.to_string(),
        };
        for tool in &mut self.tools {
            let err = |error: String| AgentError::Policy {
                tool: tool.name.clone(),
                error,
            };
            match (&tool.http, &tool.mcp) {
                (Some(_), None) if tool.input_schema.is_null() => {
                    return Err(err("an HTTP tool needs an input_schema".into()));
                }
                (Some(_), None) => {}
                // An external agent's tool without an endpoint is run by the agent itself.
                (None, None) if self.model.provider == Provider::External => {
                    if tool.input_schema.is_null() {
                        return Err(err("an external agent's tool needs an input_schema".into()));
                    }
                }
                (None, Some(name)) => {
                    let Some((server, listed)) = servers.get(name.as_str()) else {
                        return Err(err(format!(
                            "mcp = {name:?} names no [[mcp_servers]] entry"
                        )));
                    };
                    let Some(found) = listed.iter().find(|t| t.name == tool.name) else {
                        return Err(err(format!("the MCP server {name:?} lists no such tool")));
                    };
                    if !server.selects(&tool.name) {
                        return Err(err(format!(
                            "it is not among the tools the agent takes from {name:?}"
                        )));
                    }
                    if !tool.description.is_empty() || !tool.input_schema.is_null() {
                        return Err(err(
                            "an MCP tool's description and input_schema come from its server"
                                .into(),
                        ));
                    }
                    tool.description = described(found);
                    tool.input_schema = found.input_schema.clone();
                    tool.discovered = Some(found.clone());
                    tool.risk = tool.risk.or_else(|| mcp::default_risk(server, found));
                    tool.name = exposed(name, &found.name);
                }
                _ => return Err(err("give either http or mcp, not both".into())),
            }
        }
        for (server, listed) in servers.values() {
            for found in listed.iter().filter(|t| server.selects(&t.name)) {
                let own = |t: &&ToolDef| {
                    t.mcp.as_deref() == Some(server.name.as_str()) && t.called() == found.name
                };
                if self.tools.iter().any(|t| own(&t)) {
                    continue;
                }
                self.tools.push(ToolDef {
                    name: exposed(&server.name, &found.name),
                    description: described(found),
                    input_schema: found.input_schema.clone(),
                    http: None,
                    mcp: Some(server.name.clone()),
                    discovered: Some(found.clone()),
                    approval: mcp::default_approval(server, found),
                    shadow: None,
                    reviewer: None,
                    audience: None,
                    idempotent: mcp::default_idempotent(server, found),
                    risk: mcp::default_risk(server, found),
                });
            }
        }
        Ok(())
    }

    /// A language model needs its name; an `mcp_client` agent fronts MCP servers, so it has
    /// at least one and no tool of another kind (its client could not be told of one).
    fn check_model(&self) -> Result<(), AgentError> {
        let refuse = |error: &str| Err(AgentError::Model(error.to_string()));
        match self.model.provider {
            Provider::McpClient if self.mcp_servers.is_empty() => {
                refuse("an mcp_client agent needs at least one [[mcp_servers]] entry")
            }
            Provider::McpClient if self.tools.iter().any(|t| t.mcp.is_none()) => {
                refuse("an mcp_client agent's tools all come from its MCP servers")
            }
            Provider::McpClient => Ok(()),
            Provider::External => Ok(()),
            _ if self.model.name.trim().is_empty() => refuse("the model needs a name"),
            _ => Ok(()),
        }
    }

    /// The MCP server of this name.
    pub fn mcp_server(&self, name: &str) -> Option<&McpServerDef> {
        self.mcp_servers.iter().find(|s| s.name == name)
    }
}

/// What the model is told an MCP tool does: its description, else its title.
fn described(tool: &McpTool) -> String {
    tool.description
        .clone()
        .or_else(|| tool.title.clone())
        .unwrap_or_default()
}

fn default_max_turns() -> u32 {
    10
}

/// Whose API the agent's model is reached through, as `provider` names it in `[model]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// Anthropic's Messages API.
    Anthropic,
    /// OpenAI's Chat Completions API, or a server that speaks it (`openai` in files).
    Openai,
    /// Canned turns read from a script file beside the agent (see `ModelDef::script`), for
    /// demos and tests.
    Scripted,
    /// No language model: the model is the MCP client on the other side of the gateway's
    /// `/mcp/{agent}`, each of whose `tools/call`s is a run of one call (see
    /// [`crate::mcp_proxy`]).
    McpClient,
    /// No model countersign runs: the agent is written in code and runs elsewhere, and asks
    /// at the gateway's `POST /v1/agents/{agent}/calls` before each call, each a run of one
    /// call (see [`crate::door`]).
    External,
}

impl Provider {
    /// Its name in agent files (and metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::Openai => "openai",
            Provider::Scripted => "scripted",
            Provider::McpClient => "mcp_client",
            Provider::External => "external",
        }
    }
}

/// The `[model]` table of an agent file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelDef {
    /// Whose API the model is reached through.
    pub provider: Provider,
    /// The model's name at its provider; not needed for `mcp_client`.
    #[serde(default)]
    pub name: String,
    /// The most tokens one model answer may use; default 1024.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// For `scripted`: the file of canned turns, relative to the agent file.
    #[serde(default)]
    pub script: Option<PathBuf>,
    /// For `anthropic` and `openai`: the API's base URL, over `ANTHROPIC_BASE_URL` /
    /// `OPENAI_BASE_URL`.
    #[serde(default)]
    pub base_url: Option<String>,
}

fn default_max_tokens() -> u32 {
    1024
}

/// One tool of an agent (a `[[tools]]` entry), and the policy deciding when its calls wait for
/// a person.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    /// The tool's name, as the model calls it.
    pub name: String,
    /// What the model is told the tool does; an MCP tool's comes from its server.
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of the tool's input; an MCP tool's comes from its server.
    #[serde(default)]
    pub input_schema: Value,
    /// Where an HTTP tool is called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpToolDef>,
    /// For a tool of an MCP server: the server's name in `mcp_servers`. Its entry in `tools`
    /// gives it a policy; without one it gets [`mcp::default_approval`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<String>,
    /// For a tool of an MCP server: what its server's `tools/list` said of it when the agent
    /// loaded, part of the policy version.
    #[serde(skip_deserializing, default, skip_serializing_if = "Option::is_none")]
    pub discovered: Option<McpTool>,
    /// When a person must approve a call. Absent means `always`: a tool nobody classified
    /// is treated as risky.
    #[serde(default)]
    pub approval: ApprovalDef,
    /// A candidate policy watched next to `approval` on real traffic: every call is sorted
    /// by both, `approval` decides, and where they differ the difference is recorded. Not part
    /// of the policy version: adding or changing it changes no call's terms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ApprovalDef>,
    /// A reviewer model that looks at the calls the policy holds, inside an envelope (see
    /// [`crate::reviewer`]). Live, it decides, so its terms are part of the policy version;
    /// in shadow it changes no call's terms, and is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reviewer: Option<crate::reviewer::ReviewerDef>,
    /// How the tool names itself in the receipts of its approved calls (their `aud`); the
    /// tool's name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// Whether the tool honours `Idempotency-Key`, so a call whose outcome was lost in a
    /// crash may be sent again with the same key instead of being reported as unknown.
    #[serde(default)]
    pub idempotent: bool,
    /// What its calls do to the world, shown to reviewers and named in receipts; part of the
    /// policy version, since a reviewer decides on it. An MCP tool of a trusted server the
    /// file gives none has the class its annotations say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<Risk>,
}

/// How an HTTP tool is reached (`[tools.http]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolDef {
    /// The URL each call's input is POSTed to.
    pub url: String,
    /// Milliseconds to wait for the tool's answer; default 30000.
    #[serde(default = "default_tool_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_tool_timeout_ms() -> u64 {
    30_000
}

impl ToolDef {
    /// The name the tool's server knows it by: an MCP tool two servers offer the agent is
    /// exposed under its server's prefix, and called by its own name.
    pub fn called(&self) -> &str {
        self.discovered
            .as_ref()
            .map_or(&self.name, |found| &found.name)
    }

    /// The tool's own approval timeout at `stage` (1 without stages), if its policy sets one.
    pub fn approval_timeout(&self, stage: u32) -> Option<std::time::Duration> {
        match &self.approval {
            ApprovalDef::Rule(rule) => match rule.stages.get(stage.max(1) as usize - 1) {
                Some(at) => at.timeout.as_ref().map(|t| t.duration),
                None => rule.timeout.as_ref().map(|t| t.duration),
            },
            ApprovalDef::Mode(_) => None,
        }
    }

    /// Where the tool's held calls are sent.
    pub fn channels(&self) -> Vec<&Channel> {
        match &self.approval {
            ApprovalDef::Rule(rule) => rule
                .channels
                .iter()
                .chain(rule.stages.iter().flat_map(|s| &s.channels))
                .collect(),
            ApprovalDef::Mode(_) => Vec::new(),
        }
    }

    /// Who may decide the tool's held calls, how many must approve, and where they are asked.
    pub fn reviewers(&self) -> Reviewers {
        self.approval.reviewers()
    }

    /// What the policy allows of standing grants on this tool's calls.
    pub fn grant_limits(&self) -> crate::grant::GrantLimits {
        self.approval.grant_limits()
    }

    /// How long before its deadline a held call's approvers are reminded, if at all.
    pub fn remind_before(&self) -> Option<std::time::Duration> {
        match &self.approval {
            ApprovalDef::Rule(rule) => rule.remind_before.as_ref().map(|r| r.duration),
            ApprovalDef::Mode(_) => None,
        }
    }

    fn check_reviewers(&self) -> Result<(), String> {
        if let ApprovalDef::Rule(rule) = &self.approval
            && rule.on_expiry == OnExpiry::Escalate
            && rule.escalate_to.is_empty()
        {
            return Err("on_expiry = \"escalate\" needs escalate_to".into());
        }
        if let Some(why) = self.reviewer.as_ref().and_then(|r| r.refusal(self)) {
            return Err(why);
        }
        let r = self.reviewers();
        if r.quorum == 0
            || self
                .shadow
                .as_ref()
                .is_some_and(|s| s.reviewers().quorum == 0)
        {
            return Err("quorum must be at least 1".into());
        }
        if r.approvers
            .iter()
            .any(|a| a.trim().is_empty() || a.trim() == "role:")
        {
            return Err("an approver entry is empty".into());
        }
        if let Some(limits) = self.approval.limits() {
            crate::limits::check(limits, &r.approvers)?;
        }
        if let ApprovalDef::Rule(rule) = &self.approval {
            crate::stage::check(&rule.stages, rule)?;
        }
        if let Some(windows) = self.approval.windows() {
            crate::window::Window::compile_all(&cel::Env::stdlib(), windows)?;
        }
        Ok(())
    }

    /// Identifies the tool's schema and policy (and an MCP tool's whole definition as its
    /// server gave it): decisions are bound to it through the digest.
    pub fn policy_version(&self) -> String {
        let mut bound = serde_json::json!({
            "name": self.name,
            "input_schema": self.input_schema,
            "approval": self.approval,
        });
        if let Some(discovered) = &self.discovered {
            bound["mcp"] = serde_json::json!({"server": self.mcp, "tool": discovered});
        }
        if let Some(risk) = self.risk {
            bound["risk"] = serde_json::json!(risk);
        }
        if let Some(reviewer) = self.reviewer.as_ref().filter(|r| r.decides()) {
            bound["reviewer"] = reviewer.bound();
        }
        sha256_hex(canonical_json(&bound))[..16].to_string()
    }
}

/// An agent with its tools' schemas compiled.
pub struct Agent {
    /// The definition as its file gives it, MCP tools taken in.
    pub def: AgentDef,
    /// Hash of the definition file, stored on each run.
    pub version: String,
    /// The folder the file was in, for paths inside it.
    pub dir: PathBuf,
    /// The file's text, as it was read: a suggested change is made to it, comments kept.
    pub source: String,
    validators: BTreeMap<String, jsonschema::Validator>,
}

impl Agent {
    /// An agent file without MCP servers (one with them needs [`Agent::from_def`] and what
    /// discovery found).
    pub fn from_toml(text: &str, dir: &Path) -> Result<Self, AgentError> {
        Self::from_def(text, AgentDef::parse(text)?, dir, &BTreeMap::new())
    }

    /// The agent of the file `text`, parsed as `def`, with the tools each of its MCP servers
    /// listed (by server name). The discovered tools are part of its version.
    pub fn from_def(
        text: &str,
        mut def: AgentDef,
        dir: &Path,
        discovered: &BTreeMap<String, Vec<McpTool>>,
    ) -> Result<Self, AgentError> {
        def.take_mcp_tools(discovered)?;
        def.check_model()?;
        let version = if def.mcp_servers.is_empty() {
            sha256_hex(text)
        } else {
            let listed = serde_json::to_value(discovered).expect("tools serialize");
            sha256_hex(format!("{text}\n{}", canonical_json(&listed)))
        };
        let mut validators = BTreeMap::new();
        for tool in &def.tools {
            tool.check_reviewers().map_err(|error| AgentError::Policy {
                tool: tool.name.clone(),
                error,
            })?;
            let v =
                jsonschema::validator_for(&tool.input_schema).map_err(|e| AgentError::Schema {
                    tool: tool.name.clone(),
                    error: e.to_string(),
                })?;
            if validators.insert(tool.name.clone(), v).is_some() {
                return Err(AgentError::DuplicateTool(tool.name.clone()));
            }
        }
        Ok(Self {
            version: version[..12].to_string(),
            dir: dir.to_path_buf(),
            source: text.to_string(),
            def,
            validators,
        })
    }

    /// The agent's tool of this name, if it has one.
    pub fn tool(&self, name: &str) -> Option<&ToolDef> {
        self.def.tools.iter().find(|t| t.name == name)
    }

    /// What is wrong with an input for the tool, in a reviewer's words; empty when it fits
    /// the tool's schema (an unknown tool fits nothing).
    pub fn input_problems(&self, tool: &str, input: &Value) -> Vec<InputProblem> {
        let Some(validator) = self.validators.get(tool) else {
            return vec![InputProblem {
                field: String::new(),
                message: format!("unknown tool {tool:?}"),
            }];
        };
        validator
            .iter_errors(input)
            .map(|e| InputProblem::from_schema(&e))
            .collect()
    }

    /// Checks an input against the tool's schema; the errors say where and what is wrong,
    /// in the words of [`Self::input_problems`].
    pub fn validate_input(&self, tool: &str, input: &Value) -> Result<(), Vec<String>> {
        let problems = self.input_problems(tool, input);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.iter().map(ToString::to_string).collect())
        }
    }

    /// What is wrong with a reviewer's edit of a call of `tool` holding `held`: a field
    /// changed that the tool does not take (see [`crate::edit`]), then whatever the schema
    /// says of the edited input.
    pub fn edit_problems(&self, tool: &str, held: &Value, edited: &Value) -> Vec<InputProblem> {
        let schema = self.tool(tool).map(|t| &t.input_schema);
        let editable = edit::editable_fields(schema.unwrap_or(&Value::Null), held);
        let changes = edit::changes(held, edited);
        let mut problems = match schema {
            Some(_) => {
                edit::unknown_fields(tool, &editable, changes.iter().map(|c| c.field.as_str()))
            }
            None => Vec::new(),
        };
        problems.extend(self.input_problems(tool, edited));
        problems
    }
}

/// Why an agent file, or a directory of them, could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The file could not be read.
    #[error("cannot read {path}: {error}")]
    Read {
        /// The file that could not be read.
        path: PathBuf,
        /// Why reading it failed.
        error: std::io::Error,
    },
    /// The file is not a valid agent definition in TOML; the parser's message.
    #[error("invalid agent definition: {0}")]
    Parse(String),
    /// A tool's `input_schema` is not a valid JSON Schema.
    #[error("tool {tool:?} has an invalid input_schema: {error}")]
    Schema {
        /// The tool whose schema it is.
        tool: String,
        /// What is wrong with the schema.
        error: String,
    },
    /// A tool's approval policy, or how it is reached, is invalid.
    #[error("tool {tool:?} has an invalid approval policy: {error}")]
    Policy {
        /// The tool whose policy it is.
        tool: String,
        /// What is wrong with it.
        error: String,
    },
    /// The `[model]` table does not fit its provider; what is wrong with it.
    #[error("[model]: {0}")]
    Model(String),
    /// An `mcp_servers` entry is invalid, or the tools asked of it do not fit what it listed.
    #[error("MCP server {server:?}: {error}")]
    Mcp {
        /// The server's name in `mcp_servers`.
        server: String,
        /// What is wrong with the entry.
        error: String,
    },
    /// An MCP server could not be asked for its tools while the agent loaded.
    #[error("MCP server {server:?} could not be listed: {error}")]
    Discovery {
        /// The server's name in `mcp_servers`.
        server: String,
        /// Why listing its tools failed.
        error: String,
    },
    /// Two tools of one agent have this name.
    #[error("tool {0:?} is defined twice")]
    DuplicateTool(String),
    /// Two files of the directory define an agent of this name.
    #[error("agent {0:?} is defined twice")]
    DuplicateAgent(String),
    /// An error in one file of the agents directory, naming it.
    #[error("{path}: {error}")]
    InFile {
        /// The file the error is in.
        path: PathBuf,
        /// What is wrong with it.
        error: Box<AgentError>,
    },
}

/// Every agent of a directory, by name.
#[derive(Clone, Default)]
pub struct Catalog {
    agents: Arc<BTreeMap<String, Arc<Agent>>>,
}

/// Files in the agents directory that hold a scripted model's turns, not an agent.
pub const SCRIPT_SUFFIX: &str = ".script.toml";

impl Catalog {
    /// The agents of a directory's files, in the order they were read (reading them, and
    /// asking their MCP servers for tools, is the runtime's part).
    pub fn new(loaded: impl IntoIterator<Item = Agent>) -> Result<Self, AgentError> {
        let mut agents = BTreeMap::new();
        for agent in loaded {
            let name = agent.def.name.clone();
            if agents.insert(name.clone(), Arc::new(agent)).is_some() {
                return Err(AgentError::DuplicateAgent(name));
            }
        }
        Ok(Self {
            agents: Arc::new(agents),
        })
    }

    /// The agent of this name, kept alive by the caller even if the catalog is replaced.
    pub fn get(&self, name: &str) -> Option<Arc<Agent>> {
        self.agents.get(name).cloned()
    }

    /// Every agent, in order of name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Agent>> {
        self.agents.values()
    }
}

/// The names of tools more than one of the agent's servers offer it: each is exposed as
/// `SERVER__NAME` (the prefix of the server's name), so that neither is refused and neither
/// shadows the other. A server whose name cannot be part of a tool's name refuses the file.
fn shared_names<'a>(
    servers: &BTreeMap<&str, (&McpServerDef, &'a [McpTool])>,
) -> Result<BTreeSet<&'a str>, AgentError> {
    let mut offered = BTreeMap::<&str, Vec<&McpServerDef>>::new();
    for (server, listed) in servers.values() {
        for found in listed.iter().filter(|t| server.selects(&t.name)) {
            offered.entry(found.name.as_str()).or_default().push(server);
        }
    }
    let mut shared = BTreeSet::new();
    for (name, by) in offered.into_iter().filter(|(_, by)| by.len() > 1) {
        let bad = by.iter().find(|s| !crate::run::plain(&s.name));
        if let Some(server) = bad {
            return Err(AgentError::Mcp {
                server: server.name.clone(),
                error: format!(
                    "lists {name:?} as another server does, so the tool is named after the \
                     server; a server's name in a tool's name holds only letters, digits, _ and -"
                ),
            });
        }
        shared.insert(name);
    }
    Ok(shared)
}

/// Each server of an agent by name, with the tools it listed (none if it listed nothing): a
/// server that is not usable, defined twice, or does not list a tool it is restricted to
/// refuses the file.
fn listed_servers<'a>(
    servers: &'a [McpServerDef],
    discovered: &'a BTreeMap<String, Vec<McpTool>>,
) -> Result<BTreeMap<&'a str, (&'a McpServerDef, &'a [McpTool])>, AgentError> {
    let mut listed_by_name = BTreeMap::new();
    for server in servers {
        server.check().map_err(|error| AgentError::Mcp {
            server: server.name.clone(),
            error,
        })?;
        let listed = discovered.get(&server.name).map_or(&[][..], Vec::as_slice);
        if listed_by_name
            .insert(server.name.as_str(), (server, listed))
            .is_some()
        {
            return Err(AgentError::Mcp {
                server: server.name.clone(),
                error: "is defined twice".into(),
            });
        }
        if let mcp::ToolSelection::Only(names) = &server.tools
            && let Some(missing) = names.iter().find(|n| !listed.iter().any(|t| &t.name == *n))
        {
            return Err(AgentError::Mcp {
                server: server.name.clone(),
                error: format!("lists no tool {missing:?}"),
            });
        }
    }
    Ok(listed_by_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::ApprovalMode;

    const REFUNDS: &str = r#"
name = "refunds"
system = "Be careful."

[model]
provider = "anthropic"
name = "claude-sonnet-4-5"

[[tools]]
name = "get_order"
description = "Look up an order."
input_schema = { type = "object", properties = { order_id = { type = "string" } }, required = ["order_id"] }
http = { url = "http://127.0.0.1:9100/orders/lookup" }
approval = "never"

[[tools]]
name = "issue_refund"
description = "Refund."
input_schema = { type = "object", properties = { amount = { type = "number" } }, required = ["amount"] }
http = { url = "http://127.0.0.1:9100/refunds" }
[tools.approval]
when = "input.amount > 20.0"
reason = "moves money"
approvers = ["role:finance", "alice"]
quorum = 2
channels = ["slack:#refunds", "webhook:ops"]
"#;

    #[test]
    fn the_documented_shape_loads_with_defaults() {
        let agent = Agent::from_toml(REFUNDS, Path::new(".")).unwrap();
        assert_eq!(agent.def.max_turns, 10);
        assert_eq!(agent.def.model.max_tokens, 1024);
        assert!(matches!(
            agent.tool("get_order").unwrap().approval,
            ApprovalDef::Mode(ApprovalMode::Never)
        ));
        let refund = agent.tool("issue_refund").unwrap();
        match &refund.approval {
            ApprovalDef::Rule(r) => assert_eq!(r.when, "input.amount > 20.0"),
            other => panic!("expected a rule, got {other:?}"),
        }
        let reviewers = refund.reviewers();
        assert_eq!(reviewers.approvers, ["role:finance", "alice"]);
        assert_eq!(reviewers.quorum, 2);
        assert!(!reviewers.allow_self_approval);
        assert_eq!(
            agent.tool("get_order").unwrap().reviewers(),
            Reviewers::default()
        );
    }

    #[test]
    fn inputs_are_checked_against_the_tool_schema() {
        let agent = Agent::from_toml(REFUNDS, Path::new(".")).unwrap();
        assert!(
            agent
                .validate_input("issue_refund", &serde_json::json!({"amount": 49}))
                .is_ok()
        );
        let errors = agent
            .validate_input("issue_refund", &serde_json::json!({"amount": "lots"}))
            .unwrap_err();
        assert_eq!(errors, ["amount: must be a number"]);
    }

    #[test]
    fn a_bad_quorum_or_channel_is_refused() {
        for bad in [
            "quorum = 0",
            "channels = [\"sms:123\"]",
            "timeout = \"soon\"",
        ] {
            let text = REFUNDS.replace("quorum = 2", bad);
            assert!(Agent::from_toml(&text, Path::new(".")).is_err(), "{bad}");
        }
    }

    const SHOP: &str = r#"
name = "shop"
system = "s"
[model]
provider = "scripted"
name = "m"

[[mcp_servers]]
name = "orders"
url = "http://127.0.0.1:1/mcp"
trusted = true

[[tools]]
name = "issue_refund"
mcp = "orders"
[tools.approval]
when = "input.amount > 20.0"
"#;

    fn listed(tools: &[(&str, serde_json::Value)]) -> BTreeMap<String, Vec<McpTool>> {
        let tools = tools
            .iter()
            .map(|(name, annotations)| {
                serde_json::from_value(serde_json::json!({
                    "name": name, "description": format!("{name} does things"),
                    "inputSchema": {"type": "object", "properties": {"amount": {"type": "number"}}},
                    "annotations": annotations,
                }))
                .unwrap()
            })
            .collect();
        BTreeMap::from([("orders".to_string(), tools)])
    }

    fn shop(text: &str, found: &BTreeMap<String, Vec<McpTool>>) -> Result<Agent, AgentError> {
        Agent::from_def(text, AgentDef::parse(text)?, Path::new("."), found)
    }

    #[test]
    fn an_agent_takes_the_tools_its_mcp_servers_list() {
        let found = listed(&[
            ("issue_refund", serde_json::json!({"readOnlyHint": true})),
            (
                "get_order",
                serde_json::json!({"readOnlyHint": true, "idempotentHint": true}),
            ),
            ("cancel_order", serde_json::json!({})),
        ]);
        let agent = shop(SHOP, &found).unwrap();
        // Its own entry is its policy, whatever the server hints.
        let refund = agent.tool("issue_refund").unwrap();
        assert!(
            matches!(&refund.approval, ApprovalDef::Rule(r) if r.when == "input.amount > 20.0")
        );
        assert_eq!(refund.description, "issue_refund does things");
        assert!(!refund.idempotent);
        let lookup = agent.tool("get_order").unwrap();
        assert!(matches!(
            lookup.approval,
            ApprovalDef::Mode(ApprovalMode::Never)
        ));
        assert!(lookup.idempotent);
        assert_eq!(lookup.mcp.as_deref(), Some("orders"));
        let cancel = agent.tool("cancel_order").unwrap();
        assert!(matches!(&cancel.approval, ApprovalDef::Rule(r) if r.when == "always"));
        assert!(
            agent
                .validate_input("get_order", &serde_json::json!({"amount": "x"}))
                .is_err()
        );
    }

    /// SHOP with a second server, `billing`, whose tools the agent takes as they are, save
    /// the default policy its entry gives.
    fn two_shops() -> String {
        format!(
            "{SHOP}\n[[mcp_servers]]\nname = \"billing\"\nurl = \"http://127.0.0.1:2/mcp\"\n\
             approval = \"never\"\n"
        )
    }

    #[test]
    fn a_tool_two_servers_list_is_exposed_under_each_server_s_prefix() {
        let mut found = listed(&[
            ("issue_refund", serde_json::json!({})),
            ("get_order", serde_json::json!({"readOnlyHint": true})),
        ]);
        let billing = found["orders"]
            .iter()
            .cloned()
            .chain(listed(&[("invoice", serde_json::json!({}))])["orders"].clone())
            .collect();
        found.insert("billing".into(), billing);
        let agent = shop(&two_shops(), &found).unwrap();
        let mut names: Vec<&str> = agent.def.tools.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "billing__get_order",
                "billing__issue_refund",
                "invoice",
                "orders__get_order",
                "orders__issue_refund",
            ]
        );
        // Each is called by its own name on its own server; the agent's own entry is the
        // policy of the server it names only.
        let ours = agent.tool("orders__issue_refund").unwrap();
        assert_eq!(
            (ours.called(), ours.mcp.as_deref()),
            ("issue_refund", Some("orders"))
        );
        assert!(matches!(&ours.approval, ApprovalDef::Rule(r) if r.when == "input.amount > 20.0"));
        // The other server's tools take the default its entry gives, hints or not.
        let theirs = agent.tool("billing__issue_refund").unwrap();
        assert_eq!(
            (theirs.called(), theirs.mcp.as_deref()),
            ("issue_refund", Some("billing"))
        );
        assert!(matches!(
            theirs.approval,
            ApprovalDef::Mode(ApprovalMode::Never)
        ));
        assert!(matches!(
            agent.tool("invoice").unwrap().approval,
            ApprovalDef::Mode(ApprovalMode::Never)
        ));
        // A server whose name cannot prefix a tool's name refuses the file.
        let spaced = two_shops().replace("name = \"billing\"", "name = \"the billing\"");
        let billing = found.remove("billing").unwrap();
        found.insert("the billing".into(), billing);
        let Err(refused) = shop(&spaced, &found) else {
            panic!("a server named with a space prefixes no tool");
        };
        let refused = refused.to_string();
        assert!(refused.contains("letters, digits"), "{refused}");
    }

    #[test]
    fn what_a_server_lists_is_part_of_the_versions() {
        let before = listed(&[
            ("issue_refund", serde_json::json!({})),
            ("get_order", serde_json::json!({})),
        ]);
        let mut after = before.clone();
        after.get_mut("orders").unwrap()[1].description = Some("changed".into());
        let (a, b) = (shop(SHOP, &before).unwrap(), shop(SHOP, &after).unwrap());
        assert_ne!(a.version, b.version);
        let version = |agent: &Agent, tool| agent.tool(tool).unwrap().policy_version();
        assert_ne!(version(&a, "get_order"), version(&b, "get_order"));
        assert_eq!(version(&a, "issue_refund"), version(&b, "issue_refund"));
        let mut added = before.clone();
        let mut new_tool = after["orders"][1].clone();
        new_tool.name = "new_tool".into();
        added.get_mut("orders").unwrap().push(new_tool);
        let c = shop(SHOP, &added).unwrap();
        assert_ne!(a.version, c.version);
        assert!(c.tool("new_tool").is_some());
    }

    #[test]
    fn mcp_tools_the_server_does_not_list_refuse_the_file() {
        let found = listed(&[("get_order", serde_json::json!({}))]);
        // The agent's own entry names a tool the server does not have.
        assert!(shop(SHOP, &found).is_err());
        let both = listed(&[("issue_refund", serde_json::json!({}))]);
        for bad in [
            SHOP.replace("mcp = \"orders\"", "mcp = \"elsewhere\""),
            SHOP.replace(
                "mcp = \"orders\"",
                "mcp = \"orders\"\ndescription = \"mine\"",
            ),
            SHOP.replace(
                "mcp = \"orders\"",
                "mcp = \"orders\"\nhttp = { url = \"http://x\" }",
            ),
            SHOP.replace("trusted = true", "trusted = true\ntools = [\"get_order\"]"),
            SHOP.replace("url = \"http://127.0.0.1:1/mcp\"", ""),
        ] {
            assert!(shop(&bad, &both).is_err(), "{bad}");
        }
        let only = SHOP.replace(
            "trusted = true",
            "trusted = true\ntools = [\"issue_refund\"]",
        );
        let more = listed(&[
            ("issue_refund", serde_json::json!({})),
            ("get_order", serde_json::json!({})),
        ]);
        let agent = shop(&only, &more).unwrap();
        assert!(agent.tool("get_order").is_none());
    }

    #[test]
    fn an_mcp_client_agent_fronts_mcp_servers_and_needs_no_model_name_or_prompt() {
        let proxy = "name = \"shop\"\n[model]\nprovider = \"mcp_client\"\n\n[[mcp_servers]]\nname = \"orders\"\nurl = \"http://127.0.0.1:1/mcp\"\n";
        let found = listed(&[("issue_refund", serde_json::json!({}))]);
        let agent = shop(proxy, &found).unwrap();
        assert_eq!(agent.def.model.provider, Provider::McpClient);
        assert!(agent.tool("issue_refund").is_some());
        let without_servers = "name = \"shop\"\n[model]\nprovider = \"mcp_client\"\n";
        assert!(shop(without_servers, &found).is_err());
        let with_http = format!(
            "{proxy}\n[[tools]]\nname = \"h\"\ninput_schema = {{ type = \"object\" }}\nhttp = {{ url = \"http://x\" }}\n"
        );
        assert!(shop(&with_http, &found).is_err());
        // A language model still needs its name.
        let unnamed = SHOP.replace("name = \"m\"\n", "");
        assert!(matches!(shop(&unnamed, &found), Err(AgentError::Model(_))));
    }

    #[test]
    fn an_unknown_field_is_refused() {
        let text = REFUNDS
            .replace("max_turns", "x")
            .replace("system =", "sytem =");
        assert!(Agent::from_toml(&text, Path::new(".")).is_err());
    }
}
