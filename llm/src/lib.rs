//! countersign-llm: the language models: the Anthropic Messages API, the OpenAI Chat Completions API, and a
//! scripted model that plays canned turns; and, for an `mcp_client` or an `external` agent,
//! the model that asks for the one call its client sent (`countersign_model::one_call`). Each takes the
//! provider-neutral conversation and answers with the assistant's blocks (text and tool_use).
//!
//! The HTTP providers are asked for a streamed answer (server-sent events), so that the text
//! can be passed on piece by piece as it arrives; what `complete` returns is still the whole
//! turn. A stream that ends before the provider's last event is network trouble, retried
//! like a refused connection: the turn is asked for again from its start.

mod anthropic;
mod openai;
pub mod review;

use countersign_model::agent::{Agent, Provider, ToolDef};
use countersign_model::reviewer::ReviewerDef;
use countersign_model::run::{Block, Message};
use countersign_model::scripted::Script;
use countersign_model::sse;
use countersign_model::{door, mcp_proxy};
use countersign_runtime::redact::redact_error;
use tokio::sync::mpsc::UnboundedSender;

/// What a model is asked: one turn of a conversation.
pub struct ModelRequest<'a> {
    /// The model's name at the provider.
    pub model: &'a str,
    /// The most tokens its answer may take.
    pub max_tokens: u32,
    /// The system prompt.
    pub system: &'a str,
    /// The conversation so far.
    pub messages: &'a [Message],
    /// The tools it may call.
    pub tools: &'a [ToolDef],
    /// The run's metadata, where an `mcp_client` run keeps the call its model asks for;
    /// language models are not sent it.
    pub metadata: &'a serde_json::Value,
}

/// What an answer cost, in the provider's tokens (zero where nobody counts them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Tokens read.
    pub input_tokens: u64,
    /// Tokens written.
    pub output_tokens: u64,
}

/// A model's whole answer: its blocks, and what it cost.
#[derive(Debug)]
pub struct Completion {
    /// The assistant's blocks (text and tool_use).
    pub blocks: Vec<Block>,
    /// What it cost.
    pub usage: Usage,
}

impl Completion {
    /// An answer nobody counted tokens for.
    fn uncounted(blocks: Vec<Block>) -> Self {
        Self {
            blocks,
            usage: Usage::default(),
        }
    }
}

/// Why a model gave no answer.
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
    /// The API's base URL, without a trailing slash.
    pub base_url: String,
    /// The key it is called with.
    pub api_key: String,
}

impl Endpoint {
    /// The agent's `base_url`, else `{PREFIX}_BASE_URL`; the key from `{PREFIX}_API_KEY`.
    fn from_env(agent: &Agent, prefix: &str, default_base: &str) -> Self {
        Self::new(agent.def.model.base_url.as_ref(), prefix, default_base)
    }

    /// `base_url`, else `{PREFIX}_BASE_URL`, else `default_base`; the key from
    /// `{PREFIX}_API_KEY`.
    fn new(base_url: Option<&String>, prefix: &str, default_base: &str) -> Self {
        let base_url = base_url
            .cloned()
            .or_else(|| std::env::var(format!("{prefix}_BASE_URL")).ok())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default_base.to_string());
        Self {
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key: std::env::var(format!("{prefix}_API_KEY")).unwrap_or_default(),
        }
    }
}

/// A model an agent or a reviewer is answered by.
pub enum Model {
    /// Anthropic's Messages API.
    Anthropic(Endpoint),
    /// OpenAI's Chat Completions API.
    OpenAi(Endpoint),
    /// Canned turns (`*.script.toml`), played in-process.
    Scripted(Script),
    /// The MCP client on the other side of the gateway's `/mcp/{agent}`.
    McpClient,
    /// An agent written in code that asks at the gateway's `/v1/agents/{agent}/calls`.
    External,
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
            Provider::External => Self::External,
        })
    }

    /// A tool's reviewer model, with its endpoint from its definition or the environment as
    /// an agent's (the file refuses a reviewer of any other provider).
    pub fn for_reviewer(def: &ReviewerDef) -> Self {
        let base_url = def.base_url.as_ref();
        match def.provider {
            Provider::Openai => Self::OpenAi(Endpoint::new(
                base_url,
                "OPENAI",
                "https://api.openai.com/v1",
            )),
            _ => Self::Anthropic(Endpoint::new(
                base_url,
                "ANTHROPIC",
                "https://api.anthropic.com",
            )),
        }
    }

    /// The assistant's turn. Each piece of its text is sent on `deltas` as it arrives.
    pub async fn complete(
        &self,
        http: &reqwest::Client,
        req: &ModelRequest<'_>,
        deltas: &UnboundedSender<String>,
    ) -> Result<Completion, ModelError> {
        match self {
            Self::Anthropic(endpoint) => anthropic::complete(http, endpoint, req, deltas).await,
            Self::OpenAi(endpoint) => openai::complete(http, endpoint, req, deltas).await,
            Self::Scripted(script) => {
                let blocks = script.answer(req.messages);
                // Word by word, so that a demo without an API key looks like a model's answer.
                for block in &blocks {
                    if let Block::Text { text } = block {
                        text.split_inclusive(char::is_whitespace)
                            .for_each(|word| pass_on(deltas, word));
                    }
                }
                Ok(Completion::uncounted(blocks))
            }
            // A run that does not hold a call cannot become one by trying again.
            Self::McpClient => mcp_proxy::answer(req.metadata, req.messages)
                .map(Completion::uncounted)
                .map_err(ModelError::Fatal),
            Self::External => door::answer(req.metadata, req.messages)
                .map(Completion::uncounted)
                .map_err(ModelError::Fatal),
        }
    }
}

/// Sends a piece of the assistant's text to whoever listens; nobody may be.
fn pass_on(deltas: &UnboundedSender<String>, text: &str) {
    if !text.is_empty() {
        let _ = deltas.send(text.to_string());
    }
}

fn load_script(path: &std::path::Path) -> anyhow::Result<Script> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read script {}: {e}", path.display()))?;
    Script::parse(&text).map_err(|e| anyhow::anyhow!("invalid script {}: {e}", path.display()))
}

/// Sends a JSON request asking for a streamed answer and reads its events with `read` until
/// it returns the whole answer. Failures say whether a retry can help.
async fn stream(
    request: reqwest::RequestBuilder,
    body: &serde_json::Value,
    mut read: impl FnMut(sse::Event) -> Result<Option<Completion>, ModelError>,
) -> Result<Completion, ModelError> {
    let mut response = send(request, body).await?;
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case("text/event-stream") {
        let text = response.text().await.map_err(unavailable)?;
        return Err(ModelError::Fatal(format!(
            "the answer is not an event stream ({content_type:?}): {}",
            truncate(&text, 500)
        )));
    }
    let mut decoder = sse::Decoder::new();
    while let Some(chunk) = response.chunk().await.map_err(unavailable)? {
        for event in decoder.push(&chunk) {
            if let Some(completion) = read(event)? {
                // The body read to its end lets the connection go back to the pool.
                while let Ok(Some(_)) = response.chunk().await {}
                return Ok(completion);
            }
        }
    }
    Err(ModelError::Retryable(
        "the answer's stream ended before its last event".into(),
    ))
}

/// Sends a JSON request and checks the answer's status: 429 and server errors can pass with
/// time, other refusals cannot.
async fn send(
    request: reqwest::RequestBuilder,
    body: &serde_json::Value,
) -> Result<reqwest::Response, ModelError> {
    let response = request.json(body).send().await.map_err(unavailable)?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let text = response.text().await.map_err(unavailable)?;
    let message = format!("HTTP {status}: {}", truncate(&text, 500));
    if status.as_u16() == 429 || status.is_server_error() {
        Err(ModelError::Retryable(message))
    } else {
        Err(ModelError::Fatal(message))
    }
}

/// An event whose data is not what the provider documents: the answer is broken.
fn unreadable(e: serde_json::Error) -> ModelError {
    ModelError::Fatal(format!("unreadable event: {e}"))
}

/// Network trouble.
fn unavailable(e: reqwest::Error) -> ModelError {
    ModelError::Retryable(redact_error(e).to_string())
}

fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_fake_model::FakeModel;

    /// Serves `body` at both APIs' paths, in pieces of a few bytes so that lines and
    /// characters arrive split, as they may from a real API.
    pub(super) async fn serve(status: u16, content_type: &'static str, body: &str) -> Endpoint {
        let body = axum::body::Bytes::copy_from_slice(body.as_bytes());
        let answer = move || async move {
            let pieces = (0..body.len()).step_by(7).map(move |start| {
                let piece = body.slice(start..body.len().min(start + 7));
                Ok::<_, std::convert::Infallible>(piece)
            });
            let status = axum::http::StatusCode::from_u16(status).unwrap();
            let headers = [(axum::http::header::CONTENT_TYPE, content_type)];
            let body = axum::body::Body::from_stream(futures::stream::iter(pieces));
            (status, headers, body)
        };
        let app = axum::Router::new()
            .route("/v1/messages", axum::routing::post(answer.clone()))
            .route("/chat/completions", axum::routing::post(answer));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Endpoint {
            base_url,
            api_key: "test-key".into(),
        }
    }

    /// Serves `body` as an event stream.
    pub(super) async fn serve_stream(body: &str) -> Endpoint {
        serve(200, "text/event-stream", body).await
    }

    /// The fake model's endpoint.
    pub(super) fn at(model: &FakeModel) -> Endpoint {
        Endpoint {
            base_url: model.base_url.clone(),
            api_key: "test-key".into(),
        }
    }

    /// Asks `model` for a turn of a refund conversation: what it answers, and the pieces of
    /// text it passed on meanwhile.
    pub(super) async fn ask(model: &Model) -> (Result<Vec<Block>, ModelError>, Vec<String>) {
        let (answer, deltas) = ask_counted(model).await;
        (answer.map(|c| c.blocks), deltas)
    }

    /// [`ask`], with what the answer cost.
    pub(super) async fn ask_counted(
        model: &Model,
    ) -> (Result<Completion, ModelError>, Vec<String>) {
        let messages = [Message::user_text("Refund A-1001.")];
        let request = ModelRequest {
            model: "fake",
            max_tokens: 1024,
            system: "You refund orders.",
            messages: &messages,
            tools: &[],
            metadata: &serde_json::Value::Null,
        };
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        let answer = model
            .complete(&reqwest::Client::new(), &request, &sender)
            .await;
        drop(sender);
        let mut deltas = Vec::new();
        while let Some(delta) = receiver.recv().await {
            deltas.push(delta);
        }
        (answer, deltas)
    }

    #[tokio::test]
    async fn a_scripted_model_passes_its_text_on_word_by_word() {
        let script = Script::parse("[[turns]]\ntext = \"Checking  the order.\"\n").unwrap();
        let (answer, deltas) = ask(&Model::Scripted(script)).await;
        let answer = answer.unwrap();
        assert_eq!(deltas, ["Checking ", " ", "the ", "order."]);
        assert_eq!(
            answer,
            [Block::Text {
                text: deltas.concat()
            }]
        );
    }

    #[tokio::test]
    async fn refusals_before_the_stream_keep_their_classes_and_an_answer_that_is_not_a_stream_is_fatal()
     {
        let model =
            FakeModel::start(|_: &serde_json::Value| serde_json::json!({"oops": true})).await;
        model.overload_next(1);
        let (answer, _) = ask(&Model::Anthropic(at(&model))).await;
        assert!(
            matches!(&answer, Err(ModelError::Retryable(e)) if e.contains("529")),
            "{answer:?}"
        );
        for model in [Model::Anthropic(at(&model)), Model::OpenAi(at(&model))] {
            let (answer, _) = ask(&model).await;
            assert!(
                matches!(&answer, Err(ModelError::Fatal(e)) if e.contains("not an event stream") && e.contains("oops")),
                "{answer:?}"
            );
        }
        let refused = serve(400, "application/json", r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too large"}}"#).await;
        let (answer, _) = ask(&Model::Anthropic(refused)).await;
        assert!(
            matches!(&answer, Err(ModelError::Fatal(e)) if e.contains("400") && e.contains("too large")),
            "{answer:?}"
        );
    }
}
