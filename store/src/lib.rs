//! Run state in Redis. Every change of state is one Lua script (in `lua/`) that checks the
//! status, and the lease where a worker holds one, before it writes, so two gateways or two
//! workers can never both win. A script that changes what others must hear of also appends
//! the audit entries and queues the announcements in the same step (see [`crate::relay`]).
//!
//! Layout, all keys of a run sharing the hash tag `{run_id}` so each script touches one slot:
//! - `run:{id}` hash: `status`, `version` (bumped by every write), `turn`, `pending_count` and
//!   `decided_count` of the held turn, `requested_by`, `lease_owner`/`lease_until` of the
//!   worker driving it, `audit_head` (the last link of its audit chain), and `doc`, the whole
//!   [`Run`] as LZ4-compressed JSON (see `doc`; its `status` field is overwritten on read by
//!   the hash's, which is the one scripts keep right);
//! - `calls:{id}` hash: call id -> the [`DecisionTerms`] every decision is checked against (a call
//!   id names one call for the life of the run, whatever ids the model reuses: see
//!   [`Run::calls_asked`], so every per-call record here is one call's, of one turn);
//! - `decisions:{id}` hash: call id -> the recorded [`Decision`];
//! - `exec:{id}` hash: call id -> `started`, or the [`countersign_model::run::CallResult`] once it finished;
//! - `votes:{id}` hash: the approvals collected so far for calls that need several;
//! - `refs:{id}` hash: where each channel's message about a call is, to update it later;
//! - `audit:{id}` list: the run's hash-chained audit trail (see [`countersign_model::audit`]);
//! - `outbox:{id}` hash: announcements not yet acknowledged by JetStream;
//! - `refusals:{id}` list: the latest refused decisions, capped;
//! - `link:{id}:{hash}` strings: email link tokens for the run's calls (once spent,
//!   `spent:` and the grant, until they expire).
//!
//! Outside the runs' slots, the web inbox keeps `session:{hash}`, `sign-in:{hash}` and
//! `sign-in-mailed:{hash}` strings (see `sessions`), and each policy window's key a
//! `window:{w:id}` sorted set and `window-amounts:{w:id}` hash in its own slot (see `windows`).
//!
//! Leases and deadlines are compared with Redis's clock (`TIME` in the scripts). Finished runs
//! get a retention TTL on all their keys, the audit trail included (its elements are on the
//! `AUDIT` stream, which keeps them longer). Each shard of runs keeps its indexes in a slot of
//! its own (the outbox's, the paused runs' `awaiting` for the inbox, the deadlines' and the
//! reminders'): on one server the step's script changes them too; under Cluster a script of
//! their own runs just before it (see `lua/shard.lua`), so an index may name a run that has
//! moved on, and readers re-check each run's status.

mod agent_exec;
mod connection;
mod decide;
mod delegations;
mod doc;
mod exec;
mod grants;
mod handles;
mod inbox;
pub mod keys;
mod outbox;
mod presence;
mod records;
pub mod relay;
mod script;
mod sessions;
mod timers;
mod windows;

pub use agent_exec::{AgentExecution, AgentStep, AgentStepped};
pub use decide::{
    CallDecided, DecideOutcome, DecideRequest, DecidedStatus, DecisionSource, Proposal, Refusal,
    RefusalCode,
};
pub use exec::{ExecBegin, Execution};
pub use grants::{KEEP_ENDED, UseOutcome};
pub use handles::{Closing, GatewayStore, WorkerStore};
pub use inbox::Awaiting;
pub use outbox::Indexes;
pub use records::IdempotencyRecord;
pub use timers::{Due, DueTimer, Timer};

use connection::Connection;
use countersign_model::audit::{AuditEntry, prepare};
use countersign_model::events::{Envelope, Event};
use countersign_model::run::{Decision, DecisionTerms, Run, RunId, RunStatus};
use countersign_runtime::metrics::Metrics;
use countersign_runtime::names::{Names, msg_id};
use keys::{Keys, Shard};
use redis::ScriptInvocation;
use script::{Argv, Lua, NoArgs};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis refused the command or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// What Redis holds cannot be read as the store wrote it; what was wrong.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// Another worker took the run over (our lease lapsed) or it left the driving states.
    #[error("this worker no longer holds the run (status now {0:?})")]
    LostLease(String),
    /// Someone cancelled the run: the only save left is the one that finishes it so.
    #[error("the run was cancelled")]
    Cancelled,
}

/// A message a script queued in a run's outbox (or is given to queue): published with its
/// message id, and deleted from the outbox once JetStream has acknowledged it.
#[derive(Clone, Debug, PartialEq)]
pub struct Announcement {
    /// The `Nats-Msg-Id` JetStream drops repeats by (see `countersign_runtime::names::msg_id`).
    pub msg_id: String,
    /// The NATS subject it goes to.
    pub subject: String,
    /// The event as JSON, in its envelope.
    pub payload: String,
}

impl Announcement {
    /// The announcement of `event` on `subject` under `msg_id`.
    pub fn new(msg_id: String, subject: String, event: Event) -> Self {
        Self {
            msg_id,
            subject,
            payload: crate::event(event),
        }
    }

    /// Reads the `msg_id, "subject\npayload"` pairs a script replies with.
    fn from_pairs(pairs: &[String]) -> Result<Vec<Self>, StoreError> {
        pairs
            .chunks(2)
            .map(|pair| match pair {
                [msg_id, value] => {
                    let (subject, payload) = value
                        .split_once('\n')
                        .ok_or_else(|| StoreError::Corrupt(format!("outbox entry {msg_id}")))?;
                    Ok(Self {
                        msg_id: msg_id.clone(),
                        subject: subject.to_string(),
                        payload: payload.to_string(),
                    })
                }
                _ => Err(StoreError::Corrupt("odd outbox reply".into())),
            })
            .collect()
    }
}

/// What a claim attempt found.
#[derive(Debug, PartialEq)]
pub enum Claim {
    /// The caller now drives the run, as it is now.
    Claimed(Box<Claimed>),
    /// Another worker holds a lease for this long yet.
    Busy(Duration),
    /// Paused with calls still undecided.
    Waiting,
    /// Completed, failed or cancelled.
    Finished(RunStatus),
    /// No run of this id is stored.
    Missing,
}

/// A run just claimed, with what driving it reads first.
#[derive(Debug, PartialEq)]
pub struct Claimed {
    /// Its status is the one the claim moved it to (`running` or `resuming`).
    pub run: Run,
    /// The recorded decisions, when it resumes after a pause; else empty.
    pub decisions: HashMap<String, Decision>,
}

/// What a save writes besides the run: the audit entries of what changed, the announcements
/// others must hear of, and what changes in the run's shard's indexes (a pause's own listing
/// and timers are added by the save).
#[derive(Clone, Debug, Default)]
pub struct Changes {
    /// Appended to the run's audit chain.
    pub audits: Vec<AuditEntry>,
    /// Queued in the run's outbox.
    pub announce: Vec<Announcement>,
    /// Changed in the shard's indexes.
    pub index: Indexes,
}

/// How a saved run goes on; the kind decides the status written.
pub enum Save {
    /// Still being driven: the turn the model just asked for, stored before any of its calls
    /// runs, each call that runs without a person marked started in its execution record by
    /// the attempt `token` in the same step (so the attempt calls them without asking
    /// [`Store::exec_begin`]): `running`.
    Turn {
        /// The attempt token the started calls' execution records carry.
        token: String,
    },
    /// Paused: its held calls wait for a person: `awaiting_approval`.
    Pause,
    /// Finished (`completed`, `failed` or `cancelled`): keep it this long, then let Redis drop
    /// it.
    Finish {
        /// The status it ends in.
        status: RunStatus,
        /// How long Redis keeps the finished run before it expires.
        retention: Duration,
    },
}

impl Save {
    /// The status this save writes.
    pub fn status(&self) -> RunStatus {
        match self {
            Self::Turn { .. } => RunStatus::Running,
            Self::Pause => RunStatus::AwaitingApproval,
            Self::Finish { status, .. } => *status,
        }
    }
}

/// What asking a run to stop found.
#[derive(Debug, PartialEq)]
pub enum CancelOutcome {
    /// Marked (now or before); the run was in this status. A worker finishes it.
    Requested(RunStatus, Vec<Announcement>),
    /// It had finished already, so.
    Finished(RunStatus),
    /// No run of this id is stored.
    NoRun,
}

/// The runs in Redis: the reads and the outbox both services share, seen through a
/// `WorkerStore` or a `GatewayStore`; clones share one connection.
#[derive(Clone)]
pub struct Store {
    conn: Connection,
    /// The subjects the scripts' announcements go to.
    names: Names,
    keys: Keys,
    heads: Heads,
    clock: Clock,
}

impl Store {
    /// Connects to Redis as the configuration describes it (see [`connection`]). Commands
    /// fail fast while Redis is away, so a request gets its 503 within about a second;
    /// whoever called retries later (a client, or JetStream's redelivery). Each command's
    /// round trip is timed in `metrics`.
    pub async fn connect(
        connections: &countersign_runtime::config::Connections,
        names: Names,
        metrics: Metrics,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            conn: Connection::open(connections, metrics).await?,
            keys: Keys::of(&names),
            names,
            heads: Heads::default(),
            clock: Clock::default(),
        })
    }

    /// Like [`Store::connect`], but while Redis does not answer (refused, unreachable, timed
    /// out) waits and tries again, saying so, so a service may start before Redis. Any other
    /// failure (a wrong password, a bad URL) is returned at once.
    pub async fn connect_waiting(
        connections: &countersign_runtime::config::Connections,
        names: Names,
        metrics: Metrics,
    ) -> Result<Self, StoreError> {
        let mut delay = Duration::from_millis(250);
        loop {
            match Self::connect(connections, names.clone(), metrics.clone()).await {
                Err(StoreError::Redis(e))
                    if e.is_io_error() || e.is_connection_refusal() || e.is_timeout() =>
                {
                    tracing::warn!(redis = %connections.redis_url, error = %e, ?delay, "Redis does not answer yet; trying again");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                other => return other,
            }
        }
    }

    /// The NATS names of the deployment, which the scripts' announcements go to.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// The Redis keys of the deployment.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Checks the connection for readiness probes.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Redis's clock in milliseconds: the one leases and deadlines are compared with. Read
    /// from Redis at most once per [`Clock::FRESH`]; meanwhile carried forward on this
    /// process's monotonic clock, which costs no round trip and is off by at most the read's.
    pub async fn time_ms(&self) -> Result<i64, StoreError> {
        if let Some(now) = self.clock.now() {
            return Ok(now);
        }
        let asked = Instant::now();
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.conn.clone())
            .await?;
        let now = secs * 1000 + micros / 1000;
        self.clock.read(asked, now);
        Ok(now)
    }
    /// The run with the version it was read at, for [`Store::escalate`]. The status and the
    /// cancellation are the hash's, which the scripts keep.
    pub async fn load_versioned(&self, id: &RunId) -> Result<Option<(Run, String)>, StoreError> {
        let fields: RunFields = self
            .run_fields(id)
            .query_async(&mut self.conn.clone())
            .await?;
        self.read_fields(id, fields)
    }

    /// The run and the recorded decisions on its calls, read in one round trip.
    pub async fn load_with_decisions(
        &self,
        id: &RunId,
    ) -> Result<Option<(Run, HashMap<String, Decision>)>, StoreError> {
        let (fields, decisions): (RunFields, HashMap<String, String>) = redis::pipe()
            .add_command(self.run_fields(id))
            .hgetall(self.keys.decisions_key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        let Some((run, _)) = self.read_fields(id, fields)? else {
            return Ok(None);
        };
        Ok(Some((run, read_decisions(decisions)?)))
    }

    /// The run hash's fields a load reads.
    fn run_fields(&self, id: &RunId) -> redis::Cmd {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.keys.run_key(id))
            .arg(&["status", "doc", "version", "cancel", "audit_head"]);
        cmd
    }

    /// The run and its version from the fields [`Store::run_fields`] reads; none if it is
    /// not stored.
    fn read_fields(
        &self,
        id: &RunId,
        (status, doc, version, cancel, head): RunFields,
    ) -> Result<Option<(Run, String)>, StoreError> {
        let (Some(status), Some(doc), Some(version)) = (status, doc, version) else {
            return Ok(None);
        };
        self.heads.saw(id, head.as_deref().unwrap_or_default());
        Ok(Some((read_run(&status, &doc, cancel.as_deref())?, version)))
    }

    /// The run with its authoritative status, if it exists.
    pub async fn load(&self, id: &RunId) -> Result<Option<Run>, StoreError> {
        Ok(self.load_versioned(id).await?.map(|(run, _)| run))
    }

    /// How much longer the run is kept: `None` for a run that does not expire (one not
    /// finished) or does not exist.
    pub async fn retained_for(&self, id: &RunId) -> Result<Option<Duration>, StoreError> {
        let left: i64 = redis::cmd("PTTL")
            .arg(self.keys.run_key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(u64::try_from(left).ok().map(Duration::from_millis))
    }

    /// The recorded decisions on the run's calls, by call id; empty if none (or no such run).
    pub async fn decisions(&self, id: &RunId) -> Result<HashMap<String, Decision>, StoreError> {
        let raw: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.keys.decisions_key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        read_decisions(raw)
    }

    /// [`Store::on_run_indexed`], changing nothing in the shard's indexes but the mark.
    async fn on_run<A: Argv>(
        &self,
        script: &Lua<A>,
        id: &RunId,
        args: &A,
        tail: impl Fn(&mut ScriptInvocation<'_>, &mut Chain) -> Result<(), StoreError>,
    ) -> Result<(String, String, Vec<Announcement>), StoreError> {
        self.on_run_indexed(script, id, &Indexes::default(), args, tail)
            .await
    }

    /// A script on one run: all its keys, the common arguments and `args`; `tail` adds what
    /// follows, with its audit entries linked through the [`Chain`]. The script marks the run
    /// in the outbox index and makes the changes `index` lists in its shard's indexes in the
    /// same step; under Cluster, where those are in another slot, a script of their own does
    /// that just before (and again if the run's script found that mark too old). Replies with
    /// the script's status and detail, and the announcements it queued.
    async fn on_run_indexed<A: Argv>(
        &self,
        script: &Lua<A>,
        id: &RunId,
        index: &Indexes,
        args: &A,
        tail: impl Fn(&mut ScriptInvocation<'_>, &mut Chain) -> Result<(), StoreError>,
    ) -> Result<(String, String, Vec<Announcement>), StoreError> {
        let audit_subject = self.names.audit_subject(id);
        let index = index.arg();
        let mut attempt = 0;
        loop {
            let (mark, index, shard_keys) = if self.conn.is_cluster() {
                // The shard's key names stand for nothing here: the run's own key, in its slot.
                (
                    self.mark(id, &index).await?,
                    "",
                    [(); 4].map(|_| self.keys.run_key(id)),
                )
            } else {
                (0, index.as_str(), self.keys.shard_keys(Shard::of(id)))
            };
            let common = script::OnRun {
                run_id: id.as_str(),
                audit_subject: &audit_subject,
                mark,
                index,
            };
            let mut invocation = script.invocation(Some(&common), args);
            for key in self.keys.run_keys(id).into_iter().chain(shard_keys) {
                invocation.key(key);
            }
            let mut chain = Chain {
                prev: self.heads.guess(id),
            };
            tail(&mut invocation, &mut chain)?;
            let reply: Vec<String> = match invocation.invoke_async(&mut self.conn.clone()).await {
                Err(e) if attempt < 3 && e.to_string().contains("STALE_MARK") => {
                    attempt += 1;
                    continue;
                }
                reply => reply?,
            };
            let [status, detail, rest @ ..] = reply.as_slice() else {
                return Err(StoreError::Corrupt(format!("script replied {reply:?}")));
            };
            let queued = match rest {
                [head, queued @ ..] => {
                    self.heads.saw(id, head);
                    queued
                }
                [] => &[],
            };
            return Ok((
                status.clone(),
                detail.clone(),
                Announcement::from_pairs(queued)?,
            ));
        }
    }

    /// The latest refused decisions on a run, newest first.
    pub async fn refusals(&self, id: &RunId) -> Result<Vec<serde_json::Value>, StoreError> {
        let raw: Vec<String> = redis::cmd("LRANGE")
            .arg(self.keys.refusals_key(id))
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn.clone())
            .await?;
        raw.iter().map(|r| from_json(r)).collect()
    }

    /// The stored elements of a run's audit trail, oldest first; `None` once the run is no
    /// longer retained (its trail expires with it).
    pub async fn audit_trail(
        &self,
        id: &RunId,
    ) -> Result<Option<Vec<serde_json::Value>>, StoreError> {
        let (retained, raw): (bool, Vec<String>) = redis::pipe()
            .cmd("EXISTS")
            .arg(self.keys.run_key(id))
            .cmd("LRANGE")
            .arg(self.keys.audit_key(id))
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn.clone())
            .await?;
        if !retained {
            return Ok(None);
        }
        raw.iter()
            .map(|r| from_json(r))
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

/// The links of a script's new audit entries, computed here from the head this process
/// last saw (see `append_audit` in `lua/prelude.lua`, which computes them itself only when
/// that guess is wrong).
pub(crate) struct Chain {
    prev: String,
}

impl Chain {
    /// One entry as `append_audit` reads it: canonical JSON, its SHA-256, the head the link
    /// was computed from, and the link.
    pub(crate) fn link(&mut self, entry: &AuditEntry) -> AuditLinked {
        let (entry, sha) = prepare(entry);
        let link = countersign_model::audit::link(&self.prev, &sha);
        let prev_guess = std::mem::replace(&mut self.prev, link.clone());
        AuditLinked {
            entry,
            sha,
            prev_guess,
            link,
        }
    }

    /// Entries as the prelude's `append_audits` reads them.
    fn args(&mut self, script: &mut ScriptInvocation<'_>, entries: &[AuditEntry]) {
        script.arg(entries.len());
        for entry in entries {
            self.link(entry).as_args().push(script);
        }
    }
}

/// An audit entry with its link, as the scripts take it.
pub(crate) struct AuditLinked {
    pub(crate) entry: String,
    pub(crate) sha: String,
    pub(crate) prev_guess: String,
    pub(crate) link: String,
}

impl AuditLinked {
    fn as_args(&self) -> script::AuditLink<'_> {
        script::AuditLink {
            entry: &self.entry,
            sha: &self.sha,
            prev_guess: &self.prev_guess,
            link: &self.link,
        }
    }
}

/// Redis's clock as last read, and when (on this process's monotonic clock) it was asked.
#[derive(Clone, Default)]
struct Clock(Arc<Mutex<Option<(Instant, i64)>>>);

impl Clock {
    /// How long a reading is carried forward before Redis is asked again.
    const FRESH: Duration = Duration::from_secs(1);

    fn now(&self) -> Option<i64> {
        let (asked, ms) = (*self.0.lock().expect("lock poisoned"))?;
        let since = asked.elapsed();
        (since < Self::FRESH).then(|| ms + since.as_millis() as i64)
    }

    fn read(&self, asked: Instant, ms: i64) {
        *self.0.lock().expect("lock poisoned") = Some((asked, ms));
    }
}

/// The last audit head this process saw per run, from its reads and its scripts' replies:
/// the start of the next links it computes. Bounded: past a size it starts again empty,
/// which costs only slower appends (Redis computes the links) until heads are seen again.
#[derive(Clone, Default)]
struct Heads(Arc<Mutex<HashMap<RunId, String>>>);

impl Heads {
    const MAX: usize = 100_000;

    fn guess(&self, id: &RunId) -> String {
        let heads = self.0.lock().expect("lock poisoned");
        heads.get(id).cloned().unwrap_or_default()
    }

    fn saw(&self, id: &RunId, head: &str) {
        let mut heads = self.0.lock().expect("lock poisoned");
        if heads.len() >= Self::MAX {
            heads.clear();
        }
        heads.insert(id.clone(), head.to_string());
    }
}

/// Announcements as the prelude's `outbox_args` reads them.
fn announce_args(script: &mut ScriptInvocation<'_>, announce: &[Announcement]) {
    script.arg(announce.len());
    for a in announce {
        script::Queued {
            msg_id: &a.msg_id,
            subject: &a.subject,
            payload: &a.payload,
        }
        .push(script);
    }
}

/// The run hash's status, document, version, cancellation and audit head.
type RunFields = (
    Option<String>,
    Option<Vec<u8>>,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn read_decisions(raw: HashMap<String, String>) -> Result<HashMap<String, Decision>, StoreError> {
    raw.into_iter()
        .map(|(k, v)| Ok((k, from_json(&v)?)))
        .collect()
}

/// The run from its stored document, with the status and cancellation the hash holds (the
/// scripts keep those, not the document).
fn read_run(status: &str, doc: &[u8], cancel: Option<&str>) -> Result<Run, StoreError> {
    let mut run = doc::decode(doc)?;
    run.status = RunStatus::parse(status)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown status {status:?}")))?;
    run.cancel = cancel.map(from_json).transpose()?;
    Ok(run)
}

/// An event's payload on NATS: its envelope as JSON.
fn event(event: Event) -> String {
    serde_json::to_string(&Envelope::new(event)).expect("events serialize")
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl GatewayStore {
    /// Stores a new queued run; false if a run with this id exists already.
    pub async fn create(&self, run: &Run) -> Result<bool, StoreError> {
        let doc = doc::encode(run)?;
        let args = script::Create {
            doc: &doc,
            requested_by: run.requested_by.as_deref().unwrap_or_default(),
            agent: &run.agent,
        };
        let created: i64 = script::CREATE
            .invocation(None, &args)
            .key(self.keys.run_key(&run.run_id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(created == 1)
    }

    /// Asks a run to stop (see `lua/cancel.lua`): marks it with `cancel`, audits the request
    /// and queues `nudge`, the message that brings a worker to finish it.
    pub async fn cancel(
        &self,
        id: &RunId,
        cancel: &countersign_model::run::Cancellation,
        audit: &AuditEntry,
        nudge: &Announcement,
    ) -> Result<CancelOutcome, StoreError> {
        let cancellation = to_json(cancel)?;
        let cancelled = event(Event::ApprovalCancelled {
            run_id: id.clone(),
            call_id: String::new(),
            cancelled_by: cancel.by.clone(),
            channels: Vec::new(),
        });
        let args = script::Cancel {
            cancellation: &cancellation,
            cancelled_subject: &self.names.approval_cancelled(id),
            cancelled_id_prefix: &msg_id::cancelled(id, ""),
            cancelled_event: &cancelled,
        };
        let (status, detail, queued) = self
            .on_run(&script::CANCEL, id, &args, |script, chain| {
                chain.args(script, std::slice::from_ref(audit));
                announce_args(script, std::slice::from_ref(nudge));
                Ok(())
            })
            .await?;
        let parsed = || {
            RunStatus::parse(&detail)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown status {detail:?}")))
        };
        Ok(match status.as_str() {
            "requested" => CancelOutcome::Requested(parsed()?, queued),
            "finished" => CancelOutcome::Finished(parsed()?),
            _ => CancelOutcome::NoRun,
        })
    }

    /// Appends an entry to the run's audit chain (and, through the outbox, the global log);
    /// nothing if the run is gone.
    pub async fn audit(&self, entry: &AuditEntry) -> Result<Vec<Announcement>, StoreError> {
        let (_, _, queued) = self
            .on_run(
                &script::AUDIT_APPEND,
                &entry.run_id,
                &NoArgs,
                |script, chain| {
                    chain.args(script, std::slice::from_ref(entry));
                    Ok(())
                },
            )
            .await?;
        Ok(queued)
    }
}

impl WorkerStore {
    /// Takes run `id` to drive it as `owner`, with a lease of `lease`, unless another worker's
    /// lease still holds it or there is nothing to drive (see [`Claim`]).
    pub async fn claim(
        &self,
        id: &RunId,
        owner: &str,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let args = script::Lease {
            owner,
            lease_ms: lease.as_millis() as i64,
        };
        // Bytes, not text: the run's document is binary (see `doc`).
        let reply: Vec<Vec<u8>> = script::CLAIM
            .invocation(None, &args)
            .key(self.keys.run_key(id))
            .key(self.keys.decisions_key(id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        let text = |i: usize| {
            let field = reply.get(i).map(Vec::as_slice).unwrap_or_default();
            std::str::from_utf8(field)
                .map_err(|_| StoreError::Corrupt(format!("claim replied non-text field {i}")))
        };
        let status = || {
            let status = text(1)?;
            RunStatus::parse(status)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown status {status:?}")))
        };
        Ok(match text(0)? {
            "claimed" if reply.len() >= 6 && reply.len().is_multiple_of(2) => {
                let (head, cancel) = (text(5)?, text(4)?);
                self.heads.saw(id, head);
                let run = read_run(text(1)?, &reply[3], (!cancel.is_empty()).then_some(cancel))?;
                let decisions = (6..reply.len())
                    .step_by(2)
                    .map(|i| Ok((text(i)?.to_string(), from_json(text(i + 1)?)?)))
                    .collect::<Result<_, StoreError>>()?;
                Claim::Claimed(Box::new(Claimed { run, decisions }))
            }
            "claimed" => return Err(StoreError::Corrupt("claim replied too few fields".into())),
            "busy" => Claim::Busy(Duration::from_millis(text(2)?.parse().unwrap_or(0))),
            "waiting" => Claim::Waiting,
            "finished" => Claim::Finished(status()?),
            _ => Claim::Missing,
        })
    }

    /// Extends the caller's lease; false if it no longer holds it.
    pub async fn renew(
        &self,
        id: &RunId,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.lease(id, owner, lease.as_millis() as i64).await
    }

    /// Gives the lease up so another worker can take the run at once (after a retryable error).
    pub async fn release(&self, id: &RunId, owner: &str) -> Result<bool, StoreError> {
        self.lease(id, owner, 0).await
    }

    async fn lease(&self, id: &RunId, owner: &str, lease_ms: i64) -> Result<bool, StoreError> {
        let ok: i64 = script::LEASE
            .invocation(None, &script::Lease { owner, lease_ms })
            .key(self.keys.run_key(id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(ok == 1)
    }

    /// Writes the run as the lease holder, with its [`Changes`], in one step. A pause is
    /// listed in the paused-runs index and its held calls' timers set in that step (under
    /// Cluster, in the step that marks its outbox just before: the inbox and the sweepers
    /// check each run's status, so a listing whose save failed shows and does nothing).
    pub async fn save(
        &self,
        run: &Run,
        owner: &str,
        lease: Duration,
        how: Save,
        changes: &Changes,
    ) -> Result<Vec<Announcement>, StoreError> {
        let Changes {
            audits,
            announce,
            index,
        } = changes;
        let paused;
        let index = match how {
            Save::Pause => {
                paused = index.clone().then(Indexes::paused(run));
                &paused
            }
            _ => index,
        };
        let held: Vec<(&str, String)> = match how {
            Save::Pause => run
                .held_calls()
                .map(|p| Ok((p.call_id.as_str(), to_json(&p.terms(run.turns))?)))
                .collect::<Result<_, StoreError>>()?,
            _ => Vec::new(),
        };
        let ttl = match how {
            Save::Finish { retention, .. } => retention.as_secs().max(1),
            _ => 0,
        };
        let (start_token, starts) = match &how {
            Save::Turn { token } => {
                let starts: Vec<&str> = run
                    .paused_turn
                    .iter()
                    .filter(|c| c.runs_now())
                    .map(|c| c.call_id.as_str())
                    .collect();
                (token.as_str(), starts.join(" "))
            }
            _ => ("", String::new()),
        };
        let doc = doc::encode(run)?;
        let args = script::Save {
            owner,
            lease_ms: lease.as_millis() as i64,
            status: how.status().as_str(),
            doc: &doc,
            ttl_secs: ttl,
            turn: run.turns,
            start_token,
            starts: &starts,
        };
        let (status, detail, queued) = self
            .on_run_indexed(&script::SAVE, &run.run_id, index, &args, |script, chain| {
                script.arg(held.len());
                for (call_id, terms) in &held {
                    script::HeldTerms { call_id, terms }.push(script);
                }
                chain.args(script, audits);
                announce_args(script, announce);
                Ok(())
            })
            .await?;
        match status.as_str() {
            "ok" => Ok(queued),
            "cancel" => Err(StoreError::Cancelled),
            _ => Err(StoreError::LostLease(detail)),
        }
    }

    /// Escalates a held call of a paused run unchanged since `version` and still undecided:
    /// its document and held call are rewritten, with the audit entry, the announcement and
    /// the call's new deadline (as the run holds it) in the sweepers' set. None if the run
    /// moved on meanwhile.
    pub async fn escalate(
        &self,
        run: &Run,
        version: &str,
        call_id: &str,
        held: &DecisionTerms,
        audit: &AuditEntry,
        announce: &Announcement,
    ) -> Result<Option<Vec<Announcement>>, StoreError> {
        let doc = doc::encode(run)?;
        let terms = to_json(held)?;
        let args = script::Escalate {
            version,
            call_id,
            doc: &doc,
            terms: &terms,
        };
        let index = run
            .held_calls()
            .find(|p| p.call_id == call_id)
            .map(|p| Indexes::deadline_moved(&run.run_id, p))
            .unwrap_or_default();
        let (status, _, queued) = self
            .on_run_indexed(
                &script::ESCALATE,
                &run.run_id,
                &index,
                &args,
                |script, chain| {
                    chain.args(script, std::slice::from_ref(audit));
                    announce_args(script, std::slice::from_ref(announce));
                    Ok(())
                },
            )
            .await?;
        Ok((status == "ok").then_some(queued))
    }

    /// Reminds once about a call still held undecided in the run's current turn: the audit
    /// entry and the announcement, or nothing if it moved on or was reminded already.
    pub async fn remind(
        &self,
        id: &RunId,
        call_id: &str,
        audit: &AuditEntry,
        announce: &Announcement,
    ) -> Result<Vec<Announcement>, StoreError> {
        let (_, _, queued) = self
            .on_run(
                &script::REMIND,
                id,
                &script::Remind { call_id },
                |script, chain| {
                    chain.args(script, std::slice::from_ref(audit));
                    announce_args(script, std::slice::from_ref(announce));
                    Ok(())
                },
            )
            .await?;
        Ok(queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_time_is_carried_forward_for_a_second_then_asked_again() {
        let clock = Clock::default();
        assert_eq!(clock.now(), None, "never read");
        clock.read(Instant::now(), 1_000_000);
        let now = clock.now().expect("fresh");
        assert!((1_000_000..1_000_000 + 1000).contains(&now), "{now}");
        let long_ago = Instant::now() - Clock::FRESH;
        clock.read(long_ago, 1_000_000);
        assert_eq!(clock.now(), None, "stale");
    }
}
