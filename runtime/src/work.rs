//! The JetStream work loop both services run: pull from their shared durable consumers, handle
//! each message in a task of its own, and tell JetStream what became of it.
//!
//! A message is taken only once a task is free to handle it (at most `concurrency` at once),
//! so a busy process does not sit on messages an idle one could take. Its handler says what
//! became of it ([`Outcome`]): acked, handed back to come again after a delay, or given up.
//! A message the process stops handling without an answer (it died, or the shutdown grace
//! ran out) is not acked, so JetStream delivers it again once its ack wait passes; with
//! [`InProgress::Extend`] progress acks hold it meanwhile, so long work is not sent twice.
//!
//! When NATS goes away for longer than the client waits, the message streams end: the loop
//! is then not ready (see [`Consumers`]) and pulls again every second until NATS answers.

use crate::bus::{Bus, ConsumerSettings};
use crate::health::Consumers;
use crate::metrics::Metrics;
use crate::names::Names;
use async_nats::jetstream::consumer::pull::MessagesError;
use async_nats::jetstream::{AckKind, Message};
use futures::StreamExt;
use futures::stream::{BoxStream, SelectAll};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How long a pull request waits on the server for messages.
const PULL_EXPIRES: Duration = Duration::from_secs(5);

/// Messages asked for at once per consumer, at most: small batches, so a busy process does
/// not sit on messages an idle one could take.
const MAX_BATCH: usize = 16;

/// The durable consumers a service pulls from, as an enum of its own: each message is
/// handled knowing which one it came from.
pub trait Source: Copy + Send + Sync + 'static {
    /// Every consumer the service pulls from.
    const ALL: &'static [Self];

    /// The stream its messages come from, as metrics label it (without the namespace).
    fn stream(self) -> &'static str;

    /// The shared durable consumer in this deployment.
    fn durable(self, names: &Names) -> Durable;
}

/// A shared durable pull consumer: its stream, its name and the subjects it takes.
pub struct Durable {
    /// The JetStream stream it reads.
    pub stream: String,
    /// The consumer's durable name, shared by every process of the service.
    pub name: String,
    /// The subject it filters the stream by.
    pub subject: String,
}

/// What JetStream hears of a message while it is handled.
#[derive(Clone, Copy)]
pub enum InProgress {
    /// Progress acks every third of the ack wait: the message comes again only once this
    /// process stops handling it, however long the work takes.
    Extend,
    /// Nothing: a message not answered within the ack wait comes again (here or elsewhere)
    /// even while it is still handled here.
    Lapse,
}

/// What became of a message.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Done (or nothing to do): acked.
    Ack,
    /// Worth trying again: handed back, to be delivered again after this long.
    Retry(Duration),
    /// Will never work: terminated, never delivered again.
    GiveUp,
}

/// A message taken from one of the consumers.
pub struct Taken<S> {
    /// The consumer it came from.
    pub source: S,
    /// Which delivery of the message this is, from 1.
    pub attempt: u64,
    /// The message itself, with its subject, payload and headers.
    pub msg: Message,
}

/// The work a service does with a message.
pub trait Handler<S>: Send + Sync + 'static {
    /// Handles one message and says what is to become of it.
    fn handle(&self, taken: &Taken<S>) -> impl Future<Output = Outcome> + Send;
}

/// How a service runs its loop.
pub struct Settings {
    /// The consumers' ack wait and how many messages may be out unacked at once.
    pub consumer: ConsumerSettings,
    /// What JetStream hears of a message while it is handled.
    pub in_progress: InProgress,
    /// Messages handled at once.
    pub concurrency: usize,
    /// How long work in flight may take to finish once the service stops.
    pub grace: Duration,
}

type Messages<S> = SelectAll<BoxStream<'static, (S, Result<Message, MessagesError>)>>;

/// A service's work loop, pulling from every consumer of `S` and handing messages to `H`.
pub struct WorkLoop<S, H> {
    bus: Bus,
    settings: Settings,
    consumers: Consumers,
    metrics: Metrics,
    handler: Arc<H>,
    messages: Messages<S>,
}

impl<S: Source, H: Handler<S>> WorkLoop<S, H> {
    /// Makes or finds the shared consumers and starts pulling from them; from then on
    /// `consumers` says the service pulls. A consumer that cannot be used is an error naming it.
    pub async fn pull(
        bus: Bus,
        settings: Settings,
        consumers: Consumers,
        metrics: Metrics,
        handler: Arc<H>,
    ) -> anyhow::Result<Self> {
        let messages = messages::<S>(&bus, &settings).await?;
        consumers.pulling();
        Ok(Self {
            bus,
            settings,
            consumers,
            metrics,
            handler,
            messages,
        })
    }

    /// Takes and handles messages until `shutdown`, then lets the work in flight finish
    /// within the grace period and abandons the rest (JetStream delivers it again).
    pub async fn run(mut self, shutdown: &CancellationToken) {
        let tasks = self.take(shutdown).await;
        drain(tasks, self.settings.grace).await;
    }

    /// Takes messages until `shutdown`; returns the work still in flight.
    async fn take(&mut self, shutdown: &CancellationToken) -> JoinSet<()> {
        let permits = Arc::new(Semaphore::new(self.settings.concurrency));
        let mut tasks = JoinSet::new();
        loop {
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                permit = permits.clone().acquire_owned() => permit,
            };
            // The semaphore is never closed.
            let Ok(permit) = permit else { break };
            let next = tokio::select! {
                _ = shutdown.cancelled() => break,
                next = self.messages.next() => next,
            };
            match next {
                // The consumers ended (NATS went away for longer than the client waits): pull
                // again once it is back, rather than stopping.
                None => {
                    warn!("message streams ended; pulling again once NATS answers");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        messages = pull_again(&self.bus, &self.settings, &self.consumers) => {
                            self.messages = messages;
                        }
                    }
                }
                Some((source, Err(e))) => {
                    warn!(stream = source.stream(), error = %e, "error pulling messages");
                }
                Some((source, Ok(msg))) => {
                    let attempt = msg.info().map(|i| i.delivered as u64).unwrap_or(1);
                    if attempt > 1 {
                        self.metrics.redelivered(source.stream());
                    }
                    let taken = Taken {
                        source,
                        attempt,
                        msg,
                    };
                    let handler = self.handler.clone();
                    let progress = match self.settings.in_progress {
                        InProgress::Extend => Some(self.settings.consumer.ack_wait / 3),
                        InProgress::Lapse => None,
                    };
                    tasks.spawn(async move {
                        handle(&*handler, taken, progress).await;
                        drop(permit);
                    });
                }
            }
            // Finished work is reaped as new work comes, so the set stays small.
            while tasks.try_join_next().is_some() {}
        }
        tasks
    }
}

/// Pulls again, every second until NATS answers; meanwhile the service is not ready.
async fn pull_again<S: Source>(
    bus: &Bus,
    settings: &Settings,
    consumers: &Consumers,
) -> Messages<S> {
    consumers.stopped();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        match messages::<S>(bus, settings).await {
            Ok(messages) => {
                consumers.pulling();
                return messages;
            }
            Err(e) => warn!(error = %e, "cannot pull yet"),
        }
    }
}

/// The messages of every consumer of `S`, each tagged with where it came from.
async fn messages<S: Source>(bus: &Bus, settings: &Settings) -> anyhow::Result<Messages<S>> {
    let mut all = SelectAll::new();
    for &source in S::ALL {
        let durable = source.durable(&bus.names);
        let consumer = bus
            .shared_consumer(
                &durable.stream,
                &durable.name,
                durable.subject,
                &settings.consumer,
            )
            .await?;
        // Pull requests expire after 5 s (not async-nats's 30): the server keeps handing
        // messages to a pending request of a process it cannot tell is cut off, redelivering
        // them there after each ack wait, until that request expires.
        let messages = consumer
            .stream()
            .max_messages_per_batch(settings.concurrency.clamp(1, MAX_BATCH))
            .expires(PULL_EXPIRES)
            .heartbeat(PULL_EXPIRES / 2)
            .messages()
            .await?;
        all.push(messages.map(move |m| (source, m)).boxed());
    }
    Ok(all)
}

/// Handles one message, with progress acks every `progress` meanwhile when given, and tells
/// JetStream the outcome.
async fn handle<S: Source>(handler: &impl Handler<S>, taken: Taken<S>, progress: Option<Duration>) {
    let work = handler.handle(&taken);
    let outcome = match progress {
        None => work.await,
        Some(every) => {
            tokio::pin!(work);
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tokio::select! {
                    outcome = &mut work => break outcome,
                    _ = tick.tick() => {
                        let _ = taken.msg.ack_with(AckKind::Progress).await;
                    }
                }
            }
        }
    };
    let acked = match outcome {
        Outcome::Ack => taken.msg.ack().await,
        Outcome::Retry(delay) => taken.msg.ack_with(AckKind::Nak(Some(delay))).await,
        Outcome::GiveUp => taken.msg.ack_with(AckKind::Term).await,
    };
    if let Err(e) = acked {
        warn!(
            stream = taken.source.stream(),
            subject = %taken.msg.subject,
            error = %e,
            "could not ack; the message will come again"
        );
    }
}

/// Lets the work in flight finish within `grace`, then abandons the rest: its messages are
/// not acked, so JetStream delivers them again.
async fn drain(mut tasks: JoinSet<()>, grace: Duration) {
    // Work that finished since the last message came is still in the set until joined.
    while tasks.try_join_next().is_some() {}
    info!(in_flight = tasks.len(), "stopping: no new work taken");
    let drained = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} });
    if drained.await.is_err() {
        warn!(
            left = tasks.len(),
            "grace period over; handing the rest back"
        );
        tasks.abort_all();
    }
}
