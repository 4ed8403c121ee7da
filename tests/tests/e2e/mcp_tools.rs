//! Agents whose tools are MCP servers': discovered when the agent loads (every page), held or
//! run by the same policies as HTTP tools (the server's hints counting only where the agent
//! trusts it), called through the same execution record, with sessions that come back after
//! the server does.

use countersign_fake_model::{last_results, refund_brain};
use countersign_model::agent::Catalog;
use countersign_model::approval::{ApprovalDef, ApprovalMode};
use countersign_model::mcp::McpServerDef;
use countersign_runtime::mcp::McpClients;
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::mcp_server::{McpServer, TestAnswer, TestTool};
use countersign_tests::wait_for;
use rmcp::model::ToolAnnotations;
use serde_json::{Map, Value, json};
use std::path::PathBuf;

#[tokio::test]
async fn an_mcp_agent_looks_up_at_once_and_refunds_once_after_approval() {
    let app = TestApp::builder(refund_brain).mcp_tools().start().await;
    let run_id = app
        .start_run("Order A-1001 arrived broken, please refund it.")
        .await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let pending = &paused["pending"][0];
    assert_eq!(pending["tool"], "issue_refund");
    assert_eq!(pending["summary"], "Refund $129 for order A-1001");
    // The server's read-only lookup ran while the refund waited.
    let key_of = |call: &str| format!("{run_id}:1:{call}");
    assert_eq!(app.tools.received("mcp:get_order", &key_of("toolu_1")), 1);
    assert_eq!(
        app.tools.received("mcp:issue_refund", &key_of("toolu_2")),
        0
    );

    let (status, body) = app.approve(&run_id, "toolu_2", &pending["digest"]).await;
    assert_eq!(status, 200, "{body}");
    app.wait_status(&run_id, "completed").await;
    assert_eq!(
        app.tools.received("mcp:issue_refund", &key_of("toolu_2")),
        1
    );
    assert_eq!(app.tools.refunds().len(), 1);
    // The refund ran with the decision's receipt, carried in `_meta`.
    let receipts = app.tools.receipts();
    assert_eq!(receipts.len(), 1);
    assert_eq!(
        (receipts[0].run_id.as_str(), receipts[0].call_id.as_str()),
        (run_id.as_str(), "toolu_2")
    );
    let results = last_results(&app.model.requests()[1]);
    let content = |i: usize| results[i]["content"].as_str().unwrap().to_string();
    assert!(
        content(0).contains("\"status\":\"delivered\""),
        "{}",
        content(0)
    );
    assert!(
        content(1).contains("\"status\":\"refunded\""),
        "{}",
        content(1)
    );
}

#[tokio::test]
async fn a_started_mcp_call_found_after_a_crash_is_reported_unknown_and_not_sent_again() {
    let app = TestApp::builder(refund_brain).mcp_tools().start().await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let mut attention = app.attention_events(&run_id).await;
    app.mark_started(&run_id, "toolu_2").await;

    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;
    let key = format!("{run_id}:1:toolu_2");
    assert_eq!(
        app.tools.received("mcp:issue_refund", &key),
        0,
        "never sent again"
    );
    app.assert_refund_reported_unknown(&mut attention).await;
}

#[tokio::test]
async fn a_started_call_of_an_idempotent_mcp_tool_is_sent_again_with_the_same_key() {
    let mut app = TestApp::builder(refund_brain)
        .mcp_tools()
        .workers(0)
        .start()
        .await;
    app.rewrite_agent(|agent| agent.replace("mcp = \"shop\"", "mcp = \"shop\"\nidempotent = true"));
    app.spawn_worker();
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    app.mark_started(&run_id, "toolu_2").await;

    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;
    let key = format!("{run_id}:1:toolu_2");
    assert_eq!(app.tools.received("mcp:issue_refund", &key), 1);
    assert_eq!(app.tools.refunds().len(), 1);
}

/// A folder holding one agent, `shop`, whose tools come from the MCP server at `url`, with
/// `server` lines added to its `[[mcp_servers]]` entry.
fn shop_agent(url: &str, server: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cs-mcp-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = format!(
        "name = \"shop\"\nsystem = \"s\"\n[model]\nprovider = \"scripted\"\nname = \"m\"\n\
         [[mcp_servers]]\nname = \"orders\"\nurl = \"{url}\"\n{server}\n"
    );
    std::fs::write(dir.join("shop.toml"), text).unwrap();
    dir
}

async fn load(dir: &std::path::Path) -> Result<Catalog, String> {
    countersign_runtime::agents::load_dir(dir, &McpClients::default())
        .await
        .map_err(|e| e.to_string())
}

fn lookup() -> TestTool {
    TestTool {
        annotations: Some(ToolAnnotations::new().read_only(true).idempotent(true)),
        ..TestTool::new("lookup", TestAnswer::Text("found".into()))
    }
}

fn refund() -> TestTool {
    TestTool::new("refund", TestAnswer::Text("refunded".into()))
}

#[tokio::test]
async fn discovery_reads_every_page_and_a_tool_added_upstream_changes_the_versions() {
    let tools = vec![
        lookup(),
        refund(),
        TestTool::new("third", TestAnswer::Text("3".into())),
    ];
    let server = McpServer::start(tools.clone(), 1).await;
    let dir = shop_agent(&server.url(), "trusted = true");
    let before = load(&dir).await.unwrap();
    let before = before.get("shop").unwrap();
    let names: Vec<_> = before.def.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["lookup", "refund", "third"], "one page each");

    let mut more = tools.clone();
    more.push(TestTool::new("fourth", TestAnswer::Text("4".into())));
    server.set_tools(more).await;
    let after = load(&dir).await.unwrap();
    let after = after.get("shop").unwrap();
    assert!(after.tool("fourth").is_some());
    assert_ne!(
        before.version, after.version,
        "the agent's version follows the server"
    );
    let version = |agent: std::sync::Arc<countersign_model::agent::Agent>, tool| {
        agent.tool(tool).unwrap().policy_version()
    };
    assert_eq!(version(before.clone(), "refund"), version(after, "refund"));

    let mut changed = tools;
    changed[1].description = "Refunds, now in two currencies.".into();
    server.set_tools(changed).await;
    let reworded = load(&dir).await.unwrap();
    let reworded = reworded.get("shop").unwrap();
    assert_ne!(
        version(before.clone(), "refund"),
        version(reworded.clone(), "refund"),
        "what a held call is bound to changed"
    );
    assert_eq!(version(before, "lookup"), version(reworded, "lookup"));
}

#[tokio::test]
async fn annotations_set_policies_only_for_a_trusted_server() {
    let server = McpServer::start(vec![lookup(), refund()], 10).await;
    let runs_at_once = |catalog: &Catalog, tool| {
        let agent = catalog.get("shop").unwrap();
        let tool = agent.tool(tool).unwrap();
        (
            matches!(tool.approval, ApprovalDef::Mode(ApprovalMode::Never)),
            tool.idempotent,
        )
    };
    let trusted = load(&shop_agent(&server.url(), "trusted = true"))
        .await
        .unwrap();
    assert_eq!(runs_at_once(&trusted, "lookup"), (true, true));
    assert_eq!(
        runs_at_once(&trusted, "refund"),
        (false, false),
        "no hints: it may destroy"
    );
    let untrusted = load(&shop_agent(&server.url(), "")).await.unwrap();
    assert_eq!(
        runs_at_once(&untrusted, "lookup"),
        (false, false),
        "its hints decide nothing"
    );
}

#[tokio::test]
async fn header_values_come_from_files_and_a_server_refusing_them_refuses_the_agent() {
    let server =
        McpServer::start_with_header(vec![lookup()], 10, ("authorization", "Bearer s3cret")).await;
    let token = std::env::temp_dir().join(format!("cs-mcp-token-{}", uuid::Uuid::new_v4()));
    std::fs::write(&token, "s3cret\n").unwrap();
    let headers = format!(
        "timeout_ms = 2000\nheaders = {{ authorization = \"Bearer ${{file:{}}}\" }}",
        token.display()
    );
    let loaded = load(&shop_agent(&server.url(), &headers)).await.unwrap();
    assert!(loaded.get("shop").unwrap().tool("lookup").is_some());

    std::fs::write(&token, "wrong").unwrap();
    let Err(refused) = load(&shop_agent(&server.url(), &headers)).await else {
        panic!("an agent whose server refuses its headers loaded");
    };
    assert!(refused.contains("MCP server \"orders\""), "{refused}");
}

#[tokio::test]
async fn a_server_that_went_down_fails_calls_until_it_is_back_then_the_session_reopens() {
    let mut server = McpServer::start(vec![lookup()], 10).await;
    let def: McpServerDef = toml::from_str(&format!(
        "name = \"orders\"\nurl = \"{}\"\ntimeout_ms = 2000",
        server.url()
    ))
    .unwrap();
    let clients = McpClients::default();
    let arguments = json!({});
    let call = || clients.call("shop", &def, "lookup", &arguments, Map::new());
    assert_eq!(call().await.unwrap()["content"][0]["text"], "found");

    server.stop().await;
    assert!(
        call().await.is_err(),
        "a call to a server that is down fails"
    );
    let backing_off = call().await.unwrap_err().to_string();
    assert!(backing_off.contains("not reachable"), "{backing_off}");

    server.restart().await;
    let answered = wait_for("the session to reopen", PATIENCE, || async {
        call().await.ok()
    })
    .await;
    assert_eq!(answered["content"][0]["text"], "found");
    // Nothing was sent twice: the failed calls never reached the server.
    assert_eq!(server.calls().len(), 2);
}

#[tokio::test]
async fn a_server_run_beside_the_process_is_reached_over_stdio() {
    let command = format!("command = [{:?}]", env!("CARGO_BIN_EXE_mcp_stdio"));
    let dir = shop_agent("unused", "");
    // The same agent, reached by its command instead of a URL.
    let path = dir.join("shop.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("url = \"unused\"", &command)).unwrap();
    let clients = McpClients::default();
    let catalog = countersign_runtime::agents::load_dir(&dir, &clients)
        .await
        .unwrap();
    let agent = catalog.get("shop").unwrap();
    assert!(agent.tool("echo").is_some());
    let server = agent.def.mcp_server("orders").unwrap();
    let answer = clients
        .call("shop", server, "echo", &json!({"a": 1}), Map::new())
        .await
        .unwrap();
    assert_eq!(answer["content"][0]["text"], "echoed");
}

#[tokio::test]
async fn content_blocks_reach_the_model_as_the_provider_takes_them_and_errors_stay_errors() {
    let tools = vec![
        TestTool {
            annotations: Some(ToolAnnotations::new().read_only(true)),
            ..TestTool::new("get_order", TestAnswer::Image("iVBORw0KGgo=".into()))
        },
        TestTool::new(
            "issue_refund",
            TestAnswer::Error("the card was closed".into()),
        ),
    ];
    let server = McpServer::start(tools, 10).await;
    let mut app = TestApp::builder(refund_brain)
        .mcp_tools()
        .workers(0)
        .start()
        .await;
    let demo = app.tools.mcp_url();
    app.rewrite_agent(|agent| agent.replace(&demo, &server.url()));
    app.spawn_worker();
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;

    let results = last_results(&app.model.requests()[1]);
    // Anthropic's shape: the text (which names the image for reviewers), then the image.
    assert_eq!(
        results[0]["content"],
        json!([
            {"type": "text", "text": "[image image/png]"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        ])
    );
    assert_eq!(results[1]["is_error"], true);
    assert_eq!(results[1]["content"], "the card was closed");
    let calls = server.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[1].meta["countersign.dev/idempotency_key"],
        format!("{run_id}:1:toolu_2")
    );
    assert!(
        calls[1].meta["countersign.dev/receipt"].is_string(),
        "an approved call carries its receipt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_during_an_mcp_call_leaves_it_unknown_and_it_is_never_sent_again() {
    let tools = vec![
        TestTool {
            annotations: Some(ToolAnnotations::new().read_only(true)),
            ..TestTool::new("get_order", TestAnswer::Text("delivered".into()))
        },
        TestTool::new("issue_refund", TestAnswer::Text("refunded".into())),
    ];
    let server = McpServer::start(tools, 10).await;
    let app = TestApp::builder(refund_brain)
        .mcp_tools()
        .workers(0)
        .start()
        .await;
    let demo = app.tools.mcp_url();
    app.rewrite_agent(|agent| agent.replace(&demo, &server.url()));
    let dir = app.agents_dir().join("processes");
    std::fs::create_dir_all(&dir).unwrap();
    let config = super::chaos::worker_process_config_on(&app, &dir, app.agents_dir());
    let mut first = super::chaos::worker_command(&config).spawn().unwrap();

    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let mut attention = app.attention_events(&run_id).await;
    server.hold("issue_refund");
    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    // The refund reached the server; the worker dies before it can record the answer.
    server.wait_calls(2).await;
    first.kill().await.unwrap();
    server.release();

    let _second = super::chaos::worker_command(&config).spawn().unwrap();
    app.wait_status(&run_id, "completed").await;
    let refunds = server
        .calls()
        .iter()
        .filter(|c| c.tool == "issue_refund")
        .count();
    assert_eq!(refunds, 1, "never sent again: the tool is not idempotent");
    app.assert_refund_reported_unknown(&mut attention).await;
}

#[tokio::test]
async fn an_approved_call_of_an_mcp_tool_whose_definition_changed_is_held_again_not_run() {
    let tool = |schema: Value| TestTool {
        input_schema: schema,
        ..TestTool::new("issue_refund", TestAnswer::Text("refunded".into()))
    };
    let lookup = TestTool {
        annotations: Some(ToolAnnotations::new().read_only(true)),
        ..TestTool::new("get_order", TestAnswer::Text("delivered".into()))
    };
    let server = McpServer::start(vec![lookup.clone(), tool(json!({"type": "object"}))], 10).await;
    let mut app = TestApp::builder(refund_brain)
        .mcp_tools()
        .workers(0)
        .start()
        .await;
    let demo = app.tools.mcp_url();
    app.rewrite_agent(|agent| agent.replace(&demo, &server.url()));
    let first = app.spawn_worker();
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    app.stop_worker(first).await;
    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    // The server ships a new version of the tool while the approved call waits to run.
    let stricter = json!({"type": "object", "properties": {"amount": {"type": "number"}}});
    server.set_tools(vec![lookup, tool(stricter)]).await;
    app.spawn_worker();
    let again = wait_for("the call to be held again", PATIENCE, || async {
        let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
        (run["pending"][0]["call_id"] == "toolu_2.r2").then(|| run["pending"][0].clone())
    })
    .await;
    assert_eq!(again["recheck"]["decision"]["action"], "approve");
    assert_ne!(again["policy_version"], again["recheck"]["policy_version"]);
    assert!(
        server.calls().iter().all(|c| c.tool != "issue_refund"),
        "the refund was not sent"
    );
}
