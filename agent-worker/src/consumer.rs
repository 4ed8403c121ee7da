//! The worker's consumers: `runs.start` and `approval.decided.*`, each one durable pull
//! consumer shared by all workers, so each message goes to one of them.
//!
//! A message is acked only once the run it concerns is durably paused, finished or handed
//! on (see [`Engine::process`]); until then progress acks keep JetStream from redelivering it
//! during long model and tool calls. A worker that dies mid-way stops sending them, the
//! message is redelivered to another worker, and that one takes the run over once the dead
//! worker's lease lapses.

use crate::engine::{Engine, Job, Next};
use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::{AckKind, Message};
use countersign_model::events::{Envelope, Event};
use countersign_runtime::bus::{Bus, ConsumerSettings};
use countersign_runtime::health::Consumers;
use countersign_runtime::trace_context;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// The messages of both shared consumers, as they come.
pub type Messages = futures::stream::Select<pull::Stream, pull::Stream>;

/// How long a pull request waits on the server for messages.
const PULL_EXPIRES: Duration = Duration::from_secs(5);

/// How this worker pulls from the two shared consumers.
pub struct Pulling {
    pub bus: Bus,
    pub settings: ConsumerSettings,
    /// Messages asked for at once per consumer.
    pub batch: usize,
    /// What the readiness probe says of the pulling: ready from the first pull on, not while
    /// pulling anew.
    pub consumers: Consumers,
}

impl Pulling {
    /// Both shared consumers (`runs.start`, `approval.decided.*`) as one stream; from then
    /// on the worker counts as ready.
    pub async fn pull(&self) -> anyhow::Result<Messages> {
        let names = &self.bus.names;
        let starts = self
            .one(
                names.runs_stream(),
                names.start_consumer(),
                names.runs_start(),
            )
            .await?;
        let decided = self
            .one(
                names.approvals_stream(),
                names.decided_consumer(),
                names.approval_decided_all(),
            )
            .await?;
        self.consumers.pulling();
        Ok(futures::stream::select(starts, decided))
    }

    /// Pulls again, every second until NATS answers (after the streams ended in an outage);
    /// meanwhile the worker is not ready.
    pub async fn pull_again(&self) -> Messages {
        self.consumers.stopped();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match self.pull().await {
                Ok(streams) => return streams,
                Err(e) => warn!(error = %e, "cannot pull yet"),
            }
        }
    }

    async fn one(
        &self,
        stream: String,
        durable: String,
        subject: String,
    ) -> anyhow::Result<pull::Stream> {
        let consumer = self
            .bus
            .shared_consumer(&stream, &durable, subject, &self.settings)
            .await?;
        // Pull requests expire after 5 s (not async-nats's 30): the server keeps handing
        // messages to a pending request of a worker it cannot tell is cut off, redelivering
        // them there after each ack wait, until that request expires.
        Ok(consumer
            .stream()
            .max_messages_per_batch(self.batch)
            .expires(PULL_EXPIRES)
            .heartbeat(PULL_EXPIRES / 2)
            .messages()
            .await?)
    }
}

pub async fn handle(engine: Arc<Engine>, msg: Message, ack_wait: Duration) {
    let attempt = msg.info().map(|i| i.delivered as u64).unwrap_or(1);
    let envelope: Envelope = match serde_json::from_slice(&msg.payload) {
        Ok(envelope) => envelope,
        Err(e) => {
            warn!(subject = %msg.subject, error = %e, "unreadable message dropped");
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
    };
    // Only the run id is read: the run itself is what the gateway stored.
    let (run_id, job) = match envelope.event {
        Event::RunStart { run_id, .. } => (run_id, Job::Start),
        Event::ApprovalDecided { run_id, .. } => (run_id, Job::Decided),
        _ => {
            let _ = msg.ack().await;
            return;
        }
    };
    if attempt > 1 {
        engine.metrics().redelivered(job.stream());
    }
    let parent = trace_context::from_nats(msg.headers.as_ref());
    let work = engine.process(&run_id, job, attempt, parent);
    tokio::pin!(work);
    let mut progress = tokio::time::interval(ack_wait / 3);
    progress.tick().await;
    let next = loop {
        tokio::select! {
            next = &mut work => break next,
            _ = progress.tick() => {
                let _ = msg.ack_with(AckKind::Progress).await;
            }
        }
    };
    let acked = match next {
        Next::Ack => msg.ack().await,
        Next::Retry(delay) => msg.ack_with(AckKind::Nak(Some(delay))).await,
    };
    if let Err(e) = acked {
        warn!(%run_id, error = %e, "could not ack; the message will come again, harmlessly");
    }
}
