//! A configurable MCP server (Streamable HTTP, rmcp's server side) for tests of countersign's
//! MCP client: tools with fixed answers of each content kind (or a whole result of several),
//! `tools/list` in pages of a chosen size, tools that change while clients are connected,
//! every `tools/call` recorded with its `_meta`, calls held until released, a required
//! header, and a stop that really closes the port and drops the sessions, with a restart on
//! the same address.

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use countersign_local::demo_mcp::page_of;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, JsonObject,
    ListToolsResult, PaginatedRequestParams, Resource, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a wait of this server's may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// A tool the server lists, and what every call of it answers.
#[derive(Clone, Debug)]
pub struct TestTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub annotations: Option<ToolAnnotations>,
    pub answer: TestAnswer,
}

impl TestTool {
    /// A tool taking any object, without annotations.
    pub fn new(name: &str, answer: TestAnswer) -> Self {
        Self {
            name: name.into(),
            description: format!("The test tool {name}."),
            input_schema: serde_json::json!({"type": "object"}),
            annotations: None,
            answer,
        }
    }

    fn listed(&self) -> Tool {
        let Value::Object(schema) = &self.input_schema else {
            panic!("the input schema of {} is not an object", self.name);
        };
        let tool = Tool::new(
            self.name.clone(),
            self.description.clone(),
            Arc::new(schema.clone()),
        );
        match &self.annotations {
            Some(annotations) => tool.with_annotations(annotations.clone()),
            None => tool,
        }
    }
}

/// What a tool's calls answer.
#[derive(Clone, Debug)]
pub enum TestAnswer {
    /// One text block.
    Text(String),
    /// Structured content, and its JSON as a text block.
    Structured(Value),
    /// One image block: base64 PNG data.
    Image(String),
    /// One resource link: its URI and name.
    ResourceLink { uri: String, name: String },
    /// An error result (`isError`) with one text block.
    Error(String),
    /// This result, whole: any content blocks, structured content, `isError` and `_meta`.
    Whole(CallToolResult),
}

impl TestAnswer {
    fn result(&self) -> CallToolResult {
        match self {
            Self::Text(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Self::Structured(value) => CallToolResult::structured(value.clone()),
            Self::Image(png) => {
                CallToolResult::success(vec![ContentBlock::image(png, "image/png")])
            }
            Self::ResourceLink { uri, name } => {
                CallToolResult::success(vec![ContentBlock::resource_link(Resource::new(uri, name))])
            }
            Self::Error(text) => CallToolResult::error(vec![ContentBlock::text(text)]),
            Self::Whole(result) => result.clone(),
        }
    }
}

/// A `tools/call` the server received.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedCall {
    pub tool: String,
    pub arguments: JsonObject,
    /// The request's `_meta`, as it came.
    pub meta: Map<String, Value>,
}

/// What outlives a stop: the tools, the calls received, the holds.
struct Shared {
    tools: Mutex<Vec<TestTool>>,
    page_size: usize,
    calls: watch::Sender<Vec<ReceivedCall>>,
    /// The tools whose calls wait for [`McpServer::release`].
    held: watch::Sender<HashSet<String>>,
    /// The sessions to tell when the tools change; dropped with them at a stop.
    peers: Mutex<Vec<Peer<RoleServer>>>,
}

impl Shared {
    fn new(tools: Vec<TestTool>, page_size: usize) -> Arc<Self> {
        Arc::new(Self {
            tools: Mutex::new(tools),
            page_size,
            calls: watch::Sender::new(Vec::new()),
            held: watch::Sender::new(HashSet::new()),
            peers: Mutex::new(Vec::new()),
        })
    }
}

/// Serves `tools` on stdin and stdout until stdin closes: the server an agent's
/// `mcp_servers[].command` starts (the `mcp_stdio` binary of this package).
pub async fn serve_stdio(tools: Vec<TestTool>, page_size: usize) -> anyhow::Result<()> {
    let handler = Handler {
        shared: Shared::new(tools, page_size),
        stopped: CancellationToken::new(),
    };
    let running = rmcp::ServiceExt::serve(handler, rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

/// The MCP server of one session.
#[derive(Clone)]
struct Handler {
    shared: Arc<Shared>,
    stopped: CancellationToken,
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.shared.peers.lock().unwrap().push(context.peer);
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools: Vec<Tool> = self
            .shared
            .tools
            .lock()
            .unwrap()
            .iter()
            .map(TestTool::listed)
            .collect();
        page_of(&tools, request, self.shared.page_size)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = request.name.to_string();
        self.shared.calls.send_modify(|calls| {
            calls.push(ReceivedCall {
                tool: tool.clone(),
                arguments: request.arguments.unwrap_or_default(),
                meta: context.meta.0.0.clone(),
            });
        });
        let mut held = self.shared.held.subscribe();
        tokio::select! {
            _ = held.wait_for(|held| !held.contains(&tool)) => {}
            _ = self.stopped.cancelled() => {
                return Err(ErrorData::internal_error("the server stopped", None));
            }
        }
        let answer = self
            .shared
            .tools
            .lock()
            .unwrap()
            .iter()
            .find(|t| t.name == tool)
            .map(|t| t.answer.result());
        match answer {
            Some(answer) => Ok(answer.into()),
            None => Err(ErrorData::invalid_params(format!("no tool {tool}"), None)),
        }
    }
}

/// The server as it runs between a start and a stop.
struct Running {
    stop: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

/// A running test MCP server; stopped when dropped.
pub struct McpServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    required: Option<(HeaderName, HeaderValue)>,
    running: Option<Running>,
}

impl McpServer {
    /// Serves `tools`, `page_size` to a `tools/list` page, on a port of its own.
    pub async fn start(tools: Vec<TestTool>, page_size: usize) -> Self {
        Self::start_with(tools, page_size, None).await
    }

    /// Like [`McpServer::start`], refusing with 401 every request without this header and
    /// value, e.g. `("authorization", "Bearer x")`.
    pub async fn start_with_header(
        tools: Vec<TestTool>,
        page_size: usize,
        (name, value): (&str, &str),
    ) -> Self {
        let header = (
            HeaderName::try_from(name).unwrap(),
            HeaderValue::try_from(value).unwrap(),
        );
        Self::start_with(tools, page_size, Some(header)).await
    }

    async fn start_with(
        tools: Vec<TestTool>,
        page_size: usize,
        required: Option<(HeaderName, HeaderValue)>,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut server = Self {
            addr: listener.local_addr().unwrap(),
            shared: Shared::new(tools, page_size),
            required,
            running: None,
        };
        server.serve(listener);
        server
    }

    fn serve(&mut self, listener: TcpListener) {
        let stop = CancellationToken::new();
        let handler = Handler {
            shared: self.shared.clone(),
            stopped: stop.clone(),
        };
        let service: StreamableHttpService<Handler, LocalSessionManager> =
            StreamableHttpService::new(
                move || Ok(handler.clone()),
                Default::default(),
                // Cancelling the token ends every session and its streams, so that the
                // graceful shutdown below has no open stream to wait for.
                StreamableHttpServerConfig::default()
                    .with_sse_keep_alive(None)
                    .with_cancellation_token(stop.child_token()),
            );
        let mut app = Router::new().nest_service("/mcp", service);
        if let Some(required) = self.required.clone() {
            app = app.layer(middleware::from_fn(move |request: Request, next: Next| {
                let required = required.clone();
                async move { require(&required, request, next).await }
            }));
        }
        let stopping = stop.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stopping.cancelled_owned())
                .await
        });
        self.running = Some(Running { stop, task });
    }

    /// The MCP endpoint, `http://127.0.0.1:PORT/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Replaces the tools: later `tools/list` calls list these. Sessions are sent
    /// `notifications/tools/list_changed`, which reaches a client only once it has opened its
    /// stream for server messages (the `GET` of Streamable HTTP).
    pub async fn set_tools(&self, tools: Vec<TestTool>) {
        *self.shared.tools.lock().unwrap() = tools;
        let peers = std::mem::take(&mut *self.shared.peers.lock().unwrap());
        let mut listening = Vec::new();
        for peer in peers {
            // A session whose client has gone cannot be told; it is forgotten.
            if peer.notify_tool_list_changed().await.is_ok() {
                listening.push(peer);
            }
        }
        self.shared.peers.lock().unwrap().extend(listening);
    }

    /// Every `tools/call` received, in order.
    pub fn calls(&self) -> Vec<ReceivedCall> {
        self.shared.calls.borrow().clone()
    }

    /// Waits until at least `n` calls were received; all of them.
    pub async fn wait_calls(&self, n: usize) -> Vec<ReceivedCall> {
        let mut calls = self.shared.calls.subscribe();
        let waited = tokio::time::timeout(PATIENCE, calls.wait_for(|calls| calls.len() >= n));
        match waited.await {
            Ok(calls) => calls.unwrap().clone(),
            Err(_) => panic!("{n} MCP calls not received within {PATIENCE:?}"),
        }
    }

    /// Calls of `tool` wait, once received (and recorded), until [`McpServer::release`].
    pub fn hold(&self, tool: &str) {
        self.shared.held.send_modify(|held| {
            held.insert(tool.to_string());
        });
    }

    /// Lets every held call answer, and later calls answer at once.
    pub fn release(&self) {
        self.shared.held.send_modify(HashSet::clear);
    }

    /// Stops serving: the port is closed and every session dropped (a held call answers an
    /// error). Tools, calls and holds stay for [`McpServer::restart`].
    pub async fn stop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        running.stop.cancel();
        self.shared.peers.lock().unwrap().clear();
        match tokio::time::timeout(PATIENCE, running.task).await {
            Ok(served) => served.unwrap().unwrap(),
            Err(_) => panic!("the MCP server did not stop within {PATIENCE:?}"),
        }
    }

    /// Serves again on the same address, with no sessions: clients must initialize anew.
    pub async fn restart(&mut self) {
        self.stop().await;
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        if let Some(running) = &self.running {
            running.stop.cancel();
        }
    }
}

/// Answers 401 to a request without the required header and value.
async fn require(required: &(HeaderName, HeaderValue), request: Request, next: Next) -> Response {
    let (name, value) = required;
    if request.headers().get(name) != Some(value) {
        return (StatusCode::UNAUTHORIZED, format!("{name} required")).into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolRequestParams, MetaObject, RequestMetaObject};
    use rmcp::service::{NotificationContext, RoleClient, RunningService};
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::{ClientHandler, ServiceExt};
    use serde_json::json;
    use std::collections::HashMap;

    /// A client that counts `notifications/tools/list_changed`.
    #[derive(Clone, Default)]
    struct Watching(watch::Sender<u32>);

    impl ClientHandler for Watching {
        async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
            self.0.send_modify(|n| *n += 1);
        }
    }

    async fn connect<C: ClientHandler>(
        handler: C,
        url: String,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<RunningService<RoleClient, C>, rmcp::service::ClientInitializeError> {
        let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
        handler
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
    }

    fn tool(name: &str) -> TestTool {
        TestTool::new(name, TestAnswer::Text(format!("{name} ran")))
    }

    fn names(tools: &[Tool]) -> Vec<&str> {
        tools.iter().map(|t| t.name.as_ref()).collect()
    }

    fn object(value: Value) -> JsonObject {
        let Value::Object(object) = value else {
            panic!("not an object")
        };
        object
    }

    #[tokio::test]
    async fn lists_in_pages_and_lists_changed_tools() {
        let server = McpServer::start(vec![tool("a"), tool("b"), tool("c")], 2).await;
        let watching = Watching::default();
        let changes = watching.0.subscribe();
        let client = connect(watching, server.url(), HashMap::new())
            .await
            .unwrap();

        let first = client.list_tools(None).await.unwrap();
        assert_eq!(names(&first.tools), ["a", "b"]);
        assert!(first.next_cursor.is_some());
        assert_eq!(
            names(&client.list_all_tools().await.unwrap()),
            ["a", "b", "c"]
        );

        let four = || vec![tool("a"), tool("b"), tool("c"), tool("d")];
        server.set_tools(four()).await;
        assert_eq!(
            names(&client.list_all_tools().await.unwrap()),
            ["a", "b", "c", "d"]
        );
        // A notification sent before the client has opened its stream for them is lost
        // (Streamable HTTP keeps none for a stream not yet open): set the tools until one
        // arrives.
        crate::wait_for("notifications/tools/list_changed", PATIENCE, || async {
            server.set_tools(four()).await;
            (*changes.borrow() >= 1).then_some(())
        })
        .await;
        client.cancel().await.unwrap();
    }

    #[tokio::test]
    async fn records_calls_with_their_meta_and_answers_each_kind() {
        let structured = json!({"total": 3});
        let server = McpServer::start(
            vec![
                TestTool::new("text", TestAnswer::Text("hello".into())),
                TestTool::new("structured", TestAnswer::Structured(structured.clone())),
                TestTool::new("image", TestAnswer::Image("iVBORw0KGgo=".into())),
                TestTool::new(
                    "link",
                    TestAnswer::ResourceLink {
                        uri: "file:///report.pdf".into(),
                        name: "report".into(),
                    },
                ),
                TestTool::new("failing", TestAnswer::Error("no such thing".into())),
            ],
            10,
        )
        .await;
        let client = connect((), server.url(), HashMap::new()).await.unwrap();
        let call = |name: &str| CallToolRequestParams::new(name.to_string());

        let mut with_meta = call("text").with_arguments(object(json!({"x": 1})));
        with_meta.meta = Some(RequestMetaObject(MetaObject(object(
            json!({"countersign.dev/idempotency_key": "run:1:call"}),
        ))));
        let text = client.call_tool(with_meta).await.unwrap();
        assert_eq!(text.content[0].as_text().unwrap().text, "hello");
        let answered = client.call_tool(call("structured")).await.unwrap();
        assert_eq!(answered.structured_content, Some(structured));
        let image = client.call_tool(call("image")).await.unwrap();
        assert_eq!(image.content[0].as_image().unwrap().mime_type, "image/png");
        let link = client.call_tool(call("link")).await.unwrap();
        assert!(matches!(
            &link.content[0],
            ContentBlock::ResourceLink(r) if r.uri == "file:///report.pdf"
        ));
        let failing = client.call_tool(call("failing")).await.unwrap();
        assert_eq!(failing.is_error, Some(true));

        let calls = server.calls();
        let tools: Vec<&str> = calls.iter().map(|c| c.tool.as_str()).collect();
        assert_eq!(tools, ["text", "structured", "image", "link", "failing"]);
        assert_eq!(calls[0].arguments, object(json!({"x": 1})));
        assert_eq!(
            calls[0].meta["countersign.dev/idempotency_key"],
            json!("run:1:call")
        );
        client.cancel().await.unwrap();
    }

    #[tokio::test]
    async fn a_held_call_answers_once_released() {
        let server = McpServer::start(vec![tool("slow")], 10).await;
        let client = connect((), server.url(), HashMap::new()).await.unwrap();
        server.hold("slow");
        let peer = client.peer().clone();
        let call = tokio::spawn(async move {
            peer.call_tool(CallToolRequestParams::new("slow"))
                .await
                .unwrap()
        });
        server.wait_calls(1).await;
        assert!(!call.is_finished(), "the held call has not answered");
        server.release();
        let answered = tokio::time::timeout(PATIENCE, call).await.unwrap().unwrap();
        assert_eq!(answered.content[0].as_text().unwrap().text, "slow ran");
        client.cancel().await.unwrap();
    }

    #[tokio::test]
    async fn stop_closes_the_port_and_restart_serves_on_it_again() {
        let mut server = McpServer::start(vec![tool("a")], 10).await;
        let url = server.url();
        let before = connect((), url.clone(), HashMap::new()).await.unwrap();
        assert_eq!(names(&before.list_all_tools().await.unwrap()), ["a"]);

        server.stop().await;
        assert!(
            tokio::net::TcpStream::connect(server.addr).await.is_err(),
            "nothing listens once stopped"
        );
        assert!(
            before.list_all_tools().await.is_err(),
            "the session is gone"
        );

        server.restart().await;
        assert_eq!(server.url(), url);
        let after = connect((), url, HashMap::new()).await.unwrap();
        assert_eq!(names(&after.list_all_tools().await.unwrap()), ["a"]);
        after.cancel().await.unwrap();
    }

    #[tokio::test]
    async fn a_required_header_refuses_clients_without_it() {
        let server =
            McpServer::start_with_header(vec![tool("a")], 10, ("authorization", "Bearer x")).await;
        assert!(
            connect((), server.url(), HashMap::new()).await.is_err(),
            "no header, no session"
        );
        let headers = HashMap::from([(
            HeaderName::from_static("authorization"),
            HeaderValue::from_static("Bearer x"),
        )]);
        let client = connect((), server.url(), headers).await.unwrap();
        assert_eq!(names(&client.list_all_tools().await.unwrap()), ["a"]);
        client.cancel().await.unwrap();
    }
}
