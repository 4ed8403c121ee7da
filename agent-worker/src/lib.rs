//! agent-worker: consumes run jobs and decisions from NATS JetStream and drives agents'
//! tool loops, pausing before calls a person must approve.

mod agents;
pub mod config;
mod consumer;
mod engine;
mod health;
mod tools;

use agents::Agents;
use config::Config;
use countersign_model::agent::Catalog;
use countersign_model::people::Directory;
use countersign_runtime::agents::Watcher;
use countersign_runtime::bus::{Bus, ConsumerSettings};
use countersign_runtime::health::Consumers;
use countersign_runtime::mcp::McpClients;
use countersign_runtime::metrics::Metrics;
use countersign_runtime::metrics_http;
use countersign_runtime::names::{Names, Service};
use countersign_runtime::work::{self, InProgress, WorkLoop};
use countersign_store::Store;
use countersign_store::relay::Relay;
use engine::{Engine, EngineSettings};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The worker as a program: logging and traces, config from file and environment, signals.
pub async fn main_from_env() -> anyhow::Result<()> {
    let _telemetry = countersign_runtime::telemetry::init("agent-worker");
    let config = Config::load()?;
    let health = TcpListener::bind(&config.health_listen).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(countersign_runtime::shutdown::on_signal(shutdown.clone()));
    run(config, health, shutdown).await
}

/// Sweeps for passed deadlines every `interval` until `shutdown`. A shard's lease outlasts a
/// few missed sweeps, so a worker that stops sweeping hands its shards over within a second
/// or so.
async fn sweep(engine: Arc<Engine>, interval: Duration, shutdown: CancellationToken) {
    let lease = (interval * 4).max(Duration::from_secs(1));
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                if let Err(e) = engine.sweep(lease).await {
                    warn!(error = %e, "deadline sweep failed");
                }
            }
        }
    }
}

/// Loads the agents again whenever their folder changes, until `shutdown`. A folder that does
/// not load (a file that does not parse, a policy that does not compile, a role nobody holds)
/// is refused with its error and the agents loaded before stay. A set put in place is handed
/// to [`recheck`], which checks the calls waiting under a policy that changed; the reload
/// never waits for that (it may close many calls, each an announcement on NATS), so a file
/// put back a moment after a bad edit takes effect at once.
async fn reload(
    engine: Arc<Engine>,
    watcher: Watcher,
    mcp: McpClients,
    people: Directory,
    loaded: watch::Sender<Arc<Agents>>,
    shutdown: CancellationToken,
) {
    let metrics = engine.metrics().clone();
    watcher
        .follow(shutdown, metrics, |catalog| {
            let compiled = check_roles(&catalog, &people)
                .and_then(|()| Agents::compile(&catalog, mcp.clone()));
            let engine = engine.clone();
            let loaded = loaded.clone();
            async move {
                engine.replace_agents(compiled?);
                loaded.send_replace(engine.agents());
                Ok(())
            }
        })
        .await;
}

/// Checks the calls waiting under a changed policy, after the start and after each reload,
/// until `shutdown`: always against the newest set, and a set replaced while its check runs
/// is left for the newer one (see [`Engine::recheck_waiting`]).
async fn recheck(
    engine: Arc<Engine>,
    mut loaded: watch::Receiver<Arc<Agents>>,
    shutdown: CancellationToken,
) {
    loop {
        let agents = loaded.borrow_and_update().clone();
        let checked = tokio::select! {
            _ = shutdown.cancelled() => return,
            checked = engine.recheck_waiting(&agents) => checked,
        };
        match checked {
            Ok(0) => {}
            Ok(closed) => info!(
                closed,
                "calls waiting under a changed policy are checked again"
            ),
            Err(e) => warn!(error = %e, "could not check the calls waiting under a changed policy"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = loaded.changed() => if changed.is_err() { return },
        }
    }
}

/// Refuses to start when a policy names a role nobody holds: its calls could never be
/// decided by anyone, since roles are resolved to people when a call is held.
fn check_roles(catalog: &Catalog, people: &Directory) -> anyhow::Result<()> {
    for agent in catalog.iter() {
        for tool in &agent.def.tools {
            let reviewers = tool.reviewers();
            let listed = [reviewers.approvers, reviewers.escalate_to].concat();
            if let Some(role) = people.empty_roles(&listed).first() {
                anyhow::bail!(
                    "the approvers of {}.{} name role:{role}, which no configured person holds: add [[people]] to the worker's config",
                    agent.def.name,
                    tool.name
                );
            }
        }
    }
    Ok(())
}

/// Starts the reload of the agents as their files change and, after each, the check of the
/// calls waiting under a changed policy; gives back (recheck, reload).
fn watch_agents(
    engine: &Arc<Engine>,
    watcher: Watcher,
    mcp: McpClients,
    people: Directory,
    shutdown: &CancellationToken,
) -> (JoinHandle<()>, JoinHandle<()>) {
    let (loaded, to_check) = watch::channel(engine.agents());
    let rechecker = tokio::spawn(recheck(engine.clone(), to_check, shutdown.clone()));
    let reloader = tokio::spawn(reload(
        engine.clone(),
        watcher,
        mcp,
        people,
        loaded,
        shutdown.clone(),
    ));
    (rechecker, reloader)
}

/// The engine's settings, as the config gives them.
fn engine_settings(config: &Config) -> EngineSettings {
    EngineSettings {
        owner: config.worker_id.clone(),
        lease: config.lease(),
        max_attempts: config.max_attempts,
        retention: Duration::from_secs(config.retention_secs),
        approval_timeout: Duration::from_secs(config.default_approval_timeout_secs),
    }
}

/// How the work loop pulls `runs.start` and the decisions, as the config gives it.
fn work_settings(config: &Config) -> work::Settings {
    work::Settings {
        consumer: ConsumerSettings {
            ack_wait: Duration::from_secs(config.ack_wait_secs),
            max_ack_pending: 10_000,
        },
        in_progress: InProgress::Extend,
        concurrency: config.concurrency,
        grace: Duration::from_secs(config.shutdown_grace_secs),
    }
}

/// Runs a worker until `shutdown` is cancelled, then stops pulling, gives in-flight runs
/// `shutdown_grace_secs` to reach a durable point, and hands back the rest (their messages
/// are redelivered and their leases lapse). `/livez` and `/readyz` are served on `health`.
pub async fn run(
    config: Config,
    health: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let names = Names::new(&config.connections.namespace)?;
    let mcp = McpClients::default();
    let catalog = countersign_runtime::agents::load_dir(&config.agents_dir, &mcp).await?;
    let people = Directory::new(&config.people);
    check_roles(&catalog, &people)?;
    let agents = Arc::new(Agents::compile(&catalog, mcp.clone())?);
    let watcher = Watcher::new(
        &config.agents_dir,
        mcp.clone(),
        Duration::from_millis(config.agents_reload_ms),
    );
    let metrics = Metrics::default();
    let store = Store::connect_waiting(&config.connections, names.clone(), metrics.clone())
        .await?
        .worker();
    let bus = Bus::connect(&config.connections, names.clone()).await?;
    let consumers = Consumers::default();
    let mut served = metrics_http::Placed::new(
        metrics.clone(),
        config.metrics_listen.as_deref(),
        config.metrics_token.as_ref(),
        shutdown.clone(),
    )
    .await?;
    let probes = tokio::spawn(health::serve(
        health,
        store.clone(),
        bus.clone(),
        consumers.clone(),
        served.route.take(),
        shutdown.clone(),
    ));
    let engine = Arc::new(Engine::new(
        store.clone(),
        bus.clone(),
        agents,
        people.clone(),
        engine_settings(&config),
        metrics.clone(),
    ));
    let work = WorkLoop::pull(
        bus.clone(),
        work_settings(&config),
        consumers,
        metrics.clone(),
        engine.clone(),
    )
    .await?;
    info!(worker_id = %config.worker_id, agents = catalog.iter().count(), "worker started");

    let outbox = tokio::spawn(
        Relay::new(&store, bus.clone(), metrics).run_sweeper(Service::Worker, shutdown.clone()),
    );
    let (rechecker, reloader) = watch_agents(&engine, watcher, mcp, people, &shutdown);
    let sweeper = tokio::spawn(sweep(
        engine.clone(),
        Duration::from_millis(config.sweep_interval_ms),
        shutdown.clone(),
    ));
    work.run(&shutdown).await;
    sweeper.await?;
    reloader.await?;
    rechecker.await?;
    outbox.await?;
    probes.await??;
    served.stopped().await?;
    bus.client.drain().await?;
    info!("worker stopped");
    Ok(())
}
