//! What a message on NATS may claim and the gateway does not believe: an `approval.requested`
//! names a run and calls, and everything else (the input, the agent, the requester, what the
//! model said) is read from the run as stored. A worker's NATS user may publish these events,
//! so a compromised worker host or anyone holding its password could forge one; a standing
//! grant is matched, and a channel is shown the call, as the run stores it.

use super::grants::{grant, held, refund_asked, start, terms};
use approval_gateway::config::WebhookEndpoint;
use countersign_runtime::signing::WebhookSecret;
use countersign_tests::app::{PATIENCE, REVIEWER_KEY, TestApp};
use countersign_tests::wait_for;
use countersign_tests::webhook_receiver::WebhookReceiver;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// An app whose every approval event also goes to `firehose`, where a test sees that the
/// gateway has handled an event (grants are applied before anything is delivered).
async fn app_with(firehose: &WebhookReceiver) -> TestApp {
    let url = firehose.url.clone();
    TestApp::builder(refund_asked)
        .gateway(move |config| {
            config.webhooks = vec![WebhookEndpoint {
                name: "firehose".into(),
                url,
                secret: WebhookSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap(),
                all_events: true,
            }];
        })
        .start()
        .await
}

/// The `approval.requested` the worker published for `run`.
async fn requested(app: &TestApp, run: &str) -> Value {
    let events = app
        .stream_messages("APPROVALS", &format!("approval.requested.{run}"))
        .await;
    assert_eq!(events.len(), 1, "{events:?}");
    events[0].clone()
}

/// Publishes `forged` as the run's `approval.requested` and waits until the firehose got the
/// gateway's delivery of it (the run's second); both deliveries' events.
async fn forge(app: &TestApp, firehose: &WebhookReceiver, run: &str, forged: &Value) -> Vec<Value> {
    app.publish_event(&format!("approval.requested.{run}"), forged)
        .await;
    wait_for("the forged event to be delivered", PATIENCE, || async {
        let shown: Vec<Value> = firehose
            .of_type("approval.requested")
            .iter()
            .map(|r| r.json()["data"].clone())
            .filter(|e| e["run_id"] == run)
            .collect();
        (shown.len() >= 2).then_some(shown)
    })
    .await
}

#[tokio::test]
async fn a_grant_is_matched_against_the_stored_input_not_what_a_forged_event_says() {
    let firehose = WebhookReceiver::start(0).await;
    let app = app_with(&firehose).await;
    // A grant for refunds up to $50 on A- orders.
    let first = start(&app, 30, "A-1", None).await;
    let (status, made) = grant(&app, REVIEWER_KEY, &first, terms(5)).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["grant"]["id"].as_str().unwrap().to_string();
    app.wait_status(&first, "completed").await;

    // A $400 refund waits for a person; its event is sent again saying $25.
    let big = start(&app, 400, "A-2", None).await;
    held(&app, &big).await;
    let mut forged = requested(&app, &big).await;
    forged["calls"][0]["input"]["amount"] = json!(25);
    forged["calls"][0]["summary"] = json!("Refund $25 for order A-2");
    let shown = forge(&app, &firehose, &big, &forged).await;

    // The grant did not decide it, and every channel was shown the $400 as stored.
    for event in &shown {
        assert_eq!(
            event["calls"][0]["input"]["amount"],
            json!(400.0),
            "{event}"
        );
    }
    assert_eq!(app.get_run_status(&big).await, "awaiting_approval");
    let (_, state) = app.get(&format!("/v1/grants/{id}")).await;
    assert_eq!(state["uses"], 0, "{state}");
    assert_eq!(app.tools.refunds().len(), 1, "only the first refund ran");
}

#[tokio::test]
async fn a_requester_s_grant_does_not_cover_another_requester_s_run_said_to_be_theirs() {
    let firehose = WebhookReceiver::start(0).await;
    let app = app_with(&firehose).await;
    let first = start(&app, 30, "A-1", Some("carol")).await;
    let mut scoped = terms(5);
    scoped["same_requester"] = json!(true);
    let (status, made) = grant(&app, REVIEWER_KEY, &first, scoped).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    app.wait_status(&first, "completed").await;

    // Alice's run, forged as carol's.
    let alices = start(&app, 30, "A-2", Some("alice")).await;
    held(&app, &alices).await;
    let mut forged = requested(&app, &alices).await;
    forged["requested_by"] = json!("carol");
    let shown = forge(&app, &firehose, &alices, &forged).await;

    for event in &shown {
        assert_eq!(event["requested_by"], "alice", "{event}");
    }
    assert_eq!(app.get_run_status(&alices).await, "awaiting_approval");
    assert_eq!(
        app.tools.refunds().len(),
        1,
        "only carol's first refund ran"
    );
}

#[tokio::test]
async fn an_event_naming_no_waiting_call_shows_nothing() {
    let firehose = WebhookReceiver::start(0).await;
    let app = app_with(&firehose).await;
    let run = start(&app, 400, "A-1", None).await;
    held(&app, &run).await;
    let real = requested(&app, &run).await;
    let shown = || {
        firehose
            .of_type("approval.requested")
            .into_iter()
            .filter(|r| r.json()["data"]["run_id"] == run.as_str())
            .count()
    };
    wait_for("the real event to be delivered", PATIENCE, || async {
        (shown() == 1).then_some(())
    })
    .await;
    // Another call id, and an earlier turn: neither waits in the run.
    let mut other_call = real.clone();
    other_call["calls"][0]["call_id"] = json!("toolu_forged");
    let mut other_turn = real.clone();
    other_turn["turn"] = json!(7);
    for forged in [&other_call, &other_turn] {
        app.publish_event(&format!("approval.requested.{run}"), forged)
            .await;
    }
    app.wait_deliveries_settled().await;
    assert_eq!(shown(), 1);
    assert_eq!(app.get_run_status(&run).await, "awaiting_approval");
}
