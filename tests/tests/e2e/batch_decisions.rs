//! `POST /v1/decisions`: one request deciding calls of several runs. Each run's decisions
//! are recorded by its own script step, so a stale digest refuses that run's decision and the
//! others are recorded; the answer says what became of each.

use countersign_fake_model::refund_brain;
use countersign_tests::app::{READER_KEY, REVIEWER_KEY, TestApp};
use reqwest::Method;
use serde_json::{Value, json};

async fn batch(app: &TestApp, key: &str, body: Value) -> (reqwest::StatusCode, Value) {
    app.request(Method::POST, "/v1/decisions", Some(key), Some(body))
        .await
}

#[tokio::test]
async fn a_batch_records_each_run_s_decision_and_refuses_only_the_stale_one() {
    let app = TestApp::spawn(refund_brain).await;
    let inputs: Vec<String> = (1..=3)
        .map(|i| format!("Refund order A-1001, case {i}."))
        .collect();
    let paused = app.paused_refunds(&inputs).await;
    let decision = |run: &str, digest: &Value| json!({"run_id": run, "call_id": "toolu_2", "digest": digest, "action": "approve"});
    let (status, answer) = batch(
        &app,
        REVIEWER_KEY,
        json!({"decisions": [
            decision(&paused[0].0, &paused[0].1),
            // What a page showed before the call changed: another run's digest.
            decision(&paused[1].0, &paused[0].1),
            decision(&paused[2].0, &paused[2].1),
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{answer}");
    let of = |run: &str| results.iter().find(|r| r["run_id"] == run).unwrap();
    assert_eq!(of(&paused[0].0)["status"], "recorded");
    assert_eq!(of(&paused[2].0)["status"], "recorded");
    let stale = of(&paused[1].0);
    assert_eq!(stale["status"], "refused", "{stale}");
    assert_eq!(stale["http_status"], 409, "{stale}");

    app.wait_status(&paused[0].0, "completed").await;
    app.wait_status(&paused[2].0, "completed").await;
    assert_eq!(app.get_run_status(&paused[1].0).await, "awaiting_approval");
    assert_eq!(app.tools.refunds().len(), 2);
}

#[tokio::test]
async fn a_batch_is_refused_whole_for_bad_shape_or_a_key_that_may_not_decide() {
    let app = TestApp::spawn(refund_brain).await;
    let digest = format!("sha256:{}", "0".repeat(64));
    let one =
        json!({"run_id": "run_x", "call_id": "toolu_2", "digest": digest, "action": "approve"});
    let (status, body) = batch(&app, READER_KEY, json!({"decisions": [one]})).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = batch(&app, REVIEWER_KEY, json!({"decisions": []})).await;
    assert_eq!(status, 400, "{body}");
    let too_many: Vec<Value> = (0..101).map(|_| one.clone()).collect();
    let (status, body) = batch(&app, REVIEWER_KEY, json!({"decisions": too_many})).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = batch(
        &app,
        REVIEWER_KEY,
        json!({"decisions": [{"call_id": "toolu_2", "action": "approve"}]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("run_id"),
        "{body}"
    );
    let (status, body) = batch(
        &app,
        REVIEWER_KEY,
        json!({"decisions": [{"run_id": "run_x", "call_id": "c", "action": "approve", "extra": 1}]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // A run that does not exist is refused in the answer, as any run's refusal.
    let (status, body) = batch(&app, REVIEWER_KEY, json!({"decisions": [one]})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["status"], "refused");
    assert_eq!(body["results"][0]["http_status"], 404);
}
