//! Redis deployed for failure, as the README's Deployment section describes it: behind
//! Sentinel, or as a Cluster. Runs go through pause, decision and completion on it; then its
//! master is killed (SIGKILL) with half the runs still waiting, the replica is promoted, and
//! every run still completes with each refund applied once and its audit chain intact. The
//! test prints how long decisions were refused and how long the runs took to resume. Writes
//! can be made to wait for replicas, and the services log in as an ACL user and over TLS
//! with a client certificate.

use countersign_fake_model::refund_brain;
use countersign_model::run::RunId;
use countersign_runtime::metrics::Metrics;
use countersign_runtime::names::{Names, Service};
use countersign_store::{DueTimer, Store, Timer};
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::infra::Infra;
use countersign_tests::redis_deployments::{MASTER_NAME, bridge_ip, kill, query};
use countersign_tests::wait_for;
use futures::future::join_all;
use serde_json::Value;
use std::time::Instant;

const RUNS: usize = 20;

/// Drives the runs on `app`, killing the master at `killed_ip` once half are done.
async fn runs_complete_across_a_failover(app: &TestApp, label: &str, killed_ip: &str) {
    let inputs: Vec<String> = (0..RUNS).map(|i| format!("Failover refund {i}.")).collect();
    let (runs, digests): (Vec<String>, Vec<Value>) =
        app.paused_refunds(&inputs).await.into_iter().unzip();
    let (first, second) = (0..RUNS / 2, RUNS / 2..RUNS);
    join_all(
        first
            .clone()
            .map(|i| app.approve_until_accepted(&runs[i], "toolu_2", &digests[i])),
    )
    .await;
    join_all(first.map(|i| app.wait_status(&runs[i], "completed"))).await;

    let node = app
        .infra
        .redis_nodes()
        .await
        .into_iter()
        .find(|(ip, _)| ip == killed_ip)
        .expect("the master is one of the deployment's containers")
        .1;
    // What the master acknowledged so far reaches a replica before it dies: this is a test of
    // the failover, not of Redis's asynchronous replication, which a loaded machine can hold
    // back for seconds (`redis_wait_replicas` closes that gap where it is set).
    let replicated: i64 = query(killed_ip, 6379, redis::cmd("WAIT").arg(1).arg(30_000))
        .await
        .expect("WAIT on the master");
    assert!(replicated >= 1, "no replica caught up with the master");
    kill(node).await;
    let killed = Instant::now();
    join_all(
        second
            .clone()
            .map(|i| app.approve_until_accepted(&runs[i], "toolu_2", &digests[i])),
    )
    .await;
    let accepted = killed.elapsed();
    join_all(second.map(|i| app.wait_status(&runs[i], "completed"))).await;
    let resumed = killed.elapsed();
    println!(
        "{label}: master killed; decisions accepted again after {:.1} s, all {} runs completed after {:.1} s",
        accepted.as_secs_f64(),
        RUNS / 2,
        resumed.as_secs_f64()
    );

    for id in &runs {
        assert_eq!(
            app.tools.received("/refunds", &format!("{id}:1:toolu_2")),
            1,
            "run {id}"
        );
        let (_, audit) = app.get(&format!("/v1/runs/{id}/audit")).await;
        assert_eq!(audit["verified"], true, "run {id}: {audit}");
    }
    assert_eq!(app.tools.refunds().len(), RUNS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_a_killed_master_is_replaced_and_every_run_completes_once() {
    let infra = Infra::start_sentinel().await;
    let master_ip = bridge_ip(&infra.redis).await;
    let sentinel = infra.redis_url.split(',').next().unwrap().to_string();
    let app = TestApp::builder(refund_brain)
        .workers(2)
        .on(infra)
        .start()
        .await;
    runs_complete_across_a_failover(&app, "sentinel", &master_ip).await;

    // The Sentinels name a former replica as the master now.
    let (ip, port) = sentinel
        .trim_start_matches("redis://")
        .split_once(':')
        .unwrap();
    let named: Vec<String> = wait_for("the Sentinels to name a master", PATIENCE, || async {
        query(
            ip,
            port.parse().unwrap(),
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER_NAME),
        )
        .await
    })
    .await;
    assert_ne!(named[0], master_ip);

    // A write that fewer replicas hold than asked for is not taken as done.
    let mut config = app.connections();
    config.redis_wait_replicas = 3;
    let store = Store::connect(
        &config,
        Names::new(&app.namespace).unwrap(),
        Metrics::default(),
    )
    .await
    .unwrap();
    let run_id = RunId::new();
    let timer = DueTimer {
        member: format!("{run_id}|call_1|digest"),
        run_id,
        call_id: "call_1".into(),
        digest: "digest".into(),
    };
    let err = store
        .worker()
        .drop_timer(Timer::Deadline, &timer)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not replicated"), "{err}");
}

#[tokio::test]
async fn services_log_in_as_the_configured_acl_user_and_a_wrong_password_stops_them() {
    let infra = Infra::start_with_acl_user("countersign", "acl-password-123").await;
    infra.register_namespace("tacl").await;
    let mut wrong = infra.connections("tacl", Service::Gateway);
    wrong.redis_password = Some("not-the-password".into());
    let err = Store::connect(&wrong, Names::new("tacl").unwrap(), Metrics::default())
        .await
        .err()
        .expect("a wrong password is refused");
    assert!(err.to_string().contains("authentication failed"), "{err}");
    // A service so configured stops at start instead of waiting for Redis.
    let agents = std::env::temp_dir().join(format!("cs-acl-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&agents).unwrap();
    let gateway = approval_gateway::config::Config {
        connections: wrong,
        agents_dir: agents,
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let run = approval_gateway::run(gateway, listener, Default::default());
    let stopped = tokio::time::timeout(PATIENCE, run)
        .await
        .expect("it stopped");
    assert!(stopped.is_err());

    let app = TestApp::builder(refund_brain).on(infra).start().await;
    app.refund_cycle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_killed_master_is_replaced_and_every_run_completes_once() {
    let infra = Infra::start_cluster().await;
    let master_ip = bridge_ip(&infra.redis).await;
    let role: Vec<redis::Value> = query(&master_ip, 6379, &redis::cmd("ROLE")).await.unwrap();
    assert_eq!(role[0], redis::Value::BulkString(b"master".to_vec()));
    let app = TestApp::builder(refund_brain)
        .workers(2)
        .on(infra)
        .start()
        .await;
    // The runs' keys, and the shards of the indexes, spread over all three masters.
    runs_complete_across_a_failover(&app, "cluster", &master_ip).await;

    let survivor = bridge_ip(&app.infra.redis_others[0]).await;
    let nodes: String = query(&survivor, 6379, redis::cmd("CLUSTER").arg("NODES"))
        .await
        .unwrap();
    let killed = nodes
        .lines()
        .find(|l| l.contains(&format!("{master_ip}:6379")))
        .unwrap();
    assert!(killed.contains("fail"), "{nodes}");
}

/// The steps that span runs keep their atomicity on a cluster, each one script on its own
/// slot wherever the runs' keys are: a window's (eight refunds of $30 at once against $100 a
/// day: exactly three run), the delegations' (carol decides alice's call in both names).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_windows_and_delegations_keep_their_atomic_steps() {
    let infra = Infra::start_cluster().await;
    let app = super::door::external("kiosk", super::windows::AGENT_FILE)
        .agent("cover.toml", super::delegations::AGENT_FILE.to_string())
        .on(infra)
        .start()
        .await;
    let keys: Vec<String> = (0..8).map(|i| format!("race-{i}")).collect();
    let asked = join_all(
        keys.iter()
            .map(|key| super::windows::refund(&app, key, "c-1", 30.0)),
    )
    .await;
    let allowed = asked.iter().filter(|s| s["status"] == "allowed").count();
    assert_eq!(allowed, 3, "{asked:#?}");

    let (status, made) = super::delegations::delegate(&app, "alice", None, "carol").await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{made}");
    let call = super::delegations::held(&app, "refund", "on-cluster", 40.0).await;
    let (status, answer) = super::delegations::decide(&app, "carol", &call, "approve").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{answer}");
    let decision = super::delegations::recorded(&app, &call).await;
    assert_eq!(decision["decided_by"], "carol for alice", "{decision}");
}

#[tokio::test]
async fn services_reach_a_redis_that_requires_tls_and_a_client_certificate() {
    let infra = Infra::start_with_redis_tls().await;
    // Without the client certificate the server refuses the connection.
    let mut no_cert = infra.connections_without_login("ttls");
    no_cert.redis_tls_cert = None;
    no_cert.redis_tls_key = None;
    assert!(
        Store::connect(&no_cert, Names::new("ttls").unwrap(), Metrics::default())
            .await
            .is_err()
    );

    let app = TestApp::builder(refund_brain).on(infra).start().await;
    app.refund_cycle().await;
}
