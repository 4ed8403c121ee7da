//! Redis (append-only file on) and NATS (file storage) each restarted in the middle of a
//! batch of runs: no paused run, decision or job is lost, and no refund runs twice.

use countersign_fake_model::refund_brain;
use countersign_runtime::names::Service;
use countersign_tests::app::{TestApp, gateway_waits_for};
use countersign_tests::infra::Infra;
use futures::future::join_all;
use serde_json::Value;

const RUNS: usize = 30;

#[tokio::test]
async fn restarting_redis_and_nats_mid_batch_loses_nothing() {
    let infra = Infra::start_restartable().await;
    let app = TestApp::builder(refund_brain)
        .workers(2)
        .on(infra)
        .start()
        .await;
    let inputs: Vec<String> = (0..RUNS).map(|i| format!("Restart refund {i}.")).collect();
    let (runs, digests): (Vec<String>, Vec<Value>) =
        app.paused_refunds(&inputs).await.into_iter().unzip();
    let third = RUNS / 3;

    // A third decided, then Redis restarts under everything paused and in flight.
    join_all((0..third).map(|i| app.approve_until_accepted(&runs[i], "toolu_2", &digests[i])))
        .await;
    app.infra.restart_redis().await;
    // Another third decided, then NATS restarts.
    join_all(
        (third..2 * third).map(|i| app.approve_until_accepted(&runs[i], "toolu_2", &digests[i])),
    )
    .await;
    app.infra.restart_nats().await;
    join_all(
        (2 * third..RUNS).map(|i| app.approve_until_accepted(&runs[i], "toolu_2", &digests[i])),
    )
    .await;

    join_all(runs.iter().map(|id| app.wait_status(id, "completed"))).await;
    for id in &runs {
        assert_eq!(
            app.tools.received("/refunds", &format!("{id}:1:toolu_2")),
            1,
            "run {id}"
        );
    }
    assert_eq!(app.tools.refunds().len(), RUNS);
}

#[tokio::test]
async fn a_gateway_started_before_redis_waits_for_it() {
    let infra = Infra::start_restartable().await;
    infra.stop_redis().await;
    let namespace = infra.new_namespace().await;
    let connections = infra.connections(&namespace, Service::Gateway);
    gateway_waits_for("Redis", connections, infra.start_redis()).await;
}
