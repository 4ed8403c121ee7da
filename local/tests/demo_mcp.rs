//! The demo tools over MCP, as rmcp's own client sees them: both tools listed across pages
//! with their hints, the same answers as over HTTP, one refund per idempotency key, and
//! refunds over the limit only with a valid receipt.

use axum::Json;
use axum::routing::get;
use countersign_local::demo_tools::{Countersigned, DemoTools};
use countersign_receipt::mcp::{META_IDEMPOTENCY_KEY, META_RECEIPT, META_RECEIPT_REFUSED};
use countersign_receipt::{Claims, KeySet, Signer};
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, JsonObject, MetaObject, PaginatedRequestParams,
    RequestMetaObject,
};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Value, json};
use tokio::net::TcpListener;

type Client = RunningService<RoleClient, ()>;

async fn demo(countersigned: Option<Countersigned>) -> DemoTools {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    DemoTools::serve_watched(listener, countersigned).unwrap().0
}

/// A jti file of the test's own.
fn jtis_file() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "demo-receipts-{}.jsonl",
        uuid::Uuid::new_v4().simple()
    ))
}

async fn client(tools: &DemoTools) -> Client {
    ().serve(StreamableHttpClientTransport::from_uri(tools.mcp_url()))
        .await
        .unwrap()
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(object) => object,
        other => panic!("{other} is not an object"),
    }
}

/// A `tools/call` of `tool` with these arguments and this `_meta`.
fn call(tool: &str, arguments: Value, meta: Value) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(tool.to_string()).with_arguments(object(arguments));
    params.meta = Some(RequestMetaObject(MetaObject(object(meta))));
    params
}

fn text(result: &CallToolResult) -> &str {
    &result.content[0].as_text().expect("a text block").text
}

#[tokio::test]
async fn both_tools_are_listed_one_per_page_with_their_hints() {
    let tools = demo(None).await;
    let client = client(&tools).await;

    let first = client
        .list_tools(Some(PaginatedRequestParams::default()))
        .await
        .unwrap();
    assert_eq!(first.tools.len(), 1, "one tool a page");
    assert!(first.next_cursor.is_some(), "a cursor to the next page");

    let listed = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["get_order", "issue_refund"]);
    let (get_order, issue_refund) = (&listed[0], &listed[1]);

    let hints = get_order.annotations.as_ref().unwrap();
    assert_eq!(hints.title.as_deref(), Some("Look up an order"));
    assert_eq!(hints.read_only_hint, Some(true));
    assert_eq!(hints.idempotent_hint, Some(true));
    assert_eq!(
        get_order.description.as_deref(),
        Some("Look up an order by id: status, amount in USD, payments.")
    );
    assert_eq!(
        Value::Object((*get_order.input_schema).clone()),
        json!({"type": "object", "properties": {"order_id": {"type": "string"}},
               "required": ["order_id"]})
    );

    let hints = issue_refund.annotations.as_ref().unwrap();
    assert_eq!(hints.read_only_hint, Some(false));
    assert_eq!(hints.destructive_hint, Some(true));
    assert_eq!(hints.idempotent_hint, Some(true));
    assert_eq!(
        issue_refund.description.as_deref(),
        Some("Refund an amount in USD for an order.")
    );
    assert_eq!(
        issue_refund.input_schema["properties"]["amount"]["maximum"],
        json!(500)
    );
    assert_eq!(
        issue_refund.input_schema["required"],
        json!(["order_id", "amount", "reason"])
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn get_order_answers_the_order_as_structured_content_and_as_text() {
    let tools = demo(None).await;
    let client = client(&tools).await;

    let found = client
        .call_tool(call("get_order", json!({"order_id": "A-1001"}), json!({})))
        .await
        .unwrap();
    assert_eq!(found.is_error, Some(false));
    let order = found.structured_content.clone().unwrap();
    assert_eq!(order["order_id"], "A-1001");
    assert_eq!(order["amount"], json!(129));
    assert_eq!(serde_json::from_str::<Value>(text(&found)).unwrap(), order);

    let missing = client
        .call_tool(call("get_order", json!({"order_id": "A-9"}), json!({})))
        .await
        .unwrap();
    assert_eq!(missing.is_error, Some(true));
    assert_eq!(text(&missing), "no order A-9");

    assert_eq!(tools.received_by_key("mcp:get_order")[""], 2);
    assert!(tools.received_by_key("/orders/lookup").is_empty());
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_refund_called_twice_under_one_idempotency_key_refunds_once() {
    let tools = demo(None).await;
    let client = client(&tools).await;
    let refund = || {
        call(
            "issue_refund",
            json!({"order_id": "A-1002", "amount": 15.5, "reason": "broken"}),
            json!({META_IDEMPOTENCY_KEY: "run-a:1:toolu_1"}),
        )
    };

    let first = client.call_tool(refund()).await.unwrap();
    let again = client.call_tool(refund()).await.unwrap();
    assert_eq!(first.is_error, Some(false));
    assert_eq!(again.structured_content, first.structured_content);
    assert_eq!(first.structured_content.unwrap()["refund_id"], "rf_1");
    assert_eq!(tools.refunds().len(), 1);
    assert_eq!(tools.received("mcp:issue_refund", "run-a:1:toolu_1"), 2);
    assert_eq!(tools.received("/refunds", "run-a:1:toolu_1"), 0);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_refund_over_the_limit_without_a_receipt_is_refused_and_runs_nothing() {
    // Nothing listens at the keys' address: a missing receipt is refused before they are
    // needed.
    let tools = demo(Some(Countersigned {
        jwks_url: "http://127.0.0.1:9/.well-known/jwks.json".into(),
        issuer: "http://gateway.test".into(),
        jtis_file: jtis_file(),
    }))
    .await;
    let client = client(&tools).await;

    let refused = client
        .call_tool(call(
            "issue_refund",
            json!({"order_id": "A-1001", "amount": 129.0, "reason": "broken"}),
            json!({META_IDEMPOTENCY_KEY: "run-b:1:toolu_2"}),
        ))
        .await
        .unwrap();
    assert_eq!(refused.is_error, Some(true));
    assert!(text(&refused).contains("(missing)"), "{}", text(&refused));
    let meta = refused.meta.as_ref().unwrap();
    assert_eq!(meta.0[META_RECEIPT_REFUSED], "missing");
    assert_eq!(tools.refused(), ["missing"]);
    assert!(tools.refunds().is_empty());
    assert_eq!(tools.received("mcp:issue_refund", "run-b:1:toolu_2"), 0);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_refund_over_the_limit_runs_with_a_valid_receipt_in_meta() {
    let (signer, _) = Signer::generate("mcp-test").unwrap();
    let keys = KeySet {
        keys: vec![signer.public().clone()],
    };
    let jwks = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks_url = format!(
        "http://{}/.well-known/jwks.json",
        jwks.local_addr().unwrap()
    );
    let app = axum::Router::new().route(
        "/.well-known/jwks.json",
        get(move || async move { Json(keys) }),
    );
    tokio::spawn(async move { axum::serve(jwks, app).await });
    let issuer = "http://gateway.test".to_string();
    let tools = demo(Some(Countersigned {
        jwks_url,
        issuer: issuer.clone(),
        jtis_file: jtis_file(),
    }))
    .await;
    let client = client(&tools).await;

    let input = json!({"order_id": "A-1001", "amount": 129.0, "reason": "broken"});
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let receipt = signer.sign(&Claims {
        iss: issuer,
        aud: "issue_refund".into(),
        iat: now,
        exp: now + 600,
        jti: "receipt-c".into(),
        run_id: "run-c".into(),
        turn: 1,
        call_id: "toolu_2".into(),
        tool: "issue_refund".into(),
        input_digest: countersign_receipt::input_digest(&input),
        action: "approve".into(),
        decided_by: vec!["rita".into()],
        policy_version: "p".into(),
        grant: None,
        risk: None,
        stages: Vec::new(),
        windows: Vec::new(),
    });

    let ran = client
        .call_tool(call(
            "issue_refund",
            input,
            json!({META_IDEMPOTENCY_KEY: "run-c:1:toolu_2", META_RECEIPT: receipt}),
        ))
        .await
        .unwrap();
    assert_eq!(ran.is_error, Some(false), "{}", text(&ran));
    assert_eq!(tools.refunds().len(), 1);
    assert_eq!(tools.receipts()[0].run_id, "run-c");
    assert_eq!(tools.carrying_receipts("mcp:issue_refund"), 1);
    assert!(tools.refused().is_empty());
    client.cancel().await.unwrap();
}
