//! Who starts a run: only the gateway, which stores it with the requester its door
//! established before it publishes `runs.start`. A `runs.start` published by anyone else, for
//! a run nobody created, is acked and counted by the worker and changes nothing.

use countersign_fake_model::refund_brain;
use countersign_model::events::{Envelope, Event};
use countersign_model::run::RunId;
use countersign_runtime::names::Names;
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::wait_for;
use serde_json::json;

#[tokio::test]
async fn a_runs_start_published_straight_to_nats_creates_no_run_whoever_it_names() {
    let app = TestApp::spawn(refund_brain).await;
    let names = Names::new(&app.namespace).unwrap();
    // What a client that can publish to NATS would send to have a refund run as bob's.
    let run_id = RunId::new();
    let forged = Envelope::new(Event::RunStart {
        run_id: run_id.clone(),
        agent: "refunds".into(),
        input: "Refund A-1001 please.".into(),
        requested_by: Some("bob".into()),
        metadata: json!({}),
    });
    // Only gateways (and admin) may publish runs.start with the shipped permissions: the
    // forger here holds admin's credentials.
    let js = app.infra.jetstream().await;
    js.publish(
        names.runs_start(),
        serde_json::to_vec(&forged).unwrap().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();

    // The worker took it, counted it and acked it: the work queue is empty again.
    wait_for("the worker to count the forged start", PATIENCE, || async {
        let n = app
            .workers_metric(
                1,
                r#"countersign_unknown_run_messages_total{stream="RUNS"}"#,
            )
            .await;
        (n == 1.0).then_some(())
    })
    .await;
    wait_for("the forged start to be acked", PATIENCE, || async {
        let mut runs = js.get_stream(names.runs_stream()).await.ok()?;
        let left = runs.info().await.ok()?.state.messages;
        (left == 0).then_some(())
    })
    .await;

    // Nothing of it anywhere: no run, no key in Redis, no pause, no model call.
    let (status, _) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(status, 404);
    let mut redis = app.infra.redis().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{run_id}*"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    let requested = app
        .stream_messages("APPROVALS", &format!("approval.requested.{run_id}"))
        .await;
    assert!(requested.is_empty(), "{requested:?}");
    assert!(app.model.requests().is_empty(), "the model was called");

    // A run started through the gateway still goes through, as its real requester's.
    let run = app.refund_cycle().await;
    let (_, body) = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(body["requested_by"], "rick", "{body}");
}
