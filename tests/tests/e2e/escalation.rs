//! Reminders go out before a deadline; a deadline with `on_expiry = "escalate"` asks more
//! approvers once and extends the deadline, and expires the call if they do not decide either.

use countersign_fake_model::{last_results, refund_brain};
use countersign_tests::app::{INTEGRATION_KEY, PATIENCE, TestApp};
use countersign_tests::fake_slack::FakeSlack;
use countersign_tests::wait_for;
use reqwest::Method;
use serde_json::{Value, json};

async fn app_with(policy: &str, slack: &FakeSlack) -> TestApp {
    let slack_config = slack.config();
    TestApp::builder(refund_brain)
        .workers(2)
        .policy(policy)
        .gateway(move |config| {
            config.slack = Some(slack_config);
        })
        .start()
        .await
}

async fn decide_as(
    app: &TestApp,
    person: &str,
    run_id: &str,
    digest: &Value,
) -> reqwest::StatusCode {
    let decision = json!({"call_id": "toolu_2", "digest": digest, "action": "approve"});
    let body = json!({"decided_by": person, "decisions": [decision]});
    let path = format!("/v1/runs/{run_id}/decisions");
    app.request(Method::POST, &path, Some(INTEGRATION_KEY), Some(body))
        .await
        .0
}

/// Slack replies in the thread of the call's message.
async fn thread_reply(slack: &FakeSlack, containing: &str) -> Value {
    wait_for(
        &format!("a Slack thread reply with {containing:?}"),
        PATIENCE,
        || async {
            slack
                .calls("chat.postMessage")
                .into_iter()
                .map(|c| c.body)
                .find(|b| {
                    b.get("thread_ts").is_some()
                        && b["text"].as_str().unwrap_or("").contains(containing)
                })
        },
    )
    .await
}

async fn kinds(app: &TestApp, run_id: &str) -> Vec<String> {
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    countersign_tests::audit_kinds(&trail)
}

#[tokio::test]
async fn approvers_are_reminded_before_the_deadline() {
    let slack = FakeSlack::start().await;
    let policy = "timeout = \"30s\"\nremind_before = \"29s\"\nchannels = [\"slack:#refunds\"]\n";
    let app = app_with(policy, &slack).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let reply = thread_reply(&slack, "Reminder").await;
    assert_eq!(reply["thread_ts"], "1700000000.000001");
    assert!(kinds(&app, &run_id).await.contains(&"reminded".to_string()));
    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn an_escalated_call_can_be_decided_by_the_people_escalated_to() {
    let slack = FakeSlack::start().await;
    // Three seconds, then three more after the escalation: time enough for bob to decide.
    let policy = "approvers = [\"alice\"]\ntimeout = \"3s\"\non_expiry = \"escalate\"\nescalate_to = [\"bob\"]\nchannels = [\"slack:#refunds\"]\n";
    let app = app_with(policy, &slack).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let digest = paused["pending"][0]["digest"].clone();
    let first_deadline = paused["pending"][0]["deadline"].as_i64().unwrap();

    let escalated = wait_for("the call to escalate", PATIENCE, || async {
        let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
        (run["pending"][0]["escalated"] == true).then_some(run)
    })
    .await;
    let call = &escalated["pending"][0];
    assert_eq!(call["approvers"], json!(["alice", "bob"]));
    assert!(
        call["deadline"].as_i64().unwrap() > first_deadline,
        "the deadline moved once"
    );
    assert_eq!(call["digest"], digest, "what is decided has not changed");
    assert!(
        thread_reply(&slack, "Escalated").await["text"]
            .as_str()
            .unwrap()
            .contains("<@U_BOB>")
    );

    assert_eq!(decide_as(&app, "bob", &run_id, &digest).await, 200);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    let kinds = kinds(&app, &run_id).await;
    assert!(
        kinds.contains(&"escalated".to_string()) && !kinds.contains(&"expired".to_string()),
        "{kinds:?}"
    );
    // Escalated once, by whichever of the two workers swept the deadline.
    let escalations = app
        .workers_metric(2, r#"countersign_calls_total{event="escalated"}"#)
        .await;
    assert_eq!(escalations, 1.0);
}

#[tokio::test]
async fn an_escalated_call_nobody_decides_expires_after_its_second_deadline() {
    let slack = FakeSlack::start().await;
    let policy = "approvers = [\"alice\"]\ntimeout = \"1s\"\non_expiry = \"escalate\"\nescalate_to = [\"role:finance\"]\n";
    let app = app_with(policy, &slack).await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    app.wait_status(&run_id, "completed").await;
    assert!(app.tools.refunds().is_empty());
    let results = last_results(&app.model.requests()[1]);
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap()
            .contains("before its deadline")
    );
    let kinds = kinds(&app, &run_id).await;
    let escalated = kinds
        .iter()
        .position(|k| k == "escalated")
        .expect("escalated first");
    let expired = kinds
        .iter()
        .position(|k| k == "expired")
        .expect("then expired");
    assert!(escalated < expired, "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| *k == "escalated").count(),
        1,
        "{kinds:?}"
    );
}

#[tokio::test]
async fn escalating_a_call_anyone_could_decide_asks_the_target_and_takes_nobody_away() {
    let slack = FakeSlack::start().await;
    let policy = "timeout = \"2s\"\non_expiry = \"escalate\"\nescalate_to = [\"bob\"]\nchannels = [\"slack:#refunds\"]\n";
    let app = app_with(policy, &slack).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let digest = paused["pending"][0]["digest"].clone();

    let escalated = wait_for("the call to escalate", PATIENCE, || async {
        let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
        (run["pending"][0]["escalated"] == true).then_some(run)
    })
    .await;
    let call = &escalated["pending"][0];
    assert!(call["deciders"].is_null(), "still open to anyone: {call}");
    assert!(
        thread_reply(&slack, "Escalated").await["text"]
            .as_str()
            .unwrap()
            .contains("<@U_BOB>"),
        "bob is asked"
    );
    // alice, who is not the escalation target, still decides it.
    assert_eq!(decide_as(&app, "alice", &run_id, &digest).await, 200);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
}
