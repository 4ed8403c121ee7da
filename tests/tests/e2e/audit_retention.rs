//! A finished run's audit trail is retained like the run: its copy in Redis expires with the
//! run's other keys, and the `AUDIT` stream, the long-term record, serves it after.

use countersign_fake_model::refund_brain;
use countersign_model::run::RunId;
use countersign_runtime::names::Names;
use countersign_store::keys::{Keys, Shard};
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::wait_for;
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn a_finished_runs_trail_expires_with_it_and_is_then_read_whole_from_the_audit_stream() {
    let app = TestApp::spawn(refund_brain).await;
    let run = app.refund_cycle().await;
    let (status, kept) = app.get(&format!("/v1/runs/{run}/audit")).await;
    assert_eq!(status, StatusCode::OK, "{kept}");
    let elements = kept["entries"].as_array().unwrap().clone();
    assert!(elements.len() >= 4, "{kept}");

    let id = RunId::parse(&run).unwrap();
    let names = Names::new(&app.namespace).unwrap();
    let keys = Keys::of(&names);
    let mut redis = app.infra.redis().await;
    let ttl = |key: String| {
        let mut redis = redis.clone();
        async move {
            let ttl: i64 = redis::cmd("TTL")
                .arg(key)
                .query_async(&mut redis)
                .await
                .unwrap();
            ttl
        }
    };
    let (run_ttl, audit_ttl) = (ttl(keys.run_key(&id)).await, ttl(keys.audit_key(&id)).await);
    assert!(audit_ttl > 0, "the trail expires: {audit_ttl}");
    assert!(
        (run_ttl - audit_ttl).abs() <= 1,
        "with the run: {run_ttl} against {audit_ttl}"
    );
    // The indexes of its shard, which the step that finished it marked, are every run's.
    for key in keys.shard_keys(Shard::of(&id)) {
        assert!(ttl(key.clone()).await < 0, "{key} does not expire");
    }

    // Every element has reached the stream (through the outbox); one of them twice, as an
    // outbox publishing again after the stream's duplicate window would leave it.
    let subject = format!("audit.{run}");
    wait_for("the trail on the AUDIT stream", PATIENCE, || async {
        (app.stream_messages("AUDIT", &subject).await.len() == elements.len()).then_some(())
    })
    .await;
    let js = app.infra.jetstream().await;
    js.publish(names.audit_subject(&id), elements[1].to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();

    // The retention passes: the run's keys go, as their TTL makes them.
    let () = redis::cmd("DEL")
        .arg(&keys.run_keys(&id))
        .query_async(&mut redis)
        .await
        .unwrap();
    let (status, _) = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, served) = app.get(&format!("/v1/runs/{run}/audit")).await;
    assert_eq!(status, StatusCode::OK, "{served}");
    assert_eq!(served["verified"], true, "{served}");
    assert_eq!(
        served["entries"],
        json!(elements),
        "the same chain, each element once"
    );
    assert_eq!(served["refusals"], json!([]));

    // A run nobody ever started has no trail anywhere.
    let unknown = RunId::new();
    let (status, body) = app.get(&format!("/v1/runs/{unknown}/audit")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}
