//! agent-worker: consumes run jobs and decisions from NATS JetStream and drives agents'
//! tool loops, pausing before calls a person must approve.

pub mod agents;
pub mod config;
pub mod consumer;
pub mod engine;
pub mod model;
pub mod policy;
pub mod tools;

use agents::Agents;
use config::Config;
use countersign_shared::agent::Catalog;
use countersign_shared::bus::{Bus, ConsumerSettings};
use countersign_shared::names::Names;
use countersign_shared::store::Store;
use engine::{Engine, EngineSettings};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Runs a worker until `shutdown` is cancelled, then stops pulling, gives in-flight runs
/// `shutdown_grace_secs` to reach a durable point, and hands back the rest (their messages
/// are redelivered and their leases lapse).
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let names = Names::new(&config.infra.namespace)?;
    let catalog = Catalog::load_dir(&config.agents_dir)?;
    let agents = Arc::new(Agents::compile(&catalog)?);
    let store = Store::connect(&config.infra.redis_url, names.clone()).await?;
    let bus = Bus::connect(&config.infra.nats_url, names.clone()).await?;
    let ack_wait = Duration::from_secs(config.ack_wait_secs);
    let settings = ConsumerSettings {
        ack_wait,
        max_ack_pending: 10_000,
    };
    // Small batches so a busy worker does not sit on messages an idle one could take.
    let batch = config.concurrency.min(16);
    let pull = |stream: String, durable: String, subject: String| {
        let (bus, settings) = (&bus, &settings);
        async move {
            let consumer = bus
                .shared_consumer(&stream, &durable, subject, settings)
                .await?;
            let messages = consumer
                .stream()
                .max_messages_per_batch(batch)
                .messages()
                .await?;
            anyhow::Ok(messages)
        }
    };
    let starts = pull(
        names.runs_stream(),
        names.start_consumer(),
        names.runs_start(),
    )
    .await?;
    let decided = pull(
        names.approvals_stream(),
        names.decided_consumer(),
        names.approval_decided_all(),
    )
    .await?;
    let engine = Arc::new(Engine::new(
        store,
        bus.clone(),
        agents,
        EngineSettings {
            owner: config.worker_id.clone(),
            lease: config.lease(),
            max_attempts: config.max_attempts,
            retention: Duration::from_secs(config.retention_secs),
        },
    ));
    info!(worker_id = %config.worker_id, agents = catalog.iter().count(), "worker started");

    let mut incoming = futures::stream::select(starts, decided);
    let permits = Arc::new(Semaphore::new(config.concurrency));
    let mut tasks = JoinSet::new();
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => permit?,
        };
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            msg = incoming.next() => msg,
        };
        match msg {
            None => break,
            Some(Err(e)) => warn!(error = %e, "error pulling messages"),
            Some(Ok(msg)) => {
                let engine = engine.clone();
                tasks.spawn(async move {
                    consumer::handle(engine, msg, ack_wait).await;
                    drop(permit);
                });
            }
        }
        while tasks.try_join_next().is_some() {}
    }
    drop(incoming);
    info!(in_flight = tasks.len(), "stopping: no new work taken");
    let grace = Duration::from_secs(config.shutdown_grace_secs);
    let drained = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} });
    if drained.await.is_err() {
        warn!(
            left = tasks.len(),
            "grace period over; handing the rest back"
        );
        tasks.abort_all();
    }
    bus.client.drain().await?;
    info!("worker stopped");
    Ok(())
}
