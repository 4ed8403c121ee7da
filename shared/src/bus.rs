//! NATS JetStream: the streams, the workers' shared durable consumers, and publishing
//! with `Nats-Msg-Id` so a retried publish is stored once.
//!
//! RUNS and DELIVERIES (one notification to one channel target each) are work queues: a
//! message leaves when it is acked. APPROVALS and RUN_EVENTS
//! keep messages for a while so several consumers (workers, the gateway's notifier, anyone
//! watching) can read them. AUDIT is the global audit log: every element of every run's
//! chain, kept for [`AUDIT_MAX_AGE`] and at most [`AUDIT_MAX_BYTES`] (the oldest go first),
//! for operators to read or export. All are file-backed, so a NATS restart loses nothing acked.

use crate::events::{Envelope, Event};
use crate::names::Names;
use async_nats::jetstream::{self, consumer::PullConsumer, message::PublishMessage, stream};
use std::time::Duration;

/// How long a `Nats-Msg-Id` is remembered for deduplication.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long approval and run events are kept.
const EVENTS_MAX_AGE: Duration = Duration::from_secs(14 * 24 * 3600);
/// How long the global audit log keeps an element.
pub const AUDIT_MAX_AGE: Duration = Duration::from_secs(90 * 24 * 3600);
/// The most the global audit log holds; beyond it the oldest elements are dropped.
pub const AUDIT_MAX_BYTES: i64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS: {0}")]
    Connect(String),
    #[error("JetStream: {0}")]
    JetStream(String),
}

fn js_err(e: impl std::fmt::Display) -> BusError {
    BusError::JetStream(e.to_string())
}

#[derive(Clone)]
pub struct Bus {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub names: Names,
}

/// Settings of a shared durable pull consumer.
pub struct ConsumerSettings {
    /// Redelivery after this long without an ack or a progress ack.
    pub ack_wait: Duration,
    /// At most this many messages handed out and not yet acked, across all workers.
    pub max_ack_pending: i64,
}

impl Bus {
    pub async fn connect(url: &str, names: Names) -> Result<Self, BusError> {
        let client = async_nats::ConnectOptions::new()
            .name("countersign")
            .connect(url)
            .await
            .map_err(|e| BusError::Connect(e.to_string()))?;
        let js = jetstream::new(client.clone());
        let bus = Self { client, js, names };
        bus.ensure_streams().await?;
        Ok(bus)
    }

    /// Creates the streams if they do not exist (every service does this at start).
    pub async fn ensure_streams(&self) -> Result<(), BusError> {
        let n = &self.names;
        let configs = [
            stream::Config {
                name: n.runs_stream(),
                subjects: vec![n.runs_start()],
                retention: stream::RetentionPolicy::WorkQueue,
                ..Default::default()
            },
            stream::Config {
                name: n.approvals_stream(),
                subjects: vec![n.approval_all()],
                max_age: EVENTS_MAX_AGE,
                ..Default::default()
            },
            stream::Config {
                name: n.deliveries_stream(),
                subjects: vec![n.deliver_all()],
                retention: stream::RetentionPolicy::WorkQueue,
                ..Default::default()
            },
            stream::Config {
                name: n.run_events_stream(),
                subjects: vec![n.run_events_all()],
                max_age: EVENTS_MAX_AGE,
                ..Default::default()
            },
            stream::Config {
                name: n.audit_stream(),
                subjects: vec![n.audit_all()],
                max_age: AUDIT_MAX_AGE,
                max_bytes: AUDIT_MAX_BYTES,
                discard: stream::DiscardPolicy::Old,
                ..Default::default()
            },
        ];
        for config in configs {
            let config = stream::Config {
                storage: stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                ..config
            };
            self.js.get_or_create_stream(config).await.map_err(js_err)?;
        }
        Ok(())
    }

    /// Publishes an event and waits until JetStream has stored it. `msg_id` makes a retry of
    /// the same publish harmless.
    pub async fn publish(
        &self,
        subject: String,
        msg_id: &str,
        event: Event,
    ) -> Result<(), BusError> {
        self.publish_json(subject, msg_id, &Envelope::new(event))
            .await
    }

    /// Publishes any JSON payload, deduplicated by `msg_id` like [`Bus::publish`].
    pub async fn publish_json(
        &self,
        subject: String,
        msg_id: &str,
        payload: &impl serde::Serialize,
    ) -> Result<(), BusError> {
        let body = serde_json::to_vec(payload).map_err(js_err)?;
        self.publish_raw(subject, msg_id, body).await
    }

    /// Publishes bytes as they are, deduplicated by `msg_id`, and waits for the ack.
    pub async fn publish_raw(
        &self,
        subject: String,
        msg_id: &str,
        body: Vec<u8>,
    ) -> Result<(), BusError> {
        let publish = PublishMessage::build()
            .payload(body.into())
            .message_id(msg_id);
        self.js
            .send_publish(subject, publish)
            .await
            .map_err(js_err)?
            .await
            .map_err(js_err)?;
        Ok(())
    }

    /// A durable pull consumer shared by every worker (each message goes to one of them).
    pub async fn shared_consumer(
        &self,
        stream: &str,
        durable: &str,
        filter_subject: String,
        settings: &ConsumerSettings,
    ) -> Result<PullConsumer, BusError> {
        let stream = self.js.get_stream(stream).await.map_err(js_err)?;
        stream
            .get_or_create_consumer(
                durable,
                jetstream::consumer::pull::Config {
                    durable_name: Some(durable.to_string()),
                    filter_subject,
                    ack_wait: settings.ack_wait,
                    max_ack_pending: settings.max_ack_pending,
                    ..Default::default()
                },
            )
            .await
            .map_err(js_err)
    }
}
