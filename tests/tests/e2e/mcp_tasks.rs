//! A held proxy call as an MCP task (the Tasks extension, `io.modelcontextprotocol/tasks`, of
//! protocol 2026-07-28), driven by rmcp's client with the extension declared on every request:
//! the call is answered with a task as soon as a person must decide, the task follows the run
//! through an approval, a rejection, an expiry and a cancel by the client, on any gateway.

use super::inbox::{Browser, RICK_KEY};
use super::mcp_proxy::{
    OTHER_REQUESTER_KEY, PUBLIC_URL, REFUND_CALL, assert_whole, call, decide_call, endpoint, held,
    held_refund, is_error, meta, proxy_with, refunds, text, upstream, whole_report,
};
use countersign_receipt::mcp::{META_RECEIPT_JTI, META_RUN_ID};
use countersign_tests::app::{PATIENCE, REQUESTER_KEY, TestApp};
use countersign_tests::mcp_server::McpServer;
use countersign_tests::wait_for;
use rmcp::model::{
    CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities, ClientConfig,
    ElicitRequestParams, ElicitationCapability, ErrorCode, GetTaskParams, GetTaskResult,
    Implementation, InputRequest, ProtocolVersion, TaskPayload, TaskStatus, UpdateTaskParams,
    UrlElicitationCapability,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService, ServiceError,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

type Client = RunningService<RoleClient, ClientConfig>;

/// A client of protocol 2026-07-28 that declares the tasks extension, with `key`.
async fn tasks_client(app: &TestApp, key: &str) -> Client {
    client_with(
        app,
        key,
        ClientCapabilities::builder().enable_tasks().build(),
    )
    .await
}

/// [`tasks_client`], which also opens the links it is sent (URL elicitation).
async fn linking_client(app: &TestApp, key: &str) -> Client {
    let mut capabilities = ClientCapabilities::builder().enable_tasks().build();
    capabilities.elicitation =
        Some(ElicitationCapability::new().with_url(UrlElicitationCapability::new()));
    client_with(app, key, capabilities).await
}

async fn client_with(app: &TestApp, key: &str, capabilities: ClientCapabilities) -> Client {
    let info = ClientConfig::new(capabilities, Implementation::new("tasks-test", "1.0.0"));
    let config = StreamableHttpClientTransportConfig::with_uri(endpoint(app)).auth_header(key);
    info.serve_with_lifecycle(
        StreamableHttpClientTransport::from_config(config),
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .unwrap()
}

/// Calls `tool` with `arguments`; the task it is answered with.
async fn task_of(client: &Client, tool: &str, arguments: Value) -> String {
    let answered = client.call_tool_once(call(tool, arguments)).await.unwrap();
    let CallToolResponse::Task(created) = answered else {
        panic!("a task: {answered:?}");
    };
    assert_eq!(created.task.status, TaskStatus::Working);
    assert_eq!(created.task.poll_interval_ms, Some(2000));
    created.task.task_id
}

async fn get(client: &Client, task: &str) -> GetTaskResult {
    client.get_task(GetTaskParams::new(task)).await.unwrap()
}

/// Polls task `task` until it is `status`.
async fn until(client: &Client, task: &str, status: TaskStatus) -> GetTaskResult {
    wait_for(
        &format!("task {task} to be {status:?}"),
        PATIENCE,
        || async {
            let got = client.get_task(GetTaskParams::new(task)).await.ok()?;
            (got.task.status() == status).then_some(got)
        },
    )
    .await
}

fn message(got: &GetTaskResult) -> String {
    got.task.task.status_message.clone().unwrap_or_default()
}

/// The result of a completed task.
fn result(got: &GetTaskResult) -> CallToolResult {
    let TaskPayload::Completed { result } = &got.task.payload else {
        panic!("a completed task: {got:?}");
    };
    serde_json::from_value(Value::Object(result.clone())).unwrap()
}

/// The proxy of `upstream`, whose refunds wait at most an hour (or what `approval` says).
async fn app(upstream: &McpServer, approval: &str) -> TestApp {
    proxy_with(upstream, 60, approval).await
}

#[tokio::test]
async fn a_held_call_is_a_task_that_completes_with_the_whole_result_on_any_gateway() {
    let upstream = upstream().await;
    let mut app = app(&upstream, "").await;
    let client = tasks_client(&app, REQUESTER_KEY).await;

    // Answered at once with a task, not after the proxy's 60 s wait.
    let task = task_of(&client, "export", json!({"month": 5})).await;
    let (run, digest) = held(&app, "mcp_export").await;
    assert_eq!(task, run, "the task is the call's run");
    let waiting = get(&client, &task).await;
    assert_eq!(waiting.task.status(), TaskStatus::Working);
    assert!(
        message(&waiting).starts_with("Waits for a decision by")
            && message(&waiting).ends_with("Nothing has run."),
        "{}",
        message(&waiting)
    );
    assert_eq!(waiting.task.task.ttl_ms, None, "a waiting run is kept");

    // Another gateway answers for it after the first one stopped, and after the decision.
    app.restart_gateway(|_| {}).await;
    let client = tasks_client(&app, REQUESTER_KEY).await;
    assert_eq!(get(&client, &task).await.task.status(), TaskStatus::Working);
    decide_call(
        &app,
        &run,
        "mcp_export",
        &digest,
        json!({"action": "approve"}),
    )
    .await;
    let done = until(&client, &task, TaskStatus::Completed).await;
    let answered = result(&done);
    assert_whole(&answered, &whole_report());
    assert_eq!(meta(&answered)[META_RUN_ID], run.as_str());
    assert!(
        meta(&answered)[META_RECEIPT_JTI].is_string(),
        "{answered:?}"
    );
    assert!(done.task.task.ttl_ms.is_some(), "a finished run expires");
    assert_eq!(upstream.calls().len(), 1, "the upstream tool ran once");

    // The same call again is the same task's run, answered at once.
    let again = client
        .call_tool_once(call("export", json!({"month": 5})))
        .await
        .unwrap();
    let CallToolResponse::Complete(again) = again else {
        panic!("the outcome: {again:?}");
    };
    assert_whole(&again, &whole_report());
    assert_eq!(upstream.calls().len(), 1);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_free_call_is_answered_without_a_task() {
    let upstream = upstream().await;
    let app = app(&upstream, "").await;
    let client = tasks_client(&app, REQUESTER_KEY).await;
    let answered = client
        .call_tool_once(call("lookup", json!({"order_id": "A-1"})))
        .await
        .unwrap();
    let CallToolResponse::Complete(answered) = answered else {
        panic!("the result: {answered:?}");
    };
    assert_eq!(text(&answered), "A-1: $30, paid");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_rejected_or_expired_call_completes_with_the_error_the_model_is_told() {
    let upstream = upstream().await;
    let app = app(&upstream, "timeout = \"2s\"\n").await;
    let client = tasks_client(&app, REQUESTER_KEY).await;

    let rejected = task_of(&client, "refund", json!({"amount": 40})).await;
    let (run, digest) = held_refund(&app).await;
    assert_eq!(rejected, run);
    assert!(
        message(&get(&client, &rejected).await).contains(" until "),
        "the deadline is named"
    );
    let rejection = json!({"action": "reject", "reason": "not this customer"});
    decide_call(&app, &run, REFUND_CALL, &digest, rejection).await;
    let done = until(&client, &rejected, TaskStatus::Completed).await;
    let answered = result(&done);
    assert!(is_error(&answered));
    assert!(
        text(&answered).contains("not this customer"),
        "{answered:?}"
    );

    // Nobody decides the second one: it expires.
    let expired = task_of(&client, "refund", json!({"amount": 41})).await;
    let done = until(&client, &expired, TaskStatus::Completed).await;
    let answered = result(&done);
    assert!(is_error(&answered));
    assert!(text(&answered).contains("deadline"), "{answered:?}");
    assert_eq!(refunds(&upstream), 0, "no refund ran");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_task_the_client_cancels_cancels_its_run_and_only_its_requester_sees_it() {
    let upstream = upstream().await;
    let app = app(&upstream, "").await;
    let client = tasks_client(&app, REQUESTER_KEY).await;
    let task = task_of(&client, "refund", json!({"amount": 75})).await;
    held_refund(&app).await;

    // Another requester is told there is no such task, and cannot cancel it.
    let other = tasks_client(&app, OTHER_REQUESTER_KEY).await;
    let seen = other.get_task(GetTaskParams::new(&task)).await.unwrap_err();
    assert!(seen.to_string().contains("no task"), "{seen}");
    let cancelled = other.cancel_task(CancelTaskParams::new(&task)).await;
    assert!(cancelled.is_err());
    assert_eq!(get(&client, &task).await.task.status(), TaskStatus::Working);
    let unknown = client.get_task(GetTaskParams::new("no-such-task")).await;
    assert!(unknown.is_err());

    client
        .cancel_task(CancelTaskParams::new(&task))
        .await
        .unwrap();
    let done = until(&client, &task, TaskStatus::Cancelled).await;
    assert!(
        message(&done).contains("cancelled by rick"),
        "{}",
        message(&done)
    );
    app.wait_status(&task, "cancelled").await;
    let trail = app.audit_entries(&task).await;
    let asked = trail
        .iter()
        .find(|e| e["kind"] == "cancel_requested")
        .expect("the cancel is audited");
    assert_eq!(
        (&asked["actor"], &asked["channel"]),
        (&json!("rick"), &json!("mcp"))
    );
    assert_eq!(refunds(&upstream), 0, "nothing ran");

    // An ended task cannot be cancelled again.
    assert!(
        client
            .cancel_task(CancelTaskParams::new(&task))
            .await
            .is_err()
    );
    other.cancel().await.unwrap();
    client.cancel().await.unwrap();
}

/// The caller is a person who may decide the held call (the policy lets a requester approve
/// their own): a client that opens links is sent to the call's page in the inbox, where the
/// person signs in and decides. The client's answer to that decides nothing.
#[tokio::test]
async fn a_caller_who_may_decide_is_sent_to_the_call_s_page_and_decides_there() {
    let upstream = upstream().await;
    let app = app(&upstream, "allow_self_approval = true\n").await;
    let client = linking_client(&app, REQUESTER_KEY).await;
    let task = task_of(&client, "refund", json!({"amount": 90})).await;
    let (run, _) = held_refund(&app).await;

    let asked = until(&client, &task, TaskStatus::InputRequired).await;
    let TaskPayload::InputRequired { input_requests } = &asked.task.payload else {
        panic!("input required: {asked:?}");
    };
    let key = format!("countersign.dev/review:{REFUND_CALL}");
    let Some(InputRequest::Elicitation(elicitation)) = input_requests.get(&key) else {
        panic!("an elicitation under {key}: {input_requests:?}");
    };
    let ElicitRequestParams::UrlElicitationParams { url, .. } = &elicitation.params else {
        panic!("a URL elicitation: {elicitation:?}");
    };
    let page = format!("/inbox/runs/{run}/calls/{REFUND_CALL}");
    assert_eq!(url, &format!("{PUBLIC_URL}{page}"));
    // A client that opens no links is not asked.
    let plain = tasks_client(&app, REQUESTER_KEY).await;
    assert_eq!(get(&plain, &task).await.task.status(), TaskStatus::Working);

    // The client's answer is taken as answered, whatever it says, and decides nothing.
    let declined = [(key.clone(), json!({"action": "decline"}))]
        .into_iter()
        .collect();
    client
        .update_task(UpdateTaskParams::new(&task, declined))
        .await
        .unwrap();
    let waiting = get(&client, &task).await;
    assert_eq!(waiting.task.status(), TaskStatus::Working, "asked once");
    assert!(
        message(&waiting).contains(url.as_str()),
        "{}",
        message(&waiting)
    );
    assert_eq!(app.get_run_status(&run).await, "awaiting_approval");

    // rick decides in the inbox, under the same rule as everyone.
    let rick = Browser::signed_in(&app, RICK_KEY).await;
    let shown = rick.get(&page).await;
    assert_eq!(shown.status, reqwest::StatusCode::OK, "{}", shown.html);
    let (csrf, digest) = (shown.input("csrf"), shown.input("digest"));
    let fields = [
        ("csrf", csrf.as_str()),
        ("digest", digest.as_str()),
        ("action", "approve"),
    ];
    let done = rick.post(&page, &fields).await;
    assert_eq!(done.status, reqwest::StatusCode::SEE_OTHER, "{}", done.html);
    let done = until(&client, &task, TaskStatus::Completed).await;
    assert_eq!(text(&result(&done)), "refunded");
    let trail = app.audit_entries(&run).await;
    let decided = trail.iter().find(|e| e["kind"] == "decided").unwrap();
    assert_eq!(
        (&decided["actor"], &decided["channel"]),
        (&json!("rick"), &json!("web"))
    );
    plain.cancel().await.unwrap();
    client.cancel().await.unwrap();
}

/// A client of protocol 2026-07-28 that does not follow tasks never hears "call again": a held
/// call is answered with the error that version has for it (-32021, naming the tasks
/// extension), and the same call from a client that follows tasks is that run's task.
#[tokio::test]
async fn a_newest_client_without_tasks_is_told_the_extension_it_needs() {
    let upstream = upstream().await;
    let app = app(&upstream, "").await;
    let plain = client_with(&app, REQUESTER_KEY, ClientCapabilities::default()).await;
    let refused = plain
        .call_tool_once(call("refund", json!({"amount": 75})))
        .await
        .expect_err("no answer without tasks");
    let ServiceError::McpError(error) = refused else {
        panic!("a JSON-RPC error: {refused:?}");
    };
    assert_eq!(error.code, ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY);
    let required = &error.data.expect("what it requires")["requiredCapabilities"];
    assert_eq!(
        required["extensions"]["io.modelcontextprotocol/tasks"],
        json!({})
    );

    let (run, _) = held_refund(&app).await;
    let client = tasks_client(&app, REQUESTER_KEY).await;
    let task = task_of(&client, "refund", json!({"amount": 75})).await;
    assert_eq!(task, run, "the same call is the same run");
    assert_eq!(refunds(&upstream), 0);
    plain.cancel().await.unwrap();
    client.cancel().await.unwrap();
}

/// What a generated history does to one held refund: a decision, a cancel by the MCP client,
/// or both at once (the second after a drawn delay).
#[derive(Debug, Clone, Copy)]
enum Race {
    Approve,
    Reject,
    Cancel,
    ApproveAndCancel(u64),
    CancelAndApprove(u64),
}

/// Generated histories of held refunds followed as tasks, each decided through the API, cancelled
/// through `tasks/cancel`, or both at once, checked against what must hold whatever the order:
/// the upstream tool runs at most once, never after a refused approval nor in a run whose task
/// ends `cancelled`, and a task completes with the tool's result only if it ran once.
#[tokio::test]
async fn generated_races_of_decisions_and_task_cancels_run_each_refund_at_most_once() {
    let seed = std::env::var("MODEL_CHECK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
    println!("task races: seed {seed} (MODEL_CHECK_SEED={seed} plays them again)");
    let mut rng = countersign_tests::model_check::rng::Rng::new(seed);
    let upstream = upstream().await;
    let app = app(&upstream, "").await;
    let client = tasks_client(&app, REQUESTER_KEY).await;
    let races: Vec<Race> = (0..12)
        .map(|_| match rng.below(5) {
            0 => Race::Approve,
            1 => Race::Reject,
            2 => Race::Cancel,
            3 => Race::ApproveAndCancel(rng.below(40)),
            _ => Race::CancelAndApprove(rng.below(40)),
        })
        .collect();
    let played = futures::future::join_all(races.iter().enumerate().map(|(i, race)| {
        let (app, client) = (&app, &client);
        async move {
            let amount = 100 + i;
            let task = task_of(client, "refund", json!({"amount": amount})).await;
            app.wait_status(&task, "awaiting_approval").await;
            let (_, run) = app.get(&format!("/v1/runs/{task}")).await;
            let digest = run["pending"][0]["digest"].clone();
            let decide = |action: &'static str, wait: u64| {
                let mut decision =
                    json!({"call_id": REFUND_CALL, "digest": digest, "action": action});
                if action == "reject" {
                    decision["reason"] = json!("not now");
                }
                let task = task.clone();
                async move {
                    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                    app.decide(&task, json!([decision])).await.0 == reqwest::StatusCode::OK
                }
            };
            let cancel = |wait: u64| {
                let task = task.clone();
                async move {
                    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                    client
                        .cancel_task(CancelTaskParams::new(task))
                        .await
                        .is_ok()
                }
            };
            let (approved, cancelled) = match *race {
                Race::Approve => (Some(decide("approve", 0).await), None),
                Race::Reject => {
                    assert!(decide("reject", 0).await, "a lone rejection is recorded");
                    (Some(false), None)
                }
                Race::Cancel => (None, Some(cancel(0).await)),
                Race::ApproveAndCancel(d) => {
                    let (a, c) = tokio::join!(decide("approve", 0), cancel(d));
                    (Some(a), Some(c))
                }
                Race::CancelAndApprove(d) => {
                    let (c, a) = tokio::join!(cancel(0), decide("approve", d));
                    (Some(a), Some(c))
                }
            };
            let ended = wait_for(&format!("task {task} to end"), PATIENCE, || async {
                let got = client.get_task(GetTaskParams::new(&task)).await.ok()?;
                got.task.status().is_terminal().then_some(got)
            })
            .await;
            (task, *race, approved, cancelled, ended)
        }
    }))
    .await;

    let calls = upstream.calls();
    for (task, race, approved, cancelled, ended) in played {
        let ran = calls
            .iter()
            .filter(|c| c.meta.get(META_RUN_ID).and_then(Value::as_str) == Some(task.as_str()))
            .count();
        let about = format!(
            "seed {seed}, {race:?}: approved {approved:?}, cancel acked {cancelled:?}, ran {ran}, \
             ended {:?}",
            ended.task.status()
        );
        println!("{about}");
        assert!(ran <= 1, "{about}");
        if approved != Some(true) {
            assert_eq!(ran, 0, "a refund nobody approved ran: {about}");
        }
        match ended.task.status() {
            TaskStatus::Cancelled => assert_eq!(ran, 0, "{about}"),
            TaskStatus::Completed => {
                let answered = result(&ended);
                assert_eq!(!is_error(&answered), ran == 1, "{about}");
            }
            other => panic!("a task ended {other:?}: {about}"),
        }
        if cancelled == Some(true) && approved != Some(true) {
            assert_eq!(ended.task.status(), TaskStatus::Cancelled, "{about}");
        }
        if cancelled.is_none() && approved == Some(true) {
            assert_eq!(
                ran, 1,
                "an approved refund nobody cancelled did not run: {about}"
            );
        }
    }
    client.cancel().await.unwrap();
}
