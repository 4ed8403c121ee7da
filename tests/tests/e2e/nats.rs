//! NATS as operators run it: a list of seed servers (a dead one skipped), services started
//! before NATS waiting for it, and streams brought back to their configuration at start.

use countersign_shared::bus::Bus;
use countersign_shared::names::Names;
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::fake_model::refund_brain;
use countersign_tests::infra::Infra;
use countersign_tests::wait_for;
use std::time::Duration;

#[tokio::test]
async fn a_gateway_started_before_nats_waits_for_it_and_skips_a_dead_seed() {
    let infra = Infra::start_restartable().await;
    infra.stop_nats().await;
    let agents = std::env::temp_dir().join(format!("cs-nats-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&agents).unwrap();
    let mut config = approval_gateway::config::Config::default();
    // The first seed never answers; the client goes on to the next.
    config.infra.nats_url = format!("nats://127.0.0.1:1,{}", infra.nats_url);
    config.infra.redis_url = infra.redis_url.clone();
    config.infra.namespace = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    config.agents_dir = agents.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/readyz", listener.local_addr().unwrap());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let gateway = tokio::spawn(approval_gateway::run(config, listener, shutdown.clone()));

    infra.start_nats().await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    wait_for("the gateway to be ready once NATS is", PATIENCE, || async {
        assert!(
            !gateway.is_finished(),
            "the gateway gave up while NATS was away"
        );
        let r = http.get(&url).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    shutdown.cancel();
    gateway.await.unwrap().unwrap();
    std::fs::remove_dir_all(&agents).unwrap();
}

#[tokio::test]
async fn streams_changed_by_hand_are_brought_back_and_a_change_jetstream_cannot_make_is_refused() {
    let app = TestApp::spawn(refund_brain).await;
    let names = Names::new(&app.namespace).unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(&app.infra.nats_url).await.unwrap());
    let mut stream = js.get_stream(names.approvals_stream()).await.unwrap();
    let wanted = stream.info().await.unwrap().config.max_age;
    let mut drifted = stream.info().await.unwrap().config.clone();
    drifted.max_age = Duration::from_secs(3600);
    js.update_stream(drifted).await.unwrap();

    Bus::connect(&app.infra_config(), names.clone())
        .await
        .unwrap();
    let mut stream = js.get_stream(names.approvals_stream()).await.unwrap();
    assert_eq!(stream.info().await.unwrap().config.max_age, wanted);

    // Three replicas on a single server: refused, saying why, and nothing changes.
    let mut three = app.infra_config();
    three.stream_replicas = 3;
    let err = Bus::connect(&three, names.clone())
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not part of a cluster"), "{err}");
    let mut stream = js.get_stream(names.runs_stream()).await.unwrap();
    assert_eq!(stream.info().await.unwrap().config.num_replicas, 1);
}

#[tokio::test]
async fn a_nats_server_that_requires_a_user_and_password_is_reached_with_them() {
    use countersign_tests::images::NATS;
    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{GenericImage, ImageExt};
    NATS.ensure();
    let nats = GenericImage::new(NATS.name, NATS.tag)
        .with_exposed_port(4222.tcp())
        .with_wait_for(WaitFor::message_on_stderr("Server is ready"))
        .with_cmd([
            "-js",
            "-sd",
            "/data",
            "--user",
            "countersign",
            "--pass",
            "s3cret",
        ])
        .start()
        .await
        .unwrap();
    let url = format!(
        "nats://127.0.0.1:{}",
        nats.get_host_port_ipv4(4222).await.unwrap()
    );
    assert!(
        async_nats::connect(&url).await.is_err(),
        "the server refuses a client without credentials"
    );
    let infra = countersign_shared::infra::InfraConfig {
        nats_url: url,
        nats_user: Some("countersign".into()),
        nats_password: Some("s3cret".into()),
        ..Default::default()
    };
    let bus = Bus::connect(&infra, Names::new("auth").unwrap())
        .await
        .unwrap();
    bus.js.get_stream("auth_RUNS").await.unwrap();
}
