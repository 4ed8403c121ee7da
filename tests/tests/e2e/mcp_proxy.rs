//! Countersign in front of an MCP server for a client it does not run: an `mcp_client` agent
//! at the gateway's `/mcp/{agent}`, reached by a client built from rmcp's client side, fronting
//! a test MCP server whose `lookup`, `report` and `broken` are read-only (a trusted server:
//! they run at once), whose `refund` the agent's policy holds and whose `export` the server's
//! hints hold (it may change data).

use super::inbox::Browser;
use approval_gateway::config::{ApiKey, Role};
use countersign_receipt::Claims;
use countersign_receipt::mcp::META_CALL_ID;
use countersign_receipt::mcp::{META_RECEIPT, META_RECEIPT_JTI, META_RUN_ID};
use countersign_tests::app::{
    ADMIN_KEY, PATIENCE, READER_KEY, REQUESTER_KEY, REVIEWER_KEY, TestApp,
};
use countersign_tests::mcp_server::{McpServer, TestAnswer, TestTool};
use countersign_tests::wait_for;
use reqwest::{Method, StatusCode};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, MetaObject, NumberOrString,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestMetaObject, Resource,
    ToolAnnotations,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, RoleClient, RunningService,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::watch;

pub(super) const AGENT: &str = "shopfront";
/// The id of a refund's call: named after its tool, the same for every refund's run.
pub(super) const REFUND_CALL: &str = "mcp_refund";

/// A result of every kind the proxy must pass on whole: structured content (and its JSON as
/// text), an image, a resource link, and the server's own `_meta` (with a receipt's jti that
/// is not the server's to name).
pub(super) fn whole_report() -> CallToolResult {
    let mut result = CallToolResult::structured(json!({"orders": 2, "total": 80}));
    result.content.push(ContentBlock::image(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==",
        "image/png",
    ));
    result.content.push(ContentBlock::resource_link(
        Resource::new("file:///reports/a-1.pdf", "a-1.pdf").with_mime_type("application/pdf"),
    ));
    result.meta = Some(MetaObject(
        json!({"com.example/trace": "t-1", META_RECEIPT_JTI: "forged"})
            .as_object()
            .unwrap()
            .clone(),
    ));
    result
}

/// An error result with more than text: the proxy keeps its `isError` and its content.
fn whole_failure() -> CallToolResult {
    CallToolResult::error(vec![
        ContentBlock::text("no order A-9"),
        ContentBlock::resource_link(Resource::new("file:///orders/", "orders")),
    ])
}

/// The upstream MCP server: a read-only lookup, report and broken tool, a refund and an
/// export.
pub(super) async fn upstream() -> McpServer {
    McpServer::start(upstream_tools(), 10).await
}

/// The tools of [`upstream`].
fn upstream_tools() -> Vec<TestTool> {
    let mut lookup = TestTool::new("lookup", TestAnswer::Text("A-1: $30, paid".into()));
    lookup.input_schema = json!({
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    });
    lookup.annotations = Some(ToolAnnotations::new().read_only(true));
    let mut refund = TestTool::new("refund", TestAnswer::Text("refunded".into()));
    refund.input_schema = json!({
        "type": "object",
        "properties": {"amount": {"type": "number"}},
        "required": ["amount"],
    });
    let read_only = |name: &str, answer: CallToolResult| {
        let mut tool = TestTool::new(name, TestAnswer::Whole(answer));
        tool.annotations = Some(ToolAnnotations::new().read_only(true));
        tool
    };
    let report = read_only("report", whole_report());
    let broken = read_only("broken", whole_failure());
    let export = TestTool::new("export", TestAnswer::Whole(whole_report()));
    vec![lookup, refund, report, broken, export]
}

/// A gateway and worker with the proxy agent in front of `upstream`; a call waits at most
/// `wait_secs` for its outcome.
async fn proxy(upstream: &McpServer, wait_secs: u64) -> TestApp {
    proxy_with(upstream, wait_secs, "").await
}

/// Where the gateway says reviewers reach it.
pub(super) const PUBLIC_URL: &str = "https://approvals.example.com";

/// The key of a second requester, rosa, who speaks for nobody else.
pub(super) const OTHER_REQUESTER_KEY: &str = "test-other-requester-key-0123456789";

/// [`proxy`], with `more` at the end of the agent's file: lines of the refund's
/// `[tools.approval]` (a deadline, say), then maybe more tables.
pub(super) async fn proxy_with(upstream: &McpServer, wait_secs: u64, more: &str) -> TestApp {
    let agent = format!(
        r#"name = "{AGENT}"

[model]
provider = "mcp_client"

[[mcp_servers]]
name = "shop"
url = "{url}"
trusted = true

[[tools]]
name = "refund"
mcp = "shop"
[tools.approval]
reason = "refunds move money"
{more}"#,
        url = upstream.url()
    );
    TestApp::builder(|_: &Value| countersign_fake_model::anthropic_text("Unused."))
        .agent(&format!("{AGENT}.toml"), agent)
        .gateway(move |config| {
            config.mcp.wait_secs = wait_secs;
            config.inbox.public_base_url = Some(PUBLIC_URL.into());
            super::inbox::add_keys(config);
            config.api_keys.push(ApiKey {
                key: OTHER_REQUESTER_KEY.into(),
                role: Role::Requester,
                principal: "rosa".into(),
                speaks_for: Vec::new(),
            });
        })
        .start()
        .await
}

pub(super) fn endpoint(app: &TestApp) -> String {
    format!("{}/mcp/{AGENT}", app.gateway_url)
}

/// A client of the proxy with `key`, on a protocol version with sessions (rmcp's `serve`).
async fn connect(
    app: &TestApp,
    key: &str,
) -> Result<RunningService<RoleClient, ()>, rmcp::service::ClientInitializeError> {
    connect_as((), app, key).await
}

async fn connect_as<C: ClientHandler>(
    handler: C,
    app: &TestApp,
    key: &str,
) -> Result<RunningService<RoleClient, C>, rmcp::service::ClientInitializeError> {
    let config = StreamableHttpClientTransportConfig::with_uri(endpoint(app)).auth_header(key);
    handler
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
}

/// A client that keeps the messages of the progress notifications it is sent.
#[derive(Clone, Default)]
struct Progress(watch::Sender<Vec<String>>);

impl ClientHandler for Progress {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        self.0
            .send_modify(|seen| seen.push(params.message.unwrap_or_default()));
    }
}

pub(super) fn call(tool: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else {
        panic!("arguments are an object")
    };
    CallToolRequestParams::new(tool.to_string()).with_arguments(arguments)
}

pub(super) fn text(result: &CallToolResult) -> &str {
    &result.content[0].as_text().expect("a text block").text
}

pub(super) fn is_error(result: &CallToolResult) -> bool {
    result.is_error == Some(true)
}

/// Waits until the proxy agent's refund waits for a person; its run id and digest.
pub(super) async fn held_refund(app: &TestApp) -> (String, Value) {
    held(app, REFUND_CALL).await
}

/// Waits until the proxy agent's call `call_id` waits for a person; its run id and digest.
pub(super) async fn held(app: &TestApp, call_id: &str) -> (String, Value) {
    wait_for(&format!("{call_id} to be held"), PATIENCE, || async {
        let (_, body) = app.get("/v1/approvals").await;
        let approvals = body["approvals"].as_array()?;
        let held = approvals
            .iter()
            .find(|a| a["agent"] == AGENT && a["call_id"] == call_id)?;
        Some((held["run_id"].as_str()?.to_string(), held["digest"].clone()))
    })
    .await
}

async fn decide(app: &TestApp, run: &str, digest: &Value, decision: Value) {
    decide_call(app, run, REFUND_CALL, digest, decision).await;
}

pub(super) async fn decide_call(
    app: &TestApp,
    run: &str,
    call_id: &str,
    digest: &Value,
    decision: Value,
) {
    let mut decision = decision;
    decision["call_id"] = json!(call_id);
    decision["digest"] = digest.clone();
    let (status, body) = app.decide(run, json!([decision])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Calls `tool` with `arguments` through `peer`, approves the call (`call_id`) once it is
/// held, after `while_held` looked at the app; the answer, and the call's run.
async fn approved(
    app: &TestApp,
    peer: &rmcp::Peer<RoleClient>,
    (tool, arguments): (&str, Value),
    call_id: &str,
    while_held: impl FnOnce(),
) -> (CallToolResult, String) {
    let peer = peer.clone();
    let params = call(tool, arguments);
    let calling = tokio::spawn(async move { peer.call_tool(params).await });
    let (run, digest) = held(app, call_id).await;
    while_held();
    decide_call(app, &run, call_id, &digest, json!({"action": "approve"})).await;
    let answered = tokio::time::timeout(PATIENCE, calling)
        .await
        .expect("answered once approved")
        .unwrap()
        .unwrap();
    (answered, run)
}

/// The claims of the receipt `upstream` received with its one call of `tool`, checked
/// against the gateway's published keys.
async fn received_receipt(app: &TestApp, upstream: &McpServer, tool: &str) -> Claims {
    let calls = upstream.calls();
    let sent: Vec<_> = calls.iter().filter(|c| c.tool == tool).collect();
    assert_eq!(sent.len(), 1, "one call of {tool}");
    let receipt = sent[0].meta[META_RECEIPT].as_str().expect("a receipt");
    let (_, jwks) = app.get("/.well-known/jwks.json").await;
    let keys: countersign_receipt::KeySet = serde_json::from_value(jwks).unwrap();
    countersign_receipt::signed_by(receipt, &keys).unwrap()
}

pub(super) fn refunds(upstream: &McpServer) -> usize {
    upstream
        .calls()
        .iter()
        .filter(|c| c.tool == "refund")
        .count()
}

#[tokio::test]
async fn a_lookup_answers_at_once_and_a_held_refund_answers_once_a_person_approves() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    let progress = Progress::default();
    let told = progress.0.subscribe();
    let client = connect_as(progress, &app, REQUESTER_KEY).await.unwrap();

    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    assert_eq!(names, ["broken", "export", "lookup", "refund", "report"]);
    let lookup = tools.iter().find(|t| t.name == "lookup").unwrap();
    assert_eq!(
        lookup.annotations.as_ref().and_then(|a| a.read_only_hint),
        Some(true),
        "listed as the upstream described it"
    );

    let looked_up = client
        .call_tool(call("lookup", json!({"order_id": "A-1"})))
        .await
        .unwrap();
    assert_eq!(text(&looked_up), "A-1: $30, paid");
    assert!(!is_error(&looked_up));

    let bad = client
        .call_tool(call("refund", json!({"amount": "lots"})))
        .await
        .unwrap();
    assert!(is_error(&bad));
    assert!(text(&bad).contains("amount"), "{}", text(&bad));

    let peer = client.peer().clone();
    let mut refund = call("refund", json!({"amount": 50}));
    let mut meta = RequestMetaObject::default();
    meta.set_progress_token(ProgressToken(NumberOrString::Number(7)));
    refund.meta = Some(meta);
    let refunding = tokio::spawn(async move { peer.call_tool(refund).await });
    let (run, digest) = held_refund(&app).await;
    assert_eq!(refunds(&upstream), 0, "nothing runs before the decision");
    let waiting = format!("awaiting a decision on run {run}");
    wait_for("a progress notification", PATIENCE, || async {
        told.borrow().contains(&waiting).then_some(())
    })
    .await;
    let (_, shown) = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(shown["requested_by"], "rick", "the key's principal asked");
    assert!(shown["metadata"]["mcp"]["session"].is_string(), "{shown}");
    decide(&app, &run, &digest, json!({"action": "approve"})).await;

    let refunded = tokio::time::timeout(PATIENCE, refunding)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(text(&refunded), "refunded");
    assert!(!is_error(&refunded));
    let calls = upstream.calls();
    let sent: Vec<_> = calls.iter().filter(|c| c.tool == "refund").collect();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].meta[META_RECEIPT].is_string(), "{:?}", sent[0].meta);
    client.cancel().await.unwrap();
}

/// A reviewer reads what a held call asked as a sentence naming its tool, not the JSON of the
/// call (whose input is shown as the call's), wherever the run's request shows: the API's
/// conversation, `countersign show`, the inbox's queue and request page. The call itself is
/// named after its tool, there and in the answer's `_meta`.
#[tokio::test]
async fn a_held_call_is_asked_in_a_sentence_and_its_call_is_named_after_its_tool() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    let client = connect(&app, REQUESTER_KEY).await.unwrap();
    let peer = client.peer().clone();
    let refunding =
        tokio::spawn(async move { peer.call_tool(call("refund", json!({"amount": 50}))).await });
    let (run, digest) = held_refund(&app).await;
    let asked = "An MCP client called refund.";
    let raw = r#"{"tool""#;

    let (_, shown) = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(shown["messages"][0]["content"][0]["text"], asked, "{shown}");
    assert_eq!(shown["pending"][0]["call_id"], REFUND_CALL, "{shown}");
    assert_eq!(
        shown["pending"][0]["input"],
        json!({"amount": 50}),
        "{shown}"
    );
    assert_eq!(
        shown["metadata"]["mcp"]["call"],
        json!({"tool": "refund", "arguments": {"amount": 50}}),
        "the call, kept as data"
    );

    let show = super::cli::ok(&app, REVIEWER_KEY, &format!("show {run}")).await;
    assert!(show.contains(asked), "{show}");
    assert!(
        show.contains(&format!("Call {REFUND_CALL} (refund)")),
        "{show}"
    );
    assert!(!show.contains(raw), "{show}");

    let rita = Browser::signed_in(&app, REVIEWER_KEY).await;
    for path in [
        "/inbox".to_string(),
        format!("/inbox/runs/{run}/calls/{REFUND_CALL}"),
    ] {
        let page = rita.get(&path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.html);
        assert!(page.html.contains(asked), "{path}: {}", page.html);
        assert!(
            !page.html.contains("&quot;tool&quot;"),
            "{path}: {}",
            page.html
        );
        assert!(!page.html.contains(raw), "{path}: {}", page.html);
    }

    decide(&app, &run, &digest, json!({"action": "approve"})).await;
    let refunded = tokio::time::timeout(PATIENCE, refunding)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(text(&refunded), "refunded");
    assert_eq!(upstream.calls()[0].meta[META_CALL_ID], REFUND_CALL);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_rejected_refund_answers_the_reviewer_s_reason() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    let client = connect(&app, REQUESTER_KEY).await.unwrap();
    let peer = client.peer().clone();
    let refunding =
        tokio::spawn(async move { peer.call_tool(call("refund", json!({"amount": 900}))).await });
    let (run, digest) = held_refund(&app).await;
    decide(
        &app,
        &run,
        &digest,
        json!({"action": "reject", "reason": "over the limit"}),
    )
    .await;

    let rejected = tokio::time::timeout(PATIENCE, refunding)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(is_error(&rejected));
    assert!(
        text(&rejected).contains("over the limit"),
        "{}",
        text(&rejected)
    );
    assert_eq!(refunds(&upstream), 0);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_call_that_outwaits_the_proxy_names_its_run_and_the_same_call_later_gets_the_outcome_once()
 {
    let upstream = upstream().await;
    let app = proxy(&upstream, 1).await;
    let client = connect(&app, REQUESTER_KEY).await.unwrap();
    let refund = || call("refund", json!({"amount": 75}));

    let waiting = client.call_tool(refund()).await.unwrap();
    assert!(is_error(&waiting));
    let meta = waiting.meta.as_ref().expect("the answer names its run");
    let run = meta.0[META_RUN_ID].as_str().unwrap().to_string();
    assert!(text(&waiting).contains(&run), "{}", text(&waiting));
    assert!(text(&waiting).contains(REFUND_CALL), "{}", text(&waiting));
    assert_eq!(meta.0[META_CALL_ID], REFUND_CALL);
    assert!(
        text(&waiting).contains("same arguments"),
        "{}",
        text(&waiting)
    );

    let (held, digest) = held_refund(&app).await;
    assert_eq!(held, run);
    let again = client.call_tool(refund()).await.unwrap();
    assert!(is_error(&again), "still undecided");
    assert_eq!(
        again.meta.unwrap().0[META_RUN_ID],
        run.as_str(),
        "the same run"
    );

    decide(&app, &run, &digest, json!({"action": "approve"})).await;
    app.wait_status(&run, "completed").await;
    for _ in 0..2 {
        let decided = client.call_tool(refund()).await.unwrap();
        assert_eq!(text(&decided), "refunded");
        assert!(!is_error(&decided));
    }
    assert_eq!(
        refunds(&upstream),
        1,
        "one upstream call, however often asked"
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_client_of_the_newest_protocol_version_is_served_without_a_session() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    let config =
        StreamableHttpClientTransportConfig::with_uri(endpoint(&app)).auth_header(REQUESTER_KEY);
    let client = ()
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_config(config),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .unwrap();
    assert_eq!(client.list_all_tools().await.unwrap().len(), 5);
    let looked_up = client
        .call_tool(call("lookup", json!({"order_id": "A-2"})))
        .await
        .unwrap();
    assert_eq!(text(&looked_up), "A-1: $30, paid");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn only_keys_that_may_start_runs_get_in_and_only_mcp_client_agents_have_an_endpoint() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    assert!(
        connect(&app, READER_KEY).await.is_err(),
        "a reader key opens no session"
    );
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "curl", "version": "1"}},
    });
    let path = format!("/mcp/{AGENT}");
    let (status, body) = app
        .request(Method::POST, &path, None, Some(initialize.clone()))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Bearer"),
        "{body}"
    );
    let (status, body) = app
        .request(
            Method::POST,
            &path,
            Some(READER_KEY),
            Some(initialize.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("reed"),
        "{body}"
    );

    let (status, body) = app
        .request(
            Method::POST,
            "/mcp/refunds",
            Some(ADMIN_KEY),
            Some(initialize),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("mcp_client"),
        "{body}"
    );

    let (status, body) = app
        .request(
            Method::POST,
            "/v1/runs",
            Some(REQUESTER_KEY),
            Some(json!({"agent": AGENT, "input": "{}"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("/mcp/"),
        "{body}"
    );
}

/// A request into the session `session` of the proxy with `key`: `method`, with `message` as
/// its body when there is one. Its status and body.
async fn into_session(
    app: &TestApp,
    key: &str,
    session: &str,
    method: Method,
    message: Option<Value>,
) -> (StatusCode, String) {
    let mut request = app
        .http
        .request(method, endpoint(app))
        .bearer_auth(key)
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "application/json, text/event-stream");
    if let Some(message) = message {
        request = request.json(&message);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    // A stream that would stay open is not read: its status says enough.
    let body = match status.is_success() {
        true => String::new(),
        false => response.text().await.unwrap(),
    };
    (status, body)
}

/// The session id of an MCP client shows in its runs' metadata, which any reader key reads;
/// another key that may start runs, holding it, gets what a session that does not exist gets.
#[tokio::test]
async fn a_session_answers_only_the_principal_that_opened_it() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    let client = connect(&app, REQUESTER_KEY).await.unwrap();
    let peer = client.peer().clone();
    let refunding =
        tokio::spawn(async move { peer.call_tool(call("refund", json!({"amount": 50}))).await });
    let (run, digest) = held_refund(&app).await;
    let (_, shown) = app
        .request(
            Method::GET,
            &format!("/v1/runs/{run}"),
            Some(READER_KEY),
            None,
        )
        .await;
    let session = shown["metadata"]["mcp"]["session"]
        .as_str()
        .unwrap()
        .to_string();

    // Another principal (an admin's key, even) may not call into it, open its stream or end it.
    let lookup = json!({
        "jsonrpc": "2.0", "id": 99, "method": "tools/call",
        "params": {"name": "lookup", "arguments": {"order_id": "A-9"}},
    });
    for (method, message) in [
        (Method::POST, Some(lookup.clone())),
        (Method::GET, None),
        (Method::DELETE, None),
    ] {
        let (status, body) = into_session(&app, ADMIN_KEY, &session, method.clone(), message).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {body}");
        assert!(body.contains("Session not found"), "{method} {body}");
    }
    assert_eq!(upstream.calls().len(), 0, "nothing ran for the other key");

    // The session lives on for its owner: the held call is answered once approved.
    decide(&app, &run, &digest, json!({"action": "approve"})).await;
    let refunded = tokio::time::timeout(PATIENCE, refunding)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(text(&refunded), "refunded");
    let (status, body) =
        into_session(&app, REQUESTER_KEY, &session, Method::POST, Some(lookup)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Its owner ends it; then it is gone for everyone.
    // Answered 204 as a session really ended: clients (the official Python SDK) take a 202
    // for a termination that failed.
    let (status, body) = into_session(&app, REQUESTER_KEY, &session, Method::DELETE, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, _) = into_session(&app, REQUESTER_KEY, &session, Method::GET, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A proxied call learns that its run has its answer from the run's `run.*` events on NATS,
/// which the gateway follows (the shipped permissions once refused that subscription, and
/// every call waited for the one-second poll instead).
#[tokio::test]
async fn a_proxied_call_is_woken_by_its_run_s_events_on_nats_not_only_by_the_poll() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    let client = connect(&app, REQUESTER_KEY).await.unwrap();
    for order in ["A-1", "A-2", "A-3"] {
        let looked_up = client
            .call_tool(call("lookup", json!({"order_id": order})))
            .await
            .unwrap();
        assert!(!is_error(&looked_up), "{}", text(&looked_up));
    }
    let peer = client.peer().clone();
    let refunding =
        tokio::spawn(async move { peer.call_tool(call("refund", json!({"amount": 50}))).await });
    let (run, digest) = held_refund(&app).await;
    decide(&app, &run, &digest, json!({"action": "approve"})).await;
    let refunded = tokio::time::timeout(PATIENCE, refunding)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(text(&refunded), "refunded");

    let woken = countersign_tests::metric_value(
        &app.gateway_metrics().await,
        r#"countersign_call_wait_wakeups_total{by="event"}"#,
    );
    assert!(
        woken >= Some(1.0),
        "no waiting call was woken by a run event: {woken:?}"
    );
    client.cancel().await.unwrap();
}

/// The answer's `_meta` as a JSON object.
pub(super) fn meta(result: &CallToolResult) -> &serde_json::Map<String, Value> {
    &result.meta.as_ref().expect("the answer has _meta").0
}

/// `answered` is `given` as the upstream server gave it: its content blocks, structured
/// content and `isError`, and its own `_meta` beside countersign's names (the server's keys
/// under countersign's prefix are not its own).
pub(super) fn assert_whole(answered: &CallToolResult, given: &CallToolResult) {
    assert_eq!(answered.content, given.content, "{answered:?}");
    assert_eq!(answered.structured_content, given.structured_content);
    assert_eq!(answered.is_error, given.is_error);
    let servers = given.meta.iter().flat_map(|m| m.0.iter());
    for (key, value) in servers.filter(|(key, _)| !key.starts_with("countersign.dev/")) {
        assert_eq!(meta(answered).get(key), Some(value), "{key} kept");
    }
}

#[tokio::test]
async fn a_free_call_answers_the_upstream_result_whole() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    let client = connect(&app, REQUESTER_KEY).await.unwrap();

    let answered = client
        .call_tool(call("report", json!({"order_id": "A-1"})))
        .await
        .unwrap();
    assert_whole(&answered, &whole_report());
    assert_eq!(
        answered.structured_content,
        Some(json!({"orders": 2, "total": 80}))
    );
    let image = answered.content[1].as_image().expect("an image block");
    assert_eq!(image.mime_type, "image/png");
    assert!(image.data.starts_with("iVBORw0KGgo"), "{}", image.data);
    let ContentBlock::ResourceLink(link) = &answered.content[2] else {
        panic!("a resource link: {:?}", answered.content[2]);
    };
    assert_eq!(
        (link.uri.as_str(), link.mime_type.as_deref()),
        ("file:///reports/a-1.pdf", Some("application/pdf"))
    );
    assert_eq!(meta(&answered)[META_CALL_ID], "mcp_report");
    assert!(meta(&answered)[META_RUN_ID].is_string());
    assert!(
        !meta(&answered).contains_key(META_RECEIPT_JTI),
        "no decision, no receipt: {:?}",
        answered.meta
    );

    // What the run keeps for the model and the reviewers is still text.
    let run = meta(&answered)[META_RUN_ID].as_str().unwrap();
    let (_, shown) = app.get(&format!("/v1/runs/{run}")).await;
    let told = &shown["messages"][2]["content"][0];
    assert_eq!(told["type"], "tool_result", "{shown}");
    let text = told["content"].as_str().unwrap();
    assert!(text.contains("[image image/png]"), "{text}");
    assert!(text.contains("[resource file:///reports/a-1.pdf"), "{text}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn an_approved_call_answers_the_upstream_result_whole_with_the_receipt_it_ran_under() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    let client = connect(&app, REQUESTER_KEY).await.unwrap();
    let export = ("export", json!({"month": 5}));
    let (answered, run) = approved(&app, client.peer(), export, "mcp_export", || {}).await;
    assert_whole(&answered, &whole_report());
    assert_eq!(meta(&answered)[META_RUN_ID], run.as_str());

    let claims = received_receipt(&app, &upstream, "export").await;
    assert_eq!(
        meta(&answered)[META_RECEIPT_JTI],
        claims.jti.as_str(),
        "the jti of the receipt the upstream server received"
    );

    // The same call again is answered from the run: the same result, the same receipt.
    let again = client
        .call_tool(call("export", json!({"month": 5})))
        .await
        .unwrap();
    assert_whole(&again, &whole_report());
    assert_eq!(meta(&again)[META_RECEIPT_JTI], claims.jti.as_str());
    assert_eq!(upstream.calls().len(), 1, "the upstream tool ran once");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn an_upstream_error_result_keeps_its_is_error_and_its_content() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    let client = connect(&app, REQUESTER_KEY).await.unwrap();
    let answered = client
        .call_tool(call("broken", json!({"order_id": "A-9"})))
        .await
        .unwrap();
    assert!(is_error(&answered));
    assert_whole(&answered, &whole_failure());
    assert_eq!(meta(&answered)[META_CALL_ID], "mcp_broken");
    client.cancel().await.unwrap();
}

/// A tool the upstream server adds, with no change to the agent's file: the server says its
/// tools changed, the gateway and the worker list them again at once, the proxy tells its
/// client, and a call of the new tool (which the server does not say is read-only) is held.
#[tokio::test]
async fn a_tool_the_upstream_server_adds_is_listed_and_held_at_once() {
    let upstream = upstream().await;
    let app = proxy(&upstream, 60).await;
    let told = Told::default();
    let client = connect_as(told.clone(), &app, REQUESTER_KEY).await.unwrap();
    assert_eq!(client.list_all_tools().await.unwrap().len(), 5);

    let mut more = upstream_tools();
    more.push(TestTool::new("wipe", TestAnswer::Text("wiped".into())));
    upstream.set_tools(more).await;
    let mut heard = told.0.subscribe();
    tokio::time::timeout(PATIENCE, heard.wait_for(|n| *n > 0))
        .await
        .expect("the proxy tells its client the tools changed")
        .unwrap();
    let listed = client.list_all_tools().await.unwrap();
    assert!(listed.iter().any(|t| t.name == "wipe"), "{listed:?}");
    let reloaded = "countersign_agent_reloads_total{outcome=\"loaded\"}";
    wait_for("the worker to list the tools again", PATIENCE, || async {
        (app.workers_metric(1, reloaded).await >= 1.0).then_some(())
    })
    .await;

    let held_first = || assert!(upstream.calls().is_empty(), "held before it ran");
    let wipe = ("wipe", json!({}));
    let (wiped, _) = approved(&app, client.peer(), wipe, "mcp_wipe", held_first).await;
    assert_eq!(text(&wiped), "wiped");
    client.cancel().await.unwrap();
}

/// A client that counts `notifications/tools/list_changed`.
#[derive(Clone, Default)]
struct Told(watch::Sender<u32>);

impl ClientHandler for Told {
    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.0.send_modify(|n| *n += 1);
    }
}

/// Two servers that both list `refund` and `lookup`: each is exposed under its server's
/// prefix and called there by its own name, with the policy of its own server (the agent's
/// entry for one, the other server's default for the other), and a receipt naming the tool
/// as its server knows it.
#[tokio::test]
async fn tools_two_servers_list_by_one_name_are_each_exposed_under_their_server_s_prefix() {
    let shop = upstream().await;
    let mut refund = TestTool::new("refund", TestAnswer::Text("refunded at the till".into()));
    refund.input_schema = json!({"type": "object", "properties": {"amount": {"type": "number"}}});
    let lookup = TestTool::new("lookup", TestAnswer::Text("the till looked".into()));
    let till = McpServer::start(vec![refund, lookup], 10).await;
    let second = format!(
        "\n[[mcp_servers]]\nname = \"till\"\nurl = \"{}\"\napproval = \"never\"\n",
        till.url()
    );
    let app = proxy_with(&shop, 60, &second).await;
    let client = connect(&app, REQUESTER_KEY).await.unwrap();
    let mut names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "broken",
            "export",
            "report",
            "shop__lookup",
            "shop__refund",
            "till__lookup",
            "till__refund"
        ]
    );

    // The till's refund runs at once, on the till, as `refund`.
    let at_till = client
        .call_tool(call("till__refund", json!({"amount": 5})))
        .await
        .unwrap();
    assert_eq!(text(&at_till), "refunded at the till");
    let sent = till.calls();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].tool, "refund");
    assert_eq!(refunds(&shop), 0);

    // The shop's refund is held by the agent's entry, and reaches the shop with a receipt
    // for `refund`.
    let refund = ("shop__refund", json!({"amount": 75}));
    let (refunded, _) = approved(&app, client.peer(), refund, "mcp_shop__refund", || {}).await;
    assert_eq!(text(&refunded), "refunded");
    let claims = received_receipt(&app, &shop, "refund").await;
    assert_eq!(
        (claims.tool.as_str(), claims.aud.as_str()),
        ("refund", "refund")
    );
    assert_eq!(till.calls().len(), 1, "nothing more at the till");
    client.cancel().await.unwrap();
}
