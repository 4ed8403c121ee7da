//! Cancelling a run: the requester or an admin stops it at its next step; its undecided calls
//! close (their channels say so), nothing held runs, `run.cancelled` is published and the
//! audit trail has who asked and that it stopped.

use approval_gateway::config::{ApiKey, Role};
use countersign_tests::app::{ADMIN_KEY, PATIENCE, REQUESTER_KEY, REVIEWER_KEY, TestApp};
use countersign_tests::audit_kinds as kinds;
use countersign_tests::fake_model::refund_brain;
use countersign_tests::fake_slack::FakeSlack;
use countersign_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const OTHER_REQUESTER_KEY: &str = "test-other-requester-key-0123";

async fn cancel(
    app: &TestApp,
    key: &str,
    run_id: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    app.request(
        Method::POST,
        &format!("/v1/runs/{run_id}/cancel"),
        Some(key),
        body,
    )
    .await
}

#[tokio::test]
async fn the_requester_cancels_a_paused_run_its_call_closes_and_nothing_runs() {
    let slack = FakeSlack::start().await;
    let slack_config = slack.config();
    let app = TestApp::spawn_configured(
        "anthropic",
        1,
        "channels = [\"slack:#refunds\"]\n",
        move |config| config.slack = Some(slack_config),
        refund_brain,
    )
    .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    wait_for("the Slack message", PATIENCE, || async {
        slack.calls("chat.postMessage").pop()
    })
    .await;

    let (status, body) = cancel(
        &app,
        REQUESTER_KEY,
        &run_id,
        Some(json!({"reason": "the customer withdrew the request"})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "cancelling");
    let done = app.wait_status(&run_id, "cancelled").await;
    assert_eq!(done["cancel"]["by"], "rick");
    assert_eq!(
        done["cancel"]["reason"],
        "the customer withdrew the request"
    );

    // Too late to decide; nothing ran, and the Slack message says why.
    let (status, body) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "run_cancelled");
    assert!(app.tools.refunds().is_empty());
    let update = wait_for("the Slack message to say cancelled", PATIENCE, || async {
        slack.calls("chat.update").pop()
    })
    .await;
    assert!(
        update.body.to_string().contains("Cancelled"),
        "{:?}",
        update.body
    );

    let ended = app
        .stream_messages("RUN_EVENTS", &format!("run.cancelled.{run_id}"))
        .await;
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0]["cancelled_by"], "rick");
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    assert_eq!(trail["verified"], true);
    // (Slack's "notified" entry lands whenever its delivery finished.)
    let kinds: Vec<String> = kinds(&trail)
        .into_iter()
        .filter(|k| k != "notified")
        .collect();
    assert_eq!(kinds, ["requested", "cancel_requested", "cancelled"]);
    assert_eq!(
        app.model.requests().len(),
        1,
        "the model is not asked again"
    );

    // Cancelling again: the run has finished.
    let (status, body) = cancel(&app, REQUESTER_KEY, &run_id, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test]
async fn a_queued_run_cancelled_before_any_worker_took_it_never_reaches_the_model() {
    let mut app = TestApp::spawn_with("anthropic", 0, refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let (status, body) = cancel(&app, ADMIN_KEY, &run_id, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    app.spawn_worker();
    let done = app.wait_status(&run_id, "cancelled").await;
    assert_eq!(done["cancel"]["by"], "admin");
    assert!(app.model.requests().is_empty());
}

#[tokio::test]
async fn only_the_requester_or_an_admin_may_cancel() {
    let app = TestApp::spawn_configured(
        "anthropic",
        1,
        "",
        |config| {
            config.api_keys.push(ApiKey {
                key: OTHER_REQUESTER_KEY.into(),
                role: Role::Requester,
                principal: "ria".into(),
                speaks_for: Vec::new(),
            })
        },
        refund_brain,
    )
    .await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    for key in [REVIEWER_KEY, OTHER_REQUESTER_KEY] {
        let (status, body) = cancel(&app, key, &run_id, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    }
    let (status, body) = cancel(&app, REQUESTER_KEY, &run_id, Some(json!({"why": "x"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an unknown field: {body}");
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["cancel"].is_null());
    let (status, body) = cancel(&app, "no-such-key-0123456789", &run_id, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, body) = cancel(&app, ADMIN_KEY, "run_nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}
