//! Webhooks: approval events go out signed per Standard Webhooks and are retried until they
//! land, a dead endpoint holds up no other, and other systems may post decisions signed the
//! same way, for the people they may speak for.

use approval_gateway::config::{SignedSender, WebhookEndpoint};
use countersign_fake_model::refund_brain;
use countersign_runtime::signing::WebhookSecret;
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::webhook_receiver::WebhookReceiver;
use countersign_tests::{metric_value, wait_for};
use reqwest::StatusCode;
use serde_json::{Value, json};

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const OTHER_SECRET: &str = "whsec_YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE=";

fn endpoint(name: &str, url: &str, all_events: bool) -> WebhookEndpoint {
    WebhookEndpoint {
        name: name.into(),
        url: url.into(),
        secret: WebhookSecret::parse(SECRET).unwrap(),
        all_events,
    }
}

#[tokio::test]
async fn approval_events_are_signed_retried_and_not_held_up_by_a_dead_endpoint() {
    let ops = WebhookReceiver::start(1).await;
    let firehose = WebhookReceiver::start(0).await;
    let (ops_url, firehose_url) = (ops.url.clone(), firehose.url.clone());
    let policy = "channels = [\"webhook:ops\", \"webhook:dead\"]\n";
    let app = TestApp::builder(refund_brain)
        .policy(policy)
        .gateway(move |config| {
            config.webhooks = vec![
                endpoint("ops", &ops_url, false),
                endpoint("dead", "http://127.0.0.1:9/hook", false),
                endpoint("firehose", &firehose_url, true),
            ];
            config.delivery_retry_base_ms = 50;
        })
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;

    // The first attempt at ops fails; the retry carries the same webhook-id.
    let attempts = wait_for("two attempts at the ops webhook", PATIENCE, || async {
        let r = ops.of_type("approval.requested");
        (r.len() >= 2).then_some(r)
    })
    .await;
    assert_eq!(attempts[0].id, attempts[1].id);
    let secret = WebhookSecret::parse(SECRET).unwrap();
    let now = chrono::Utc::now().timestamp();
    for attempt in &attempts {
        secret
            .verify(
                &attempt.id,
                &attempt.timestamp,
                &attempt.signature,
                &attempt.body,
                now,
            )
            .expect("a valid Standard Webhooks signature");
    }
    let body = attempts[1].json();
    assert_eq!(body["data"]["run_id"], run_id.as_str());
    assert_eq!(
        body["data"]["calls"][0]["summary"],
        "Refund $129 for order A-1001"
    );
    assert!(body["timestamp"].as_str().unwrap().ends_with('Z'));

    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    let decided = wait_for("approval.decided at ops", PATIENCE, || async {
        ops.of_type("approval.decided").pop()
    })
    .await;
    assert_eq!(decided.json()["data"]["decided_by"], "rita");
    assert_eq!(decided.json()["data"]["action"], "approve");
    wait_for("both events at the firehose", PATIENCE, || async {
        let types: Vec<Value> = firehose
            .received()
            .iter()
            .map(|r| r.json()["type"].clone())
            .collect();
        (types.contains(&json!("approval.requested")) && types.contains(&json!("approval.decided")))
            .then_some(())
    })
    .await;
    app.wait_status(&run_id, "completed").await;

    // The failed attempts are in the gateway's figures.
    let text = app.gateway_metrics().await;
    for series in [
        r#"countersign_delivery_failures_total{channel="webhook"}"#,
        r#"countersign_jetstream_redeliveries_total{stream="DELIVERIES"}"#,
    ] {
        assert!(
            metric_value(&text, series) >= Some(1.0),
            "{series} in\n{text}"
        );
    }
}

async fn signed_decision(
    app: &TestApp,
    run_id: &str,
    secret: &str,
    timestamp: i64,
    body: &Value,
) -> (StatusCode, Value) {
    let raw = body.to_string();
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let signature = WebhookSecret::parse(secret)
        .unwrap()
        .sign(&id, timestamp, raw.as_bytes());
    let response = app
        .http
        .post(format!("{}/v1/runs/{run_id}/decisions", app.gateway_url))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(raw)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn a_signed_decision_counts_only_from_a_known_sender_for_people_it_may_speak_for() {
    let app = TestApp::builder(refund_brain)
        .policy("approvers = [\"role:finance\"]\n")
        .gateway(|config| {
            config.signed_senders = vec![SignedSender {
                name: "ops-desk".into(),
                secret: WebhookSecret::parse(SECRET).unwrap(),
                speaks_for: vec!["alice".into()],
            }];
        })
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let digest = &paused["pending"][0]["digest"];
    let decision = |person: &str| json!({"run_id": run_id, "decided_by": person, "decisions": [{"call_id": "toolu_2", "digest": digest, "action": "approve"}]});
    let now = chrono::Utc::now().timestamp();

    let (status, body) =
        signed_decision(&app, &run_id, OTHER_SECRET, now, &decision("alice")).await;
    assert_eq!(status, 401, "a forged signature: {body}");
    let (status, body) =
        signed_decision(&app, &run_id, SECRET, now - 600, &decision("alice")).await;
    assert_eq!(status, 401, "a stale timestamp: {body}");
    let (status, body) = signed_decision(&app, &run_id, SECRET, now, &decision("bob")).await;
    assert_eq!(
        status, 403,
        "bob is not someone ops-desk speaks for: {body}"
    );
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert!(run["pending"][0]["decision"].is_null());

    let (status, body) = signed_decision(&app, &run_id, SECRET, now, &decision("alice")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decided_by"], "alice");
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn a_pause_after_a_megabyte_and_a_half_of_model_text_still_reaches_its_channel() {
    use countersign_fake_model::{anthropic_text, anthropic_tool_use, turn};
    // 1.5 MB of the model's words (in lines, as a model writes), then the refund it holds:
    // the announcement of the pause would be over NATS's 1 MiB limit.
    let line = format!("{}\n", "word ".repeat(199));
    let said = format!("BEGIN {} END", line.repeat(1_500_000 / line.len()));
    let spoken = said.clone();
    let ops = WebhookReceiver::start(0).await;
    let ops_url = ops.url.clone();
    let app = TestApp::builder(move |request: &Value| {
        if turn(request) > 0 {
            return anthropic_text("Refunded.");
        }
        let input = json!({"order_id": "A-1001", "amount": 129, "reason": "arrived broken"});
        anthropic_tool_use(&spoken, &[("toolu_2", "issue_refund", input)])
    })
    .policy("channels = [\"webhook:ops\"]\n")
    .gateway(move |config| {
        config.webhooks = vec![endpoint("ops", &ops_url, false)];
    })
    .start()
    .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;

    // The channel is told, with the model's words cut to fit and saying so.
    let requested = wait_for("approval.requested at ops", PATIENCE, || async {
        ops.of_type("approval.requested").pop()
    })
    .await;
    assert!(
        requested.body.len() < 1024 * 1024,
        "{}",
        requested.body.len()
    );
    let data = &requested.json()["data"];
    assert_eq!(data["calls"][0]["call_id"], "toolu_2");
    assert_eq!(data["calls"][0]["input"]["amount"], 129);
    let text = data["text"].as_str().unwrap();
    assert!(
        text.starts_with("BEGIN") && text.ends_with("END"),
        "{text:.200}"
    );
    assert!(text.contains("left out here"), "{text:.200}");
    assert!(text.len() < said.len());

    // The run keeps it whole, and goes on when the refund is approved.
    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
}
