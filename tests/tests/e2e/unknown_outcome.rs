//! A call whose worker died after starting it, on a tool that is not idempotent, is never
//! sent again: the model is told its outcome is unknown and `run.attention` asks a person.

use countersign_fake_model::{last_results, refund_brain};
use countersign_runtime::metrics::Metrics;
use countersign_tests::app::{PATIENCE, TestApp};

#[tokio::test]
async fn a_started_call_found_after_a_crash_is_reported_unknown_and_not_run_again() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let mut attention = app.attention_events(&run_id).await;

    app.mark_started(&run_id, "toolu_2").await;

    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(
        app.tools
            .received("/refunds", &format!("{run_id}:1:toolu_2")),
        0,
        "never sent again"
    );
    let event = app.assert_refund_reported_unknown(&mut attention).await;
    assert_eq!(event["type"], "run.attention");
    assert_eq!(event["call_id"], "toolu_2");
    assert_eq!(event["input"]["amount"], 129);
}

#[tokio::test]
async fn a_started_call_on_an_idempotent_tool_is_sent_again_with_the_same_key() {
    let mut app = TestApp::builder(refund_brain).workers(0).start().await;
    let refunds = format!("http = {{ url = \"{}/refunds\" }}", app.tools.base_url);
    app.rewrite_agent(|agent| agent.replace(&refunds, &format!("{refunds}\nidempotent = true")));
    app.spawn_worker();
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    app.mark_started(&run_id, "toolu_2").await;

    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(
        app.tools
            .received("/refunds", &format!("{run_id}:1:toolu_2")),
        1
    );
    assert_eq!(app.tools.refunds().len(), 1);
    let results = last_results(&app.model.requests()[1]);
    assert!(results[1]["content"].as_str().unwrap().contains("refunded"));
}

#[tokio::test]
async fn a_run_whose_stored_state_cannot_be_read_asks_for_attention_instead_of_retrying_forever() {
    let mut app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    app.stop_worker(0).await;
    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    // Someone (or a bug) writes a decision no worker can read.
    let mut conn = app.infra.redis().await;
    let _: i64 = redis::cmd("HSET")
        .arg(format!("cs:{}:decisions:{{{run_id}}}", app.namespace))
        .arg("toolu_2")
        .arg("{not json")
        .query_async(&mut conn)
        .await
        .unwrap();

    app.spawn_worker();
    let attention = countersign_tests::wait_for("run.attention", PATIENCE, || async {
        app.stream_messages("RUN_EVENTS", &format!("run.attention.{run_id}"))
            .await
            .pop()
    })
    .await;
    assert!(
        attention["reason"]
            .as_str()
            .unwrap()
            .contains("cannot be read"),
        "{attention}"
    );
    assert!(attention["call_id"].is_null());
    // The decision's message was acked, not handed back again and again.
    app.decisions_drained().await;
    assert!(app.tools.refunds().is_empty());
}

#[tokio::test]
async fn an_attempt_that_lost_the_reply_to_its_own_mark_may_still_make_its_call() {
    use countersign_model::run::RunId;
    use countersign_store::{ExecBegin, Store, StoreError};
    let app = TestApp::spawn(refund_brain).await;
    let names = countersign_runtime::names::Names::new(&app.namespace).unwrap();
    let keys = countersign_store::keys::Keys::of(&names);
    let store = Store::connect(&app.connections(), names, Metrics::default())
        .await
        .unwrap();
    let run = RunId::new();
    // A run driven by worker-a: only the lease's holder may start a call.
    let run_key = keys.run_key(&run);
    let mut conn = app.infra.redis().await;
    let _: i64 = redis::cmd("HSET")
        .arg(&run_key)
        .arg(&["status", "running", "lease_owner", "worker-a"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    // The first ask marks the call; asking again with the same token (its reply was lost)
    // still lets this attempt call; another attempt finds it interrupted.
    let begin = |owner: &'static str, token: &'static str| {
        let store = store.clone().worker();
        let run = run.clone();
        async move { store.exec_begin(&run, owner, "toolu_2", token).await }
    };
    assert_eq!(
        begin("worker-a", "attempt-a").await.unwrap(),
        ExecBegin::Run
    );
    assert_eq!(
        begin("worker-a", "attempt-a").await.unwrap(),
        ExecBegin::Run
    );
    assert_eq!(
        begin("worker-a", "attempt-b").await.unwrap(),
        ExecBegin::InterruptedBefore
    );
    // A worker without the lease starts nothing.
    assert!(matches!(
        begin("worker-b", "attempt-c").await,
        Err(StoreError::LostLease(status)) if status == "running"
    ));
    // Nor does anyone once a cancel was accepted.
    let _: i64 = redis::cmd("HSET")
        .arg(&run_key)
        .arg(&["cancel", "{}"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(matches!(
        begin("worker-a", "attempt-a").await,
        Err(StoreError::Cancelled)
    ));
}
