//! NATS JetStream: the streams, the workers' shared durable consumers, and publishing
//! with `Nats-Msg-Id` so a retried publish is stored once.
//!
//! RUNS and DELIVERIES (one notification to one channel target each) are work queues: a
//! message leaves when it is acked. APPROVALS and RUN_EVENTS
//! keep messages for a while so several consumers (workers, the gateway's delivery fan-out, anyone
//! watching) can read them. AUDIT is the global audit log: every element of every run's
//! chain, kept for [`AUDIT_MAX_AGE`] and at most [`AUDIT_MAX_BYTES`] (the oldest go first),
//! for operators to read or export. LIVE holds each run's live events (`live.<run>`: the
//! model's text as it streams, tool calls and results, a copy of each announcement about the
//! run), which the gateway serves as server-sent events. All are file-backed, so a NATS
//! restart loses nothing acked.

use crate::config::Connections;
use crate::names::Names;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{self, consumer::PullConsumer, message::PublishMessage, stream};
use countersign_model::events::{Envelope, Event};
use countersign_model::run::RunId;
use std::time::Duration;

/// How long a `Nats-Msg-Id` is remembered for deduplication.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How many times a stream or consumer is read and created or updated, when processes
/// starting together keep crossing, before it counts as an error.
const RECONCILE_ATTEMPTS: u32 = 10;
/// How long approval and run events are kept.
const EVENTS_MAX_AGE: Duration = Duration::from_secs(14 * 24 * 3600);
/// How long the global audit log keeps an element.
pub const AUDIT_MAX_AGE: Duration = Duration::from_secs(90 * 24 * 3600);
/// The most the global audit log holds; beyond it the oldest elements are dropped.
pub const AUDIT_MAX_BYTES: i64 = 1 << 30;
/// The most the runs' live events take; beyond it the oldest go first. They are kept as long
/// as approval events, so a run that waited for days can still be followed from its start.
pub const LIVE_MAX_BYTES: i64 = 1 << 30;

/// Why NATS or JetStream could not be used.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The client could not connect to NATS.
    #[error("cannot connect to NATS: {0}")]
    Connect(String),
    /// A JetStream request failed, or a stream cannot be made as the deployment needs it.
    #[error("JetStream: {0}")]
    JetStream(String),
}

/// The servers of a comma-separated list; an entry that is not a NATS URL is named.
fn servers(list: &str) -> Result<Vec<async_nats::ServerAddr>, BusError> {
    list.split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(|url| {
            url.parse()
                .map_err(|e| BusError::Connect(format!("{url:?} is not a NATS URL: {e}")))
        })
        .collect()
}

/// The client's options: its name, credentials and TLS.
async fn options(connections: &Connections) -> Result<async_nats::ConnectOptions, BusError> {
    crate::tls::install_crypto_provider();
    let mut options = async_nats::ConnectOptions::new()
        .name("countersign")
        .connection_timeout(Duration::from_secs(2))
        .event_callback(|event| async move { log_event(&event) });
    if let Some(path) = &connections.nats_creds_file {
        options = options.credentials_file(path).await.map_err(|e| {
            BusError::Connect(format!(
                "cannot read the NATS credentials {}: {e}",
                path.display()
            ))
        })?;
    }
    if let (Some(user), Some(password)) = (&connections.nats_user, &connections.nats_password) {
        options = options.user_and_password(user.clone(), password.expose().to_string());
    }
    if let Some(token) = &connections.nats_token {
        options = options.token(token.expose().to_string());
    }
    if let Some(seed) = &connections.nats_nkey {
        options = options.nkey(seed.expose().to_string());
    }
    if let Some(ca) = &connections.nats_tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&connections.nats_tls_cert, &connections.nats_tls_key) {
        options = options
            .add_client_certificate(cert.clone(), key.clone())
            .require_tls(true);
    }
    Ok(options)
}

/// The target of the warning logged when the server refuses something this process did
/// (a permissions violation names the subject): a deployment whose NATS users do not allow
/// what the services do. The tests fail on any such warning.
pub const SERVER_ERROR_TARGET: &str = "countersign::nats";

/// Logs what the client reports about its connection. The server's errors are warnings: a
/// refused publish otherwise shows only as an ack that never comes, and a refused
/// subscription as messages that never arrive.
fn log_event(event: &async_nats::Event) {
    use async_nats::Event;
    match event {
        Event::ServerError(error) => {
            tracing::warn!(target: SERVER_ERROR_TARGET, %error, "the NATS server refused what this process did");
        }
        Event::ClientError(error) => tracing::warn!(%error, "NATS client error"),
        Event::SlowConsumer(sid) => {
            tracing::warn!(
                subscription = sid,
                "a NATS subscription reads too slowly; messages were dropped"
            );
        }
        Event::Disconnected => tracing::warn!("disconnected from NATS; reconnecting"),
        Event::LameDuckMode => tracing::warn!("the NATS server is going away (lame duck mode)"),
        Event::Connected | Event::Draining | Event::Closed => {
            tracing::info!(%event, "NATS connection");
        }
    }
}

/// JetStream reports "no limit" as -1 where a new config says 0.
fn unlimited_if_none(bytes: i64) -> String {
    if bytes <= 0 {
        "unlimited".into()
    } else {
        bytes.to_string()
    }
}

/// What differs between a stream's configuration and the wanted one, among what is set here.
fn changes(have: &stream::Config, want: &stream::Config) -> Vec<String> {
    let mut changed = Vec::new();
    let mut differ = |what: &str, have: String, want: String| {
        if have != want {
            changed.push(format!("{what} {have} -> {want}"));
        }
    };
    differ(
        "replicas",
        have.num_replicas.to_string(),
        want.num_replicas.to_string(),
    );
    differ(
        "max_age",
        format!("{:?}", have.max_age),
        format!("{:?}", want.max_age),
    );
    differ(
        "max_bytes",
        unlimited_if_none(have.max_bytes),
        unlimited_if_none(want.max_bytes),
    );
    differ("subjects", have.subjects.join(" "), want.subjects.join(" "));
    differ(
        "retention",
        format!("{:?}", have.retention),
        format!("{:?}", want.retention),
    );
    differ(
        "storage",
        format!("{:?}", have.storage),
        format!("{:?}", want.storage),
    );
    differ(
        "duplicate_window",
        format!("{:?}", have.duplicate_window),
        format!("{:?}", want.duplicate_window),
    );
    changed
}

fn js_err(e: impl std::fmt::Display) -> BusError {
    BusError::JetStream(e.to_string())
}

/// The connection to NATS and JetStream of one process, with the deployment's names; clones
/// share it.
#[derive(Clone)]
pub struct Bus {
    /// The NATS client, for core publishes and subscriptions.
    pub client: async_nats::Client,
    /// The JetStream context, for streams, consumers and acknowledged publishes.
    pub js: jetstream::Context,
    /// The subjects and streams of the deployment.
    pub names: Names,
}

/// What an event may take of the server's `max_payload`: the rest is left for the wrapping a
/// delivery adds (its id, channel, timestamp) and for headers.
pub const PAYLOAD_HEADROOM: usize = 16 * 1024;

/// Settings of a shared durable pull consumer.
pub struct ConsumerSettings {
    /// Redelivery after this long without an ack or a progress ack.
    pub ack_wait: Duration,
    /// At most this many messages handed out and not yet acked, across all workers.
    pub max_ack_pending: i64,
}

impl Bus {
    /// Connects to the servers `connections` names and makes sure the streams are as configured.
    /// While no server answers, it keeps trying (saying so every time), so a service may
    /// start before NATS; a bad setting or a stream change JetStream refuses is an error.
    pub async fn connect(connections: &Connections, names: Names) -> Result<Self, BusError> {
        let servers = servers(&connections.nats_url)?;
        let mut delay = Duration::from_millis(250);
        let client = loop {
            match options(connections).await?.connect(servers.clone()).await {
                Ok(client) => break client,
                Err(e) => {
                    tracing::warn!(servers = %connections.nats_url, error = %e, ?delay, "NATS does not answer yet; trying again");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        };
        let js = jetstream::new(client.clone());
        let bus = Self { client, js, names };
        bus.ensure_streams(connections.stream_replicas).await?;
        Ok(bus)
    }

    /// Creates the streams that do not exist and brings those that do to their configuration
    /// (replicas, limits), saying what changed; a change JetStream cannot make (retention,
    /// storage) is an error naming the stream.
    pub async fn ensure_streams(&self, replicas: usize) -> Result<(), BusError> {
        // A standalone server would take a replica count it cannot hold and keep one copy.
        if replicas > 1 && self.client.server_info().cluster.is_none() {
            return Err(BusError::JetStream(format!(
                "stream_replicas is {replicas} but the NATS server is not part of a cluster, so every stream would keep one copy: run a NATS cluster of at least {replicas} servers, or set stream_replicas = 1"
            )));
        }
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
                subjects: vec![n.delivery_all()],
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
            stream::Config {
                name: n.live_stream(),
                subjects: vec![n.live_all()],
                max_age: EVENTS_MAX_AGE,
                max_bytes: LIVE_MAX_BYTES,
                discard: stream::DiscardPolicy::Old,
                ..Default::default()
            },
        ];
        for config in configs {
            self.ensure_stream(stream::Config {
                storage: stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                num_replicas: replicas,
                ..config
            })
            .await?;
        }
        Ok(())
    }

    /// Makes one stream as `wanted` says, however many processes do the same at once: a
    /// create that loses a race ("already exists", "subjects overlap" with the stream being
    /// created) and an update that crosses another are followed by reading the stream again
    /// and comparing. Only what cannot be made so is an error: retention or storage that
    /// JetStream cannot change, subjects another stream holds, or a server that keeps
    /// refusing.
    async fn ensure_stream(&self, wanted: stream::Config) -> Result<(), BusError> {
        let name = &wanted.name;
        let mut last = String::new();
        for attempt in 0..RECONCILE_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(retry_delay(attempt)).await;
            }
            let have = match self.js.get_stream(name).await {
                Ok(stream) => stream.cached_info().config.clone(),
                Err(e) if stream_missing(&e) => match self.js.create_stream(wanted.clone()).await {
                    Ok(_) => return Ok(()),
                    Err(e) => {
                        if let Some(owner) = self.subjects_owner(&e, &wanted).await {
                            return Err(BusError::JetStream(format!(
                                "stream {name} cannot be created: its subjects ({}) belong to stream {owner}; delete that stream, or give this deployment another namespace",
                                wanted.subjects.join(" ")
                            )));
                        }
                        last = format!("creating it: {e}");
                        continue;
                    }
                },
                Err(e) => {
                    last = format!("reading it: {e}");
                    continue;
                }
            };
            let changed = changes(&have, &wanted);
            if changed.is_empty() {
                return Ok(());
            }
            if have.retention != wanted.retention || have.storage != wanted.storage {
                return Err(BusError::JetStream(format!(
                    "stream {name} differs from its configuration in what JetStream cannot change ({}): move its messages to a new stream or delete it",
                    changed.join(", ")
                )));
            }
            tracing::warn!(stream = %name, changed = %changed.join(", "), "updating the stream to its configuration");
            match self.js.update_stream(&wanted).await {
                Ok(_) => return Ok(()),
                // Another process may be updating it too: read it again and compare.
                Err(e) => last = format!("updating it ({}): {e}", changed.join(", ")),
            }
        }
        Err(BusError::JetStream(format!(
            "stream {name} is still not as configured after {RECONCILE_ATTEMPTS} tries; last: {last}"
        )))
    }

    /// After a create refused because its subjects overlap: the stream holding them, when it
    /// is another one (a real conflict, not a race with a process creating the same stream).
    async fn subjects_owner(
        &self,
        refused: &jetstream::context::CreateStreamError,
        wanted: &stream::Config,
    ) -> Option<String> {
        let jetstream::context::CreateStreamErrorKind::JetStream(e) = refused.kind() else {
            return None;
        };
        if e.error_code() != ErrorCode::STREAM_SUBJECT_OVERLAP {
            return None;
        }
        for subject in &wanted.subjects {
            if let Ok(owner) = self.js.stream_by_subject(subject.clone()).await
                && owner != wanted.name
            {
                return Some(owner);
            }
        }
        None
    }

    /// The largest message the server takes, in bytes (its `max_payload`, 1 MiB by default),
    /// as it said when the client connected.
    pub fn max_payload(&self) -> usize {
        self.client.max_payload()
    }

    /// The most an announcement's event may take, in bytes of JSON: [`Bus::max_payload`]
    /// less [`PAYLOAD_HEADROOM`] (see `Event::fit`).
    pub fn event_limit(&self) -> usize {
        self.max_payload().saturating_sub(PAYLOAD_HEADROOM)
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

    /// Publishes bytes as they are, deduplicated by `msg_id`, with the current span's
    /// `traceparent`, and waits for the ack. An announcement about a run also goes to the
    /// run's live events ([`Names::live_copy`]), sent ahead of it on the same connection so
    /// that it takes its place among the worker's own live events; both must be stored, so
    /// an announcement the outbox sends again reaches the live events too.
    pub async fn publish_raw(
        &self,
        subject: String,
        msg_id: &str,
        body: Vec<u8>,
    ) -> Result<(), BusError> {
        let body = bytes::Bytes::from(body);
        // Whoever takes the message continues the publishing span's trace.
        let traceparent = crate::trace_context::current();
        let message = |body: bytes::Bytes| {
            let publish = PublishMessage::build().payload(body).message_id(msg_id);
            match &traceparent {
                Some(traceparent) => {
                    publish.header(crate::trace_context::HEADER, traceparent.as_str())
                }
                None => publish,
            }
        };
        let copy = match self.names.live_copy(&subject) {
            Some(live) => Some(
                self.js
                    .send_publish(live, message(body.clone()))
                    .await
                    .map_err(js_err)?,
            ),
            None => None,
        };
        let ack = self
            .js
            .send_publish(subject, message(body))
            .await
            .map_err(js_err)?;
        if let Some(copy) = copy {
            copy.await.map_err(js_err)?;
        }
        ack.await.map_err(js_err)?;
        Ok(())
    }

    /// Publishes one of a run's live events without waiting for JetStream's ack: the model's
    /// text as it streams, a tool call or its result. Events published from one process
    /// arrive in the order they were published (one connection); what the run stores does
    /// not depend on them, so one lost in an outage is not sent again.
    pub async fn publish_live(&self, run: &RunId, body: Vec<u8>) -> Result<(), BusError> {
        self.client
            .publish(self.names.live_subject(run), body.into())
            .await
            .map_err(js_err)
    }

    /// A durable pull consumer shared by every worker (each message goes to one of them).
    /// Any number of processes may ask for it at once: a create that loses the race is
    /// followed by reading the consumer the winner made.
    pub async fn shared_consumer(
        &self,
        stream: &str,
        durable: &str,
        filter_subject: String,
        settings: &ConsumerSettings,
    ) -> Result<PullConsumer, BusError> {
        let config = jetstream::consumer::pull::Config {
            durable_name: Some(durable.to_string()),
            filter_subject,
            ack_wait: settings.ack_wait,
            max_ack_pending: settings.max_ack_pending,
            ..Default::default()
        };
        let mut last = String::new();
        for attempt in 0..RECONCILE_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(retry_delay(attempt)).await;
            }
            let stream = match self.js.get_stream(stream).await {
                Ok(stream) => stream,
                Err(e) => {
                    last = format!("reading stream {stream}: {e}");
                    continue;
                }
            };
            match stream.get_or_create_consumer(durable, config.clone()).await {
                Ok(consumer) => return Ok(consumer),
                Err(e) => last = format!("creating it: {e}"),
            }
            if let Ok(consumer) = stream.get_consumer(durable).await {
                return Ok(consumer);
            }
        }
        Err(BusError::JetStream(format!(
            "consumer {durable} of stream {stream} could not be made after {RECONCILE_ATTEMPTS} tries; last: {last}"
        )))
    }
}

/// Whether reading a stream failed because it does not exist.
fn stream_missing(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(e)
        if e.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// The pause before try `attempt` (from 1): 20 ms doubling to at most a second, so processes
/// that collided do not collide again in step.
fn retry_delay(attempt: u32) -> Duration {
    let base = Duration::from_millis(10 << attempt.min(7)).min(Duration::from_secs(1));
    let jitter = (uuid::Uuid::new_v4().as_u128() % 20) as u64;
    base + Duration::from_millis(jitter)
}

impl Bus {
    /// The runs with an element of their audit chain on the `AUDIT` stream at or after
    /// `since_ms` (ms since the epoch): every run that did anything since, as far as the
    /// stream's retention reaches.
    pub async fn audited_runs_since(
        &self,
        since_ms: i64,
    ) -> Result<std::collections::BTreeSet<RunId>, BusError> {
        let start_time = async_nats::datetime::from_nanos(i128::from(since_ms) * 1_000_000)
            .map_err(|e| BusError::JetStream(e.to_string()))?;
        let prefix = self.names.audit_subject_prefix();
        let mut runs = std::collections::BTreeSet::new();
        self.read_audit(
            self.names.audit_all(),
            DeliverPolicy::ByStartTime { start_time },
            |message| {
                if let Some(id) = message
                    .subject
                    .strip_prefix(prefix.as_str())
                    .and_then(RunId::parse)
                {
                    runs.insert(id);
                }
                Ok(())
            },
        )
        .await?;
        Ok(runs)
    }

    /// A run's audit chain as the `AUDIT` stream keeps it, oldest first: the long-term record,
    /// read once the run's own copy in Redis has expired with the run. Each element comes
    /// once, though the stream may hold it twice (an outbox that published it again after
    /// the stream's duplicate window).
    pub async fn audit_chain(&self, run: &RunId) -> Result<Vec<serde_json::Value>, BusError> {
        let mut seen = std::collections::HashSet::new();
        let mut chain = Vec::new();
        self.read_audit(
            self.names.audit_subject(run),
            DeliverPolicy::All,
            |message| {
                let element: serde_json::Value = serde_json::from_slice(&message.payload)
                    .map_err(|e| BusError::JetStream(format!("an audit element unread: {e}")))?;
                if seen.insert(element["hash"].as_str().unwrap_or_default().to_string()) {
                    chain.push(element);
                }
                Ok(())
            },
        )
        .await?;
        Ok(chain)
    }

    /// Hands `each` every message of the `AUDIT` stream under `filter` from `deliver`, in
    /// order, through a consumer of its own that acks nothing and is dropped by the server
    /// once idle; nothing on the stream changes.
    async fn read_audit(
        &self,
        filter: String,
        deliver: DeliverPolicy,
        mut each: impl FnMut(&async_nats::Message) -> Result<(), BusError>,
    ) -> Result<(), BusError> {
        use futures::StreamExt;
        let err = |e: &dyn std::fmt::Display| BusError::JetStream(e.to_string());
        let stream = self
            .js
            .get_stream(self.names.audit_stream())
            .await
            .map_err(|e| err(&e))?;
        let mut consumer = stream
            .create_consumer(pull::Config {
                filter_subject: filter,
                deliver_policy: deliver,
                ack_policy: AckPolicy::None,
                inactive_threshold: Duration::from_secs(60),
                ..Default::default()
            })
            .await
            .map_err(|e| err(&e))?;
        let mut left = consumer.info().await.map_err(|e| err(&e))?.num_pending;
        while left > 0 {
            let mut batch = consumer
                .fetch()
                .max_messages(left.min(1000) as usize)
                .expires(Duration::from_secs(2))
                .messages()
                .await
                .map_err(|e| err(&e))?;
            let mut got = 0;
            while let Some(message) = batch.next().await {
                each(&message.map_err(|e| err(&e))?.message)?;
                got += 1;
            }
            if got == 0 {
                break;
            }
            left = left.saturating_sub(got);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_servers_parses_and_a_bad_entry_is_named() {
        let list = servers("nats://a:4222, nats://b:4222,tls://c:4443").unwrap();
        assert_eq!(list.len(), 3);
        let err = servers("nats://a:4222,nats://b:port")
            .unwrap_err()
            .to_string();
        assert!(err.contains("nats://b:port"), "{err}");
    }
}
