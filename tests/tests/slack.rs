//! Slack: a request is posted with its summary, reason, the agent's words, the evidence and
//! buttons; signed clicks and modal submissions decide; every decision, from any channel,
//! updates the message; forged, stale or unmapped clicks change nothing.

use approval_gateway::slack::signature;
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::fake_model::refund_brain;
use countersign_tests::fake_slack::{
    BOT_TOKEN, CHANNEL_ID, FakeSlack, SIGNING_SECRET, SlackCall, click, form_body, submit,
};
use countersign_tests::wait_for;
use reqwest::StatusCode;
use serde_json::{Value, json};

const POLICY: &str = "approvers = [\"role:finance\"]\nchannels = [\"slack:#refunds\"]\n";

async fn app_with_slack() -> (TestApp, FakeSlack) {
    let slack = FakeSlack::start().await;
    let slack_config = slack.config();
    let app = TestApp::spawn_configured(
        "anthropic",
        1,
        POLICY,
        move |config| {
            config.slack = Some(slack_config);
        },
        refund_brain,
    )
    .await;
    (app, slack)
}

/// Starts a run and waits for its Slack message; returns the run id and the Approve button's value.
async fn posted_run(app: &TestApp, slack: &FakeSlack) -> (String, SlackCall, String) {
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let posted = wait_for("the Slack message", PATIENCE, || async {
        slack.calls("chat.postMessage").pop()
    })
    .await;
    let value = button(&posted.body, "approve");
    (run_id, posted, value)
}

fn button(message: &Value, action: &str) -> String {
    let blocks = message["blocks"].as_array().unwrap();
    let actions = blocks.iter().find(|b| b["type"] == "actions").unwrap();
    let button = actions["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action_id"] == action)
        .unwrap();
    button["value"].as_str().unwrap().to_string()
}

async fn post_signed(
    app: &TestApp,
    payload: &Value,
    timestamp: i64,
    secret: &str,
) -> (StatusCode, String) {
    let body = form_body(payload);
    let ts = timestamp.to_string();
    let response = app
        .http
        .post(format!("{}/slack/interactions", app.gateway_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", &ts)
        .header(
            "x-slack-signature",
            signature::sign(secret, &ts, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    (response.status(), response.text().await.unwrap())
}

async fn interact(app: &TestApp, payload: &Value) -> (StatusCode, String) {
    post_signed(app, payload, chrono::Utc::now().timestamp(), SIGNING_SECRET).await
}

async fn wait_update(slack: &FakeSlack) -> SlackCall {
    wait_for("chat.update", PATIENCE, || async {
        slack.calls("chat.update").pop()
    })
    .await
}

fn all_text(message: &Value) -> String {
    message["blocks"].to_string()
}

#[tokio::test]
async fn a_signed_approve_click_resumes_the_run_and_updates_the_message() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, approve) = posted_run(&app, &slack).await;
    assert_eq!(posted.authorization, format!("Bearer {BOT_TOKEN}"));
    assert_eq!(posted.body["channel"], "#refunds");
    let text = all_text(&posted.body);
    assert!(text.contains("Refund $129 for order A-1001"), "{text}");
    assert!(text.contains("Refund of $129 moves money"), "{text}");
    assert!(
        text.contains("I will check it and refund it"),
        "the agent's words: {text}"
    );
    assert!(
        text.contains("Evidence") && text.contains("delivered"),
        "the order lookup: {text}"
    );
    assert!(
        !text.contains("\"amount\":129"),
        "a summary, not raw JSON: {text}"
    );

    let (status, _) = interact(&app, &click("U_ALICE", "approve", &approve)).await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    let update = wait_update(&slack).await;
    assert_eq!(update.body["channel"], CHANNEL_ID);
    assert_eq!(
        update.body["ts"], "1700000000.000001",
        "the message that was posted"
    );
    let text = all_text(&update.body);
    assert!(text.contains("Approved by alice"), "{text}");
    assert!(
        !text.contains("\"actions\""),
        "the buttons are gone: {text}"
    );

    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let entries = trail["entries"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e["entry"]["kind"] == "notified" && e["entry"]["channel"] == "slack:#refunds")
    );
    let decided = entries
        .iter()
        .find(|e| e["entry"]["kind"] == "decided")
        .unwrap();
    assert_eq!(decided["entry"]["channel"], "slack");
    assert_eq!(decided["entry"]["actor"], "alice");
}

#[tokio::test]
async fn forged_stale_and_unmapped_clicks_change_nothing() {
    let (app, slack) = app_with_slack().await;
    let (run_id, _, approve) = posted_run(&app, &slack).await;
    let now = chrono::Utc::now().timestamp();

    let (status, _) = post_signed(
        &app,
        &click("U_ALICE", "approve", &approve),
        now,
        "wrong-secret",
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = post_signed(
        &app,
        &click("U_ALICE", "approve", &approve),
        now - 600,
        SIGNING_SECRET,
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = interact(&app, &click("U_STRANGER", "approve", &approve)).await;
    assert_eq!(status, 200);
    let told = wait_for("an ephemeral answer", PATIENCE, || async {
        slack.calls("chat.postEphemeral").pop()
    })
    .await;
    assert_eq!(told.body["user"], "U_STRANGER");
    assert!(
        told.body["text"]
            .as_str()
            .unwrap()
            .contains("not an approver")
    );
    // Carol is a person, but not in finance: refused, and told why.
    let (status, _) = interact(&app, &click("U_CAROL", "approve", &approve)).await;
    assert_eq!(status, 200);
    let told = wait_for("a second ephemeral answer", PATIENCE, || async {
        let calls = slack.calls("chat.postEphemeral");
        (calls.len() == 2).then(|| calls[1].clone())
    })
    .await;
    assert!(
        told.body["text"]
            .as_str()
            .unwrap()
            .contains("not among the approvers")
    );

    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["pending"][0]["decision"].is_null());
    assert!(slack.calls("chat.update").is_empty());
}

#[tokio::test]
async fn the_reject_modal_needs_a_reason_and_its_submission_rejects() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, _) = posted_run(&app, &slack).await;
    let reject = button(&posted.body, "reject");
    let (status, _) = interact(&app, &click("U_BOB", "reject", &reject)).await;
    assert_eq!(status, 200);
    let opened = slack
        .calls("views.open")
        .pop()
        .expect("a modal opened at once");
    assert_eq!(opened.body["trigger_id"], "12345.98765.abcd");
    let view = &opened.body["view"];
    assert_eq!(view["callback_id"], "reject");
    let meta = view["private_metadata"].as_str().unwrap();

    let (status, body) = interact(&app, &submit("U_BOB", "reject", meta, &[("reason", " ")])).await;
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["response_action"], "errors");
    assert!(
        body["errors"]["reason"]
            .as_str()
            .unwrap()
            .contains("needs a reason")
    );

    let (status, body) = interact(
        &app,
        &submit(
            "U_BOB",
            "reject",
            meta,
            &[("reason", "Photos show it intact.")],
        ),
    )
    .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    app.wait_status(&run_id, "completed").await;
    assert!(app.tools.refunds().is_empty());
    let text = all_text(&wait_update(&slack).await.body);
    assert!(text.contains("Rejected by bob"), "{text}");
}

#[tokio::test]
async fn the_edit_modal_shows_schema_errors_and_its_submission_runs_the_edit() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, _) = posted_run(&app, &slack).await;
    let edit = button(&posted.body, "edit");
    interact(&app, &click("U_ALICE", "edit", &edit)).await;
    let opened = slack.calls("views.open").pop().expect("the edit modal");
    let view = &opened.body["view"];
    assert_eq!(view["callback_id"], "edit");
    let initial = view["blocks"][0]["element"]["initial_value"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(initial).unwrap()["amount"],
        129
    );
    let meta = view["private_metadata"].as_str().unwrap();

    let bad = r#"{"order_id": "A-1001", "amount": "forty", "reason": "lid"}"#;
    let (_, body) = interact(
        &app,
        &submit(
            "U_ALICE",
            "edit",
            meta,
            &[("input", bad), ("note", "Only the lid.")],
        ),
    )
    .await;
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["response_action"], "errors");
    assert!(
        body["errors"]["input"]
            .as_str()
            .unwrap()
            .contains("/amount"),
        "{body}"
    );
    let (_, body) = interact(
        &app,
        &submit(
            "U_ALICE",
            "edit",
            meta,
            &[("input", "{not json"), ("note", "n")],
        ),
    )
    .await;
    assert!(body.contains("not valid JSON"), "{body}");

    let good = r#"{"order_id": "A-1001", "amount": 49, "reason": "lid"}"#;
    let (status, body) = interact(
        &app,
        &submit(
            "U_ALICE",
            "edit",
            meta,
            &[("input", good), ("note", "Only the lid.")],
        ),
    )
    .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds()[0]["amount"], 49);
    assert!(all_text(&wait_update(&slack).await.body).contains("Approved with edits by alice"));
}

#[tokio::test]
async fn slack_and_the_api_racing_on_one_call_record_exactly_one_decision_and_slack_shows_it() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, approve) = posted_run(&app, &slack).await;
    let digest: Value = serde_json::from_str::<Value>(&approve).unwrap()["d"].clone();
    let reject =
        json!([{"call_id": "toolu_2", "digest": digest, "action": "reject", "reason": "no"}]);
    let path = format!("/v1/runs/{run_id}/decisions");
    let api_decision = app.request(
        reqwest::Method::POST,
        &path,
        Some(countersign_tests::app::INTEGRATION_KEY),
        Some(json!({"decided_by": "bob", "decisions": reject})),
    );
    let click = click("U_ALICE", "approve", &approve);
    let slack_decision = interact(&app, &click);
    let ((api_status, _), (slack_status, _)) = tokio::join!(api_decision, slack_decision);
    assert_eq!(slack_status, 200);
    app.wait_status(&run_id, "completed").await;

    let (_, run) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let decided: Vec<&Value> = run["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["entry"]["kind"] == "decided")
        .collect();
    assert_eq!(decided.len(), 1, "exactly one decision is recorded");
    let winner = decided[0]["entry"]["actor"].as_str().unwrap();
    let update = all_text(&wait_update(&slack).await.body);
    if winner == "alice" {
        assert_eq!(app.tools.refunds().len(), 1);
        assert_eq!(api_status, 409);
        assert!(update.contains("Approved by alice"), "{update}");
    } else {
        assert!(app.tools.refunds().is_empty());
        assert_eq!(api_status, 200);
        assert!(update.contains("Rejected by bob"), "{update}");
        assert_eq!(
            slack.calls("chat.postEphemeral").len(),
            1,
            "alice is told she lost"
        );
    }
    assert_eq!(posted.body["channel"], "#refunds");
}
