//! Redis (append-only file on) and NATS (file storage) each restarted in the middle of a
//! batch of runs: no paused run, decision or job is lost, and no refund runs twice.

use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::fake_model::refund_brain;
use countersign_tests::infra::Infra;
use countersign_tests::wait_for;
use futures::future::join_all;
use serde_json::Value;

const RUNS: usize = 30;

#[tokio::test]
async fn restarting_redis_and_nats_mid_batch_loses_nothing() {
    let infra = Infra::start_restartable().await;
    let app = TestApp::spawn_on(infra, "anthropic", 2, "", |_| {}, refund_brain).await;
    let inputs: Vec<String> = (0..RUNS).map(|i| format!("Restart refund {i}.")).collect();
    let runs: Vec<String> = join_all(inputs.iter().map(|i| app.start_run(i))).await;
    let paused = join_all(
        runs.iter()
            .map(|id| app.wait_status(id, "awaiting_approval")),
    )
    .await;
    let digests: Vec<Value> = paused
        .iter()
        .map(|r| r["pending"][0]["digest"].clone())
        .collect();
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
            app.tools.received("/refunds", &format!("{id}:toolu_2")),
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
    let agents = std::env::temp_dir().join(format!("cs-redis-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&agents).unwrap();
    let mut config = approval_gateway::config::Config::default();
    config.infra = infra.config(&format!(
        "t{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    config.agents_dir = agents.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/readyz", listener.local_addr().unwrap());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let gateway = tokio::spawn(approval_gateway::run(config, listener, shutdown.clone()));

    infra.start_redis().await;
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(3))
        .build()
        .unwrap();
    wait_for(
        "the gateway to be ready once Redis is",
        PATIENCE,
        || async {
            assert!(
                !gateway.is_finished(),
                "the gateway gave up while Redis was away"
            );
            let r = http.get(&url).send().await.ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
    shutdown.cancel();
    gateway.await.unwrap().unwrap();
    std::fs::remove_dir_all(&agents).unwrap();
}
