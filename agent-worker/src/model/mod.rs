//! The language models: the Anthropic Messages API, the OpenAI Chat Completions API, and a
//! scripted model that replays canned turns; and, for an `mcp_client` agent, the model that
//! asks for the one call an MCP client sent (`countersign_model::mcp_proxy`). Each takes the
//! provider-neutral conversation and answers with the assistant's blocks (text and tool_use).

mod anthropic;
mod openai;

use countersign_model::agent::{Agent, Provider, ToolDef};
use countersign_model::mcp_proxy;
use countersign_model::run::{Block, Message};
use countersign_model::script::Script;
use countersign_runtime::redact::redact_error;

pub struct ModelRequest<'a> {
    pub model: &'a str,
    pub max_tokens: u32,
    pub system: &'a str,
    pub messages: &'a [Message],
    pub tools: &'a [ToolDef],
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Rate limits, overload, server errors, network trouble: trying again later may work.
    #[error("model unavailable: {0}")]
    Retryable(String),
    /// The request or the answer is wrong; trying again will not help.
    #[error("model error: {0}")]
    Fatal(String),
}

/// Where the HTTP providers are and how to authenticate.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub base_url: String,
    pub api_key: String,
}

impl Endpoint {
    /// The agent's `base_url`, else `{PREFIX}_BASE_URL`; the key from `{PREFIX}_API_KEY`.
    fn from_env(agent: &Agent, prefix: &str, default_base: &str) -> Self {
        let base_url = agent
            .def
            .model
            .base_url
            .clone()
            .or_else(|| std::env::var(format!("{prefix}_BASE_URL")).ok())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default_base.to_string());
        Self {
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key: std::env::var(format!("{prefix}_API_KEY")).unwrap_or_default(),
        }
    }
}

pub enum Model {
    Anthropic(Endpoint),
    OpenAi(Endpoint),
    Scripted(Script),
    /// The MCP client on the other side of the gateway's `/mcp/{agent}`.
    McpClient,
}

impl Model {
    /// The model an agent names, with endpoints from the environment.
    pub fn for_agent(agent: &Agent) -> anyhow::Result<Self> {
        Ok(match agent.def.model.provider {
            Provider::Anthropic => Self::Anthropic(Endpoint::from_env(
                agent,
                "ANTHROPIC",
                "https://api.anthropic.com",
            )),
            Provider::Openai => Self::OpenAi(Endpoint::from_env(
                agent,
                "OPENAI",
                "https://api.openai.com/v1",
            )),
            Provider::Scripted => {
                let path = agent.def.model.script.as_ref().ok_or_else(|| {
                    anyhow::anyhow!(
                        "agent {:?}: a scripted model needs `script`",
                        agent.def.name
                    )
                })?;
                Self::Scripted(load_script(&agent.dir.join(path))?)
            }
            Provider::McpClient => Self::McpClient,
        })
    }

    pub async fn complete(
        &self,
        http: &reqwest::Client,
        req: &ModelRequest<'_>,
    ) -> Result<Vec<Block>, ModelError> {
        match self {
            Self::Anthropic(endpoint) => anthropic::complete(http, endpoint, req).await,
            Self::OpenAi(endpoint) => openai::complete(http, endpoint, req).await,
            Self::Scripted(script) => Ok(script.answer(req.messages)),
            // A run that does not hold a call cannot become one by trying again.
            Self::McpClient => mcp_proxy::answer(req.messages).map_err(ModelError::Fatal),
        }
    }
}

fn load_script(path: &std::path::Path) -> anyhow::Result<Script> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read script {}: {e}", path.display()))?;
    Script::parse(&text).map_err(|e| anyhow::anyhow!("invalid script {}: {e}", path.display()))
}

/// Sends a JSON request and classifies failures by whether a retry can help.
async fn post_json(
    request: reqwest::RequestBuilder,
    body: &serde_json::Value,
) -> Result<serde_json::Value, ModelError> {
    let response = request
        .json(body)
        .send()
        .await
        .map_err(|e| ModelError::Retryable(redact_error(e).to_string()))?;
    let status = response.status();
    let text = response
        .text()
        .await
        .map_err(|e| ModelError::Retryable(redact_error(e).to_string()))?;
    if status.is_success() {
        return serde_json::from_str(&text)
            .map_err(|e| ModelError::Fatal(format!("unreadable answer: {e}")));
    }
    let message = format!("HTTP {status}: {}", truncate(&text, 500));
    if status.as_u16() == 429 || status.is_server_error() {
        Err(ModelError::Retryable(message))
    } else {
        Err(ModelError::Fatal(message))
    }
}

fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}
