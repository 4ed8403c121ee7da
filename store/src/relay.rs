//! The relay of the outbox to NATS. A script that changes a run also writes what others must hear of (the
//! announcement on NATS and the audit element for the global log) into the run's outbox, in
//! the same atomic step. The caller then publishes those entries with their message ids and
//! deletes each only after JetStream has acknowledged it; if NATS is down or the process dies
//! first, the entries wait, and every gateway and worker sweeps runs whose outbox was written
//! more than [`GRACE`] ago and publishes what is still there. So a fact stored in Redis is
//! always announced, late at worst, and the message ids make a repeated publish harmless
//! within JetStream's duplicate window (consumers treat any later repeat as a redelivery).
//!
//! A sweeper publishes only what its own service announces (and what both do, such as
//! decisions and audit elements): NATS users with the shipped permissions may publish nothing
//! else, so a gateway's late cancel waits for a gateway's sweep and a worker's late pause for
//! a worker's. A sweeper leaves a run whose outbox holds only the other service's
//! announcements without touching its mark.

use crate::keys::Shard;
use crate::{Announcement, Store, StoreError};
use countersign_model::run::RunId;
use countersign_runtime::bus::{Bus, BusError};
use countersign_runtime::metrics::Metrics;
use countersign_runtime::names::Service;
use futures::future::join_all;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, warn};

/// How old an outbox mark must be before sweepers look at it: longer than any script may
/// take after its mark (two seconds, checked by the scripts), so nothing is missed.
pub const GRACE: Duration = Duration::from_secs(5);
/// How often each process sweeps.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Runs one sweep looks at, at most.
const SWEEP_BATCH: usize = 200;

/// Why publishing a run's outbox failed; what was not acknowledged stays for a sweep.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Reading or deleting the outbox failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// NATS did not take a publish.
    #[error(transparent)]
    Bus(#[from] BusError),
}

/// Publishes runs' outboxes to NATS: the announcements a script queued, and the late ones a
/// sweep finds.
#[derive(Clone)]
pub struct Relay {
    store: Store,
    bus: Bus,
    /// Times each publish.
    metrics: Metrics,
}

impl Relay {
    /// A relay reading `store`'s outboxes, publishing through `bus`, timing each publish in
    /// `metrics`.
    pub fn new(store: &Store, bus: Bus, metrics: Metrics) -> Self {
        Self {
            store: store.clone(),
            bus,
            metrics,
        }
    }

    /// Publishes what a script queued for `run` and deletes what JetStream acknowledged. An
    /// error means some entries wait for a sweeper; the change itself is stored either way.
    pub async fn publish(&self, run: &RunId, queued: &[Announcement]) -> Result<(), RelayError> {
        if queued.is_empty() {
            return Ok(());
        }
        self.send(run, queued, false).await.map(|_| ())
    }

    /// Whether a sweeper of `service` publishes `entry`.
    fn sweeps(&self, service: Service, entry: &Announcement) -> bool {
        self.bus
            .names
            .announcer(&entry.subject)
            .is_none_or(|a| a == service)
    }

    /// Publishes (`late`: as a sweeper), deletes the acknowledged entries, and returns how
    /// many the outbox still holds; the first publish error if any failed.
    async fn send(
        &self,
        run: &RunId,
        queued: &[Announcement],
        late: bool,
    ) -> Result<usize, RelayError> {
        let results = join_all(queued.iter().map(|a| async {
            let started = std::time::Instant::now();
            let published = self
                .bus
                .publish_raw(a.subject.clone(), &a.msg_id, a.payload.clone().into_bytes())
                .await;
            self.metrics.published(started.elapsed());
            if published.is_ok() {
                self.metrics
                    .announced(self.bus.names.kind(&a.subject), late);
            }
            published
        }))
        .await;
        let acked: Vec<&str> = queued
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(a, _)| a.msg_id.as_str())
            .collect();
        let left = self.store.outbox_done(run, &acked).await?;
        match results.into_iter().find_map(Result::err) {
            Some(e) => Err(e.into()),
            None => Ok(left),
        }
    }

    /// Publishes what waits for `service` in the outboxes of the shard's runs marked more
    /// than [`GRACE`] ago; returns how many runs it looked at.
    pub async fn sweep(&self, service: Service, shard: Shard) -> Result<usize, RelayError> {
        let due = self.store.outbox_due(shard, GRACE, SWEEP_BATCH).await?;
        for (run, mark) in &due {
            let span = tracing::info_span!("outbox.sweep", run_id = %run);
            // What is published late still carries its run's trace to whoever takes it.
            if countersign_runtime::telemetry::exporting()
                && let Some(stored) = self.store.load(run).await?
            {
                countersign_runtime::trace_context::adopt(&span, stored.trace.as_deref());
            }
            self.sweep_run(service, run, *mark).instrument(span).await?;
        }
        Ok(due.len())
    }

    /// Publishes what waits for `service` in one run's outbox, if no other sweeper took it
    /// first.
    async fn sweep_run(&self, service: Service, run: &RunId, mark: i64) -> Result<(), RelayError> {
        let waiting = self.store.outbox_entries(run).await?;
        if !waiting.is_empty() && !waiting.iter().any(|a| self.sweeps(service, a)) {
            return Ok(()); // the other service's sweepers publish these
        }
        let Some(mark) = self.store.take_outbox(run, mark).await? else {
            return Ok(()); // another sweeper has it
        };
        let (ours, others): (Vec<_>, Vec<_>) = self
            .store
            .outbox_entries(run)
            .await?
            .into_iter()
            .partition(|a| self.sweeps(service, a));
        // The other service's entries keep the mark, for its sweepers.
        let left = if ours.is_empty() {
            others.len()
        } else {
            match self.send(run, &ours, true).await {
                Ok(left) => left,
                Err(e) => {
                    warn!(run_id = %run, error = %e, "outbox not yet published; will try again");
                    return Ok(());
                }
            }
        };
        if left == 0 {
            self.store.drop_outbox_mark(run, mark).await?;
        }
        Ok(())
    }

    /// Sweeps every second, for `service`, until `shutdown`, each time until nothing more
    /// is due.
    pub async fn run_sweeper(self, service: Service, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    for shard in Shard::all() {
                        // A full batch means more may be due: keep going until one is not full.
                        loop {
                            match self.sweep(service, shard).await {
                                Ok(n) if n == SWEEP_BATCH && !shutdown.is_cancelled() => {}
                                Ok(_) => break,
                                Err(e) => {
                                    warn!(error = %e, "outbox sweep failed");
                                    break;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
