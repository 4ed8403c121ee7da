//! NATS as operators run it: a list of seed servers (a dead one skipped), services started
//! before NATS waiting for it, streams brought back to their configuration at start,
//! servers that require a user and password, a token, an NKey, or TLS with a client
//! certificate, and the shipped users and permissions (`deploy/nats-server.conf`, as every
//! test's servers render it).

use countersign_fake_model::refund_brain;
use countersign_runtime::bus::Bus;
use countersign_runtime::config::Connections;
use countersign_runtime::names::{Names, Service};
use countersign_tests::app::{PATIENCE, REQUESTER_KEY, TestApp, gateway_waits_for};
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
    let namespace = infra.new_namespace().await;
    let mut config = infra.connections(&namespace, Service::Gateway);
    // The first seed never answers; the client goes on to the next.
    config.nats_url = format!("nats://127.0.0.1:1,{}", infra.nats_url);
    gateway_waits_for("NATS", config, infra.start_nats()).await;
}

#[tokio::test]
async fn streams_changed_by_hand_are_brought_back_and_a_change_jetstream_cannot_make_is_refused() {
    let app = TestApp::spawn(refund_brain).await;
    let names = Names::new(&app.namespace).unwrap();
    let js = app.infra.jetstream().await;
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

/// Publishes `subject` as `client` (logged in as `user`, its events sent to `events`) and
/// waits for the server to refuse it.
async fn refused_to_publish(
    client: &async_nats::Client,
    events: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    user: &str,
    subject: String,
) {
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

/// A client logged in as `user`, and what the server tells it.
async fn logged_in(
    url: &str,
    (user, password): (String, String),
) -> (
    async_nats::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (tx, events) = tokio::sync::mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_user_and_password(user, password)
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(format!("{event:?}"));
            }
        })
        .connect(url)
        .await
        .unwrap();
    (client, events)
}

#[tokio::test]
async fn with_the_shipped_nats_users_runs_go_through_and_no_service_publishes_what_is_the_others() {
    let app = TestApp::spawn(refund_brain).await;

    // Everything a run does: start, pause, approval, completion; a decision left to the
    // outbox sweepers; and a cancel. (Every test runs so; a refusal fails it.)
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
    // requester), cancel a call nor queue a delivery; a gateway cannot announce what a run
    // did.
    let url = app.infra.nats_url.clone();
    assert!(
        async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(&url)
            .await
            .is_err(),
        "a client without a user is refused"
    );
    let js = app.infra.jetstream().await;
    let names = Names::new(&app.namespace).unwrap();
    let runs_stored = || async {
        let mut stream = js.get_stream(names.runs_stream()).await.unwrap();
        stream.info().await.unwrap().state.last_sequence
    };
    let before = runs_stored().await;
    let some_run = countersign_model::run::RunId::new();
    let login = |service| app.infra.nats_login(&app.namespace, service);
    let (worker, mut told) = logged_in(&url, login(Service::Worker)).await;
    for subject in [
        names.runs_start(),
        names.approval_cancelled(&some_run),
        names.delivery("webhook", "ops"),
    ] {
        refused_to_publish(&worker, &mut told, "worker", subject).await;
    }
    let (gateway, mut told) = logged_in(&url, login(Service::Gateway)).await;
    for subject in [
        names.run_completed(&some_run),
        names.approval_requested(&some_run),
        names.approval_reminder(&some_run),
    ] {
        refused_to_publish(&gateway, &mut told, "gateway", subject).await;
    }
    assert_eq!(runs_stored().await, before, "nothing reached RUNS");
}

/// What the red team found refused: a worker announcing the decisions it records (a
/// deadline's expiry, a call its policy change closed), and a gateway following a run's
/// `run.*` events for its MCP proxy. Both are let through, and taken by their streams.
#[tokio::test]
async fn the_shipped_users_may_do_what_the_services_do_each_announce_decisions_and_a_gateway_follows_run_events()
 {
    let app = TestApp::spawn(refund_brain).await;
    let names = Names::new(&app.namespace).unwrap();
    let run = countersign_model::run::RunId::new();
    let login = |service| app.infra.nats_login(&app.namespace, service);
    let url = app.infra.nats_url.clone();

    let (gateway, mut gateway_told) = logged_in(&url, login(Service::Gateway)).await;
    let mut events = gateway.subscribe(names.run_events(&run)).await.unwrap();
    gateway.flush().await.unwrap();
    let (worker, mut worker_told) = logged_in(&url, login(Service::Worker)).await;
    let js = async_nats::jetstream::new(worker.clone());
    for subject in [names.approval_decided(&run), names.run_completed(&run)] {
        js.publish(subject.clone(), "{}".into())
            .await
            .unwrap()
            .await
            .unwrap_or_else(|e| panic!("the worker may publish {subject}: {e}"));
    }
    let event = tokio::time::timeout(PATIENCE, futures::StreamExt::next(&mut events))
        .await
        .expect("the gateway receives the run's events")
        .unwrap();
    assert_eq!(event.subject.as_str(), names.run_completed(&run));
    let gateway_js = async_nats::jetstream::new(gateway.clone());
    gateway_js
        .publish(names.approval_decided(&run), "{}".into())
        .await
        .unwrap()
        .await
        .expect("the gateway may publish decisions too");
    for told in [&mut gateway_told, &mut worker_told] {
        while let Ok(event) = told.try_recv() {
            assert!(!event.to_lowercase().contains("violation"), "{event}");
        }
    }
}

/// The suite's guard: a service that NATS refuses logs a warning naming the subject, and the
/// tests' logging records it (an `Infra` dropped with one recorded fails its test; this test
/// takes it first).
#[tokio::test]
async fn a_refusal_a_service_meets_is_logged_as_a_warning_and_recorded_against_the_test() {
    assert!(
        countersign_tests::logs::init(),
        "the tests' logging is in place"
    );
    let infra = Infra::start().await;
    let namespace = infra.new_namespace().await;
    let names = Names::new(&namespace).unwrap();
    let gateway = Bus::connect(
        &infra.connections(&namespace, Service::Gateway),
        names.clone(),
    )
    .await
    .unwrap();
    let forbidden = names.run_completed(&countersign_model::run::RunId::new());
    gateway
        .client
        .publish(forbidden.clone(), "{}".into())
        .await
        .unwrap();
    gateway.client.flush().await.unwrap();
    let refused = countersign_tests::wait_for("the refusal to be recorded", PATIENCE, || async {
        let taken = infra.nats_auth.take_violations();
        (!taken.is_empty()).then_some(taken)
    })
    .await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].contains(&forbidden), "{refused:?}");
}
