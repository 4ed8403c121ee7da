//! Starting together: gateways and workers started at the same instant against servers that
//! hold none of their streams all become ready, every time, and a run started right after is
//! taken by a worker. Readiness tells the truth: a service is ready once it pulls. What is a
//! real conflict (a stream JetStream cannot change, subjects another stream holds, a consumer
//! that cannot be used) stops the start, saying what differs, and a gateway whose deliveries
//! fail stops rather than serve with nobody told.

use countersign_fake_model::{FakeModel, refund_brain};
use countersign_local::demo_tools::DemoTools;
use countersign_runtime::bus::Bus;
use countersign_runtime::names::{Names, Service};
use countersign_tests::app::{REQUESTER_KEY, gateway_config, refunds_agent, worker_config};
use countersign_tests::infra::Infra;
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const ROUNDS: usize = 50;
const GATEWAYS: usize = 2;
const WORKERS: usize = 3;
/// How long one round's services may take to become ready before the test fails.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// A service started for one round: its task and where its `/readyz` answers.
struct Started {
    name: String,
    task: JoinHandle<anyhow::Result<()>>,
    readyz: String,
}

async fn listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

/// Waits until `service` answers 200 on `/readyz`; fails at once, with its error, if it stops.
async fn until_ready(http: &reqwest::Client, service: &mut Started, round: usize) {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if service.task.is_finished() {
            let ended = (&mut service.task).await.unwrap();
            panic!("round {round}: the {} stopped: {ended:?}", service.name);
        }
        let answer = http.get(&service.readyz).send().await;
        if answer.is_ok_and(|r| r.status().is_success()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "round {round}: the {} was not ready within {READY_WITHIN:?}",
            service.name
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gateways_and_three_workers_started_at_once_on_empty_servers_are_all_ready_every_time()
{
    let infra = Infra::start().await;
    let model = FakeModel::start(refund_brain).await;
    let tools =
        DemoTools::serve(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()).unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let js = infra.jetstream().await;
    let mut slowest = Duration::ZERO;
    let began = Instant::now();
    for round in 0..ROUNDS {
        // A namespace of its own: none of its streams, consumers or keys exist yet.
        let namespace = format!("race{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        infra.register_namespace(&namespace).await;
        let agents = std::env::temp_dir().join(format!("countersign-{namespace}"));
        std::fs::create_dir_all(&agents).unwrap();
        std::fs::write(
            agents.join("refunds.toml"),
            refunds_agent("anthropic", &model.base_url, &tools.base_url),
        )
        .unwrap();
        let gateway = gateway_config(&infra, &namespace, &agents);
        let worker = worker_config(infra.connections(&namespace, Service::Worker), &agents);
        let stop = CancellationToken::new();

        let mut listeners = Vec::new();
        for _ in 0..GATEWAYS + WORKERS {
            listeners.push(listener().await);
        }
        let started_at = Instant::now();
        let mut services: Vec<Started> = listeners
            .into_iter()
            .enumerate()
            .map(|(i, (listener, url))| {
                let task = if i < GATEWAYS {
                    tokio::spawn(approval_gateway::run(
                        gateway.clone(),
                        listener,
                        stop.clone(),
                    ))
                } else {
                    tokio::spawn(agent_worker::run(worker.clone(), listener, stop.clone()))
                };
                let kind = if i < GATEWAYS { "gateway" } else { "worker" };
                Started {
                    name: format!("{kind} {i}"),
                    task,
                    readyz: format!("{url}/readyz"),
                }
            })
            .collect();
        for service in &mut services {
            until_ready(&http, service, round).await;
        }
        slowest = slowest.max(started_at.elapsed());

        // Ready means working: a run started at once through either gateway is taken by a
        // worker, which pauses it before the refund.
        let gateway = services[round % GATEWAYS].readyz.replace("/readyz", "");
        countersign_tests::start_until_paused(
            &http,
            &gateway,
            REQUESTER_KEY,
            "refunds",
            &format!("round {round}"),
            READY_WITHIN,
        )
        .await;

        stop.cancel();
        for service in services {
            let name = service.name;
            service
                .task
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: the {name} failed to stop: {e:#}"));
        }
        // Each AUDIT stream reserves its byte limit of the server's storage: the round's
        // streams go, so the next round starts on a NATS as empty as this one did.
        for stream in Names::new(&namespace).unwrap().streams() {
            js.delete_stream(&stream).await.unwrap();
        }
        let _ = std::fs::remove_dir_all(&agents);
    }
    println!(
        "{} starts ({ROUNDS} rounds of {GATEWAYS} gateways and {WORKERS} workers at once): all ready; slowest round to ready {slowest:?}; {:?} in all",
        ROUNDS * (GATEWAYS + WORKERS),
        began.elapsed()
    );
}

/// A stream made by hand the way the services cannot use it, before they start.
async fn stream_by_hand(infra: &Infra, config: async_nats::jetstream::stream::Config) {
    let js = infra.jetstream().await;
    // A server busy with other tests' streams may answer "JetStream unavailable" for a moment
    // (its meta leader catching up); that is the server's to settle, not what is tested here.
    countersign_tests::wait_for(
        "JetStream to make the stream",
        std::time::Duration::from_secs(30),
        || {
            let (js, config) = (js.clone(), config.clone());
            async move {
                match js.create_stream(config).await {
                    Ok(_) => Some(()),
                    Err(e) if e.kind() == async_nats::jetstream::context::CreateStreamErrorKind::JetStreamUnavailable => None,
                    Err(e) => panic!("the stream was refused: {e}"),
                }
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_real_conflict_stops_the_start_and_says_what_differs() {
    let infra = Infra::start().await;
    let namespace = format!("c{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    infra.register_namespace(&namespace).await;
    let names = Names::new(&namespace).unwrap();
    // RUNS kept by limits, where the services want a work queue: JetStream cannot change it.
    stream_by_hand(
        &infra,
        async_nats::jetstream::stream::Config {
            name: names.runs_stream(),
            subjects: vec![names.runs_start()],
            ..Default::default()
        },
    )
    .await;
    let err = Bus::connect(
        &infra.connections(&namespace, Service::Worker),
        names.clone(),
    )
    .await
    .err()
    .expect("a retention JetStream cannot change is refused")
    .to_string();
    assert!(
        err.contains(&names.runs_stream()) && err.contains("retention Limits -> WorkQueue"),
        "{err}"
    );

    // Another stream holds the approval subjects: it is named.
    let other = format!("o{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    infra.register_namespace(&other).await;
    let names = Names::new(&other).unwrap();
    stream_by_hand(
        &infra,
        async_nats::jetstream::stream::Config {
            name: format!("SQUATTER_{other}"),
            subjects: vec![names.approval_all()],
            ..Default::default()
        },
    )
    .await;
    let err = Bus::connect(&infra.connections(&other, Service::Worker), names.clone())
        .await
        .err()
        .expect("subjects another stream holds are refused")
        .to_string();
    assert!(
        err.contains(&names.approvals_stream()) && err.contains(&format!("SQUATTER_{other}")),
        "{err}"
    );
}

/// Servers with a namespace's streams, where a push consumer holds the name of the pull
/// consumer `durable` (on `stream`, for `filter`), so a service cannot use it.
async fn consumer_taken(
    stream: impl Fn(&Names) -> String,
    durable: impl Fn(&Names) -> String,
    filter: impl Fn(&Names) -> String,
) -> (Infra, String, Names) {
    let infra = Infra::start().await;
    let namespace = format!("w{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    infra.register_namespace(&namespace).await;
    let names = Names::new(&namespace).unwrap();
    let bus = Bus::connect(
        &infra.connections(&namespace, Service::Worker),
        names.clone(),
    )
    .await
    .unwrap();
    bus.js
        .get_stream(stream(&names))
        .await
        .unwrap()
        .create_consumer(async_nats::jetstream::consumer::push::Config {
            durable_name: Some(durable(&names)),
            deliver_subject: format!("{namespace}.elsewhere"),
            filter_subject: filter(&names),
            ..Default::default()
        })
        .await
        .unwrap();
    (infra, namespace, names)
}

/// While the service cannot pull, its `/readyz` answers 503 saying so (Redis and the streams
/// fine); then it stops with an error naming the consumer.
async fn not_ready_then_stopped(
    url: &str,
    mut service: JoinHandle<anyhow::Result<()>>,
    consumer: &str,
) {
    let http = reqwest::Client::new();
    let body: Value = countersign_tests::wait_for("the probes to answer", READY_WITHIN, || async {
        let answer = http.get(format!("{url}/readyz")).send().await.ok()?;
        assert_eq!(answer.status(), 503, "ready without pulling");
        answer.json().await.ok()
    })
    .await;
    let checks = &body["error"]["details"]["checks"];
    assert_eq!(checks["redis"], "ok", "{body}");
    assert_ne!(checks["consumers"], "ok", "{body}");
    let ended = tokio::time::timeout(READY_WITHIN, &mut service)
        .await
        .expect("the service stops")
        .unwrap();
    let err = ended.expect_err("a consumer it cannot use stops the service");
    assert!(format!("{err:#}").contains(consumer), "{err:#}");
}

#[tokio::test]
async fn a_worker_is_not_ready_until_it_pulls_and_a_consumer_it_cannot_use_stops_it() {
    let (infra, namespace, names) =
        consumer_taken(Names::runs_stream, Names::start_consumer, Names::runs_start).await;
    let agents = std::env::temp_dir().join(format!("countersign-{namespace}"));
    std::fs::create_dir_all(&agents).unwrap();
    let (probes, url) = listener().await;
    let worker = tokio::spawn(agent_worker::run(
        worker_config(infra.connections(&namespace, Service::Worker), &agents),
        probes,
        CancellationToken::new(),
    ));
    not_ready_then_stopped(&url, worker, &names.start_consumer()).await;
    let _ = std::fs::remove_dir_all(&agents);
}

#[tokio::test]
async fn a_gateway_whose_delivery_fan_out_cannot_pull_is_not_ready_and_stops_saying_why() {
    let (infra, namespace, names) = consumer_taken(
        Names::approvals_stream,
        Names::fan_out_consumer,
        Names::approval_all,
    )
    .await;
    let agents = std::env::temp_dir().join(format!("countersign-{namespace}"));
    std::fs::create_dir_all(&agents).unwrap();
    let (listener, url) = listener().await;
    let gateway = tokio::spawn(approval_gateway::run(
        gateway_config(&infra, &namespace, &agents),
        listener,
        CancellationToken::new(),
    ));
    not_ready_then_stopped(&url, gateway, &names.fan_out_consumer()).await;
    let _ = std::fs::remove_dir_all(&agents);
}

/// The race itself, as often as a test can afford it: before streams were reconciled, a
/// round or two in ten here failed with "subjects overlap with an existing stream (10065)".
/// Half the rounds also race to update a stream that drifted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_connections_making_the_streams_and_consumers_at_once_all_succeed_every_time() {
    const ROUNDS: usize = 60;
    const AT_ONCE: usize = 30;
    let infra = Infra::start().await;
    let js = infra.jetstream().await;
    let settings = countersign_runtime::bus::ConsumerSettings {
        ack_wait: Duration::from_secs(30),
        max_ack_pending: 100,
    };
    let began = Instant::now();
    let mut slowest = Duration::ZERO;
    for round in 0..ROUNDS {
        let namespace = format!("m{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        infra.register_namespace(&namespace).await;
        let names = Names::new(&namespace).unwrap();
        let config = infra.connections(&namespace, Service::Worker);
        // Every other round, one stream exists already with a limit changed by hand, so
        // every connection updates it at the same moment as the others.
        let drifted = round % 2 == 1;
        if drifted {
            stream_by_hand(
                &infra,
                async_nats::jetstream::stream::Config {
                    name: names.approvals_stream(),
                    subjects: vec![names.approval_all()],
                    max_age: Duration::from_secs(3600),
                    ..Default::default()
                },
            )
            .await;
        }
        let started = Instant::now();
        let made = futures::future::join_all((0..AT_ONCE).map(|_| async {
            let bus = Bus::connect(&config, names.clone()).await?;
            bus.shared_consumer(
                &names.runs_stream(),
                &names.start_consumer(),
                names.runs_start(),
                &settings,
            )
            .await?;
            Ok::<_, countersign_runtime::bus::BusError>(())
        }))
        .await;
        slowest = slowest.max(started.elapsed());
        for made in made {
            made.unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        if drifted {
            let mut approvals = js.get_stream(names.approvals_stream()).await.unwrap();
            let max_age = approvals.info().await.unwrap().config.max_age;
            assert_eq!(
                max_age,
                Duration::from_secs(14 * 24 * 3600),
                "round {round}"
            );
        }
        for stream in names.streams() {
            js.delete_stream(&stream).await.unwrap();
        }
    }
    println!(
        "{} connections ({ROUNDS} rounds of {AT_ONCE} at once) made the streams and the consumer; slowest round {slowest:?}; {:?} in all",
        ROUNDS * AT_ONCE,
        began.elapsed()
    );
}
