//! NATS as operators run it: a list of seed servers (a dead one skipped), services started
//! before NATS waiting for it, streams brought back to their configuration at start,
//! servers that require a user and password, a token, an NKey, or TLS with a client
//! certificate, and the shipped users and permissions (`deploy/nats-server.conf`, as the
//! local runner renders it).

use countersign_fake_model::refund_brain;
use countersign_local::nats_users::NatsUsers;
use countersign_runtime::bus::Bus;
use countersign_runtime::config::Connections;
use countersign_runtime::names::Names;
use countersign_tests::app::{PATIENCE, REQUESTER_KEY, TestApp, gateway_waits_for, new_namespace};
use countersign_tests::images::NATS;
use countersign_tests::infra::Infra;
use countersign_tests::pki::TestPki;
use std::time::Duration;
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

#[tokio::test]
async fn a_gateway_started_before_nats_waits_for_it_and_skips_a_dead_seed() {
    let infra = Infra::start_restartable().await;
    infra.stop_nats().await;
    let mut config = infra.config(&format!(
        "t{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    // The first seed never answers; the client goes on to the next.
    config.nats_url = format!("nats://127.0.0.1:1,{}", infra.nats_url);
    gateway_waits_for("NATS", config, infra.start_nats()).await;
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

    Bus::connect(&app.connections(), names.clone())
        .await
        .unwrap();
    let mut stream = js.get_stream(names.approvals_stream()).await.unwrap();
    assert_eq!(stream.info().await.unwrap().config.max_age, wanted);

    // Three replicas on a single server: refused, saying why, and nothing changes.
    let mut three = app.connections();
    three.stream_replicas = 3;
    let err = Bus::connect(&three, names.clone())
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not part of a cluster"), "{err}");
    let mut stream = js.get_stream(names.runs_stream()).await.unwrap();
    assert_eq!(stream.info().await.unwrap().config.num_replicas, 1);
}

/// A NATS server started with `args`, with `files` copied into `/data` first; its URL.
async fn nats_requiring(
    args: &[&str],
    files: &[(&str, Vec<u8>)],
) -> (ContainerAsync<GenericImage>, String) {
    NATS.ensure();
    let mut cmd = vec!["-js", "-sd", "/data"];
    cmd.extend_from_slice(args);
    let mut request = GenericImage::new(NATS.name, NATS.tag)
        .with_exposed_port(4222.tcp())
        .with_wait_for(WaitFor::message_on_stderr("Server is ready"))
        .with_cmd(cmd);
    for (name, bytes) in files {
        request = request.with_copy_to(format!("/data/{name}"), bytes.clone());
    }
    let nats = request.start().await.unwrap();
    let url = format!(
        "nats://127.0.0.1:{}",
        nats.get_host_port_ipv4(4222).await.unwrap()
    );
    (nats, url)
}

/// The services reach a server with `connections`'s credentials, and a client without them is
/// refused.
async fn reached_only_with(url: &str, mut connections: Connections) {
    assert!(
        async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(url)
            .await
            .is_err(),
        "the server refuses a client without credentials"
    );
    connections.nats_url = url.to_string();
    let namespace = format!("a{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let bus = Bus::connect(&connections, Names::new(&namespace).unwrap())
        .await
        .unwrap();
    bus.js
        .get_stream(format!("{namespace}_RUNS"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_nats_server_that_requires_a_user_and_password_is_reached_with_them() {
    let (_nats, url) = nats_requiring(&["--user", "countersign", "--pass", "s3cret"], &[]).await;
    let connections = Connections {
        nats_user: Some("countersign".into()),
        nats_password: Some("s3cret".into()),
        ..Default::default()
    };
    reached_only_with(&url, connections).await;
}

#[tokio::test]
async fn a_nats_server_that_requires_a_token_is_reached_with_it() {
    let (_nats, url) = nats_requiring(&["--auth", "a-long-nats-token"], &[]).await;
    let connections = Connections {
        nats_token: Some("a-long-nats-token".into()),
        ..Default::default()
    };
    reached_only_with(&url, connections).await;
}

#[tokio::test]
async fn a_nats_server_that_knows_the_services_by_nkey_is_reached_with_the_seed() {
    let user = nkeys::KeyPair::new_user();
    let config = format!(
        "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
        user.public_key()
    );
    let (_nats, url) = nats_requiring(
        &["-c", "/data/nats.conf"],
        &[("nats.conf", config.into_bytes())],
    )
    .await;
    let connections = Connections {
        nats_nkey: Some(user.seed().unwrap().into()),
        ..Default::default()
    };
    reached_only_with(&url, connections).await;
}

#[tokio::test]
async fn a_nats_server_that_requires_tls_and_a_client_certificate_is_reached_with_them() {
    let pki = TestPki::generate();
    let (_nats, url) = nats_requiring(
        &[
            "--tls",
            "--tlscert",
            "/data/server.pem",
            "--tlskey",
            "/data/server.key",
            "--tlscacert",
            "/data/ca.pem",
            "--tlsverify",
        ],
        &[
            ("server.pem", pki.read("server.pem")),
            ("server.key", pki.read("server.key")),
            ("ca.pem", pki.read("ca.pem")),
        ],
    )
    .await;
    // Trusting the server but showing no certificate is not enough.
    let no_cert = Connections {
        nats_url: url.clone(),
        nats_tls_ca: Some(pki.path("ca.pem")),
        ..Default::default()
    };
    let refused = tokio::time::timeout(
        Duration::from_secs(3),
        Bus::connect(&no_cert, Names::new("tls").unwrap()),
    )
    .await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "connected without a client certificate"
    );
    let connections = Connections {
        nats_tls_ca: Some(pki.path("ca.pem")),
        nats_tls_cert: Some(pki.path("client.pem")),
        nats_tls_key: Some(pki.path("client.key")),
        ..Default::default()
    };
    reached_only_with(&url, connections).await;
}

/// Publishes `subject` as `user` and waits for the server to refuse it.
async fn refused_to_publish(url: &str, user: &str, password: &str, subject: String) {
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(format!("{event:?}"));
            }
        })
        .connect(url)
        .await
        .unwrap();
    client.publish(subject.clone(), "{}".into()).await.unwrap();
    client.flush().await.unwrap();
    let refusal = tokio::time::timeout(PATIENCE, async {
        while let Some(event) = events.recv().await {
            if event.to_lowercase().contains("permissions violation") {
                return event;
            }
        }
        panic!("the connection ended without a refusal")
    })
    .await
    .unwrap_or_else(|_| panic!("{user} was let publish {subject}"));
    assert!(refusal.contains(&subject), "{refusal}");
}

#[tokio::test]
async fn with_the_shipped_nats_users_runs_go_through_and_no_service_publishes_what_is_the_others() {
    let namespace = new_namespace();
    let users = NatsUsers::random();
    let infra = Infra::start_with_nats_config(&users.config(&namespace)).await;
    let app = TestApp::builder(refund_brain)
        .gateway(|c| users.log_in_gateway(&mut c.connections))
        .worker(|c| users.log_in_worker(&mut c.connections))
        .on(infra)
        .namespace(namespace.clone())
        .start()
        .await;

    // Everything a run does: start, pause, approval, completion; a decision left to the
    // outbox sweepers (published by a gateway's: a worker's would be refused); and a cancel.
    app.refund_cycle().await;
    let late = app.start_run("Refund A-1001 please.").await;
    let paused = app.wait_status(&late, "awaiting_approval").await;
    app.approve_without_announcing(&late, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    app.wait_status(&late, "completed").await;
    let run = app.start_run("Refund A-1002 please.").await;
    app.wait_status(&run, "awaiting_approval").await;
    let (status, body) = app
        .request(
            reqwest::Method::POST,
            &format!("/v1/runs/{run}/cancel"),
            Some(REQUESTER_KEY),
            Some(serde_json::json!({"reason": "asked twice"})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    app.wait_status(&run, "cancelled").await;

    // Nobody gets in without a user; a worker cannot start a run (and so choose its
    // requester) nor announce a decision; a gateway cannot announce what a run did.
    let url = app.infra.nats_url.clone();
    assert!(
        async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(&url)
            .await
            .is_err(),
        "a client without a user is refused"
    );
    let admin = async_nats::ConnectOptions::with_user_and_password(
        "admin".into(),
        users.admin.expose().into(),
    )
    .connect(&url)
    .await
    .unwrap();
    let js = async_nats::jetstream::new(admin);
    let names = Names::new(&namespace).unwrap();
    let runs_stored = || async {
        let mut stream = js.get_stream(names.runs_stream()).await.unwrap();
        stream.info().await.unwrap().state.last_sequence
    };
    let before = runs_stored().await;
    let worker = users.worker.expose();
    let gateway = users.gateway.expose();
    refused_to_publish(&url, "worker", worker, names.runs_start()).await;
    let some_run = countersign_model::run::RunId::new();
    let decided = names.approval_decided(&some_run);
    refused_to_publish(&url, "worker", worker, decided).await;
    let completed = names.run_completed(&some_run);
    refused_to_publish(&url, "gateway", gateway, completed).await;
    assert_eq!(runs_stored().await, before, "nothing reached RUNS");
}
