//! Run state in Redis. Every change of state is one Lua script (in `lua/`) that checks the
//! status, and the lease where a worker holds one, before it writes, so two gateways or two
//! workers can never both win.
//!
//! Layout, all keys of a run sharing the hash tag `{run_id}` so each script touches one slot:
//! - `run:{id}` hash: `status`, `version` (bumped by every write), `turn`, `pending_count` and
//!   `decided_count` of the held turn, `lease_owner`/`lease_until` of the worker driving it,
//!   and `doc`, the whole [`Run`] as JSON (its `status` field is overwritten on read by the
//!   hash's, which is the one scripts keep right);
//! - `calls:{id}` hash: call id -> `turn:digest` of every call ever held for a person;
//! - `decisions:{id}` hash: call id -> the recorded [`Decision`];
//! - `exec:{id}` hash: call id -> `started`, or the [`CallResult`] once it finished;
//! - `votes:{id}` hash: the approvals collected so far for calls that need several;
//! - `refs:{id}` hash: where each channel's message about a call is, to update it later;
//! - `audit:{id}` list: the run's hash-chained audit trail (see [`crate::audit`]).
//!
//! Finished runs get a retention TTL on all keys but the audit trail, which outlives them. The `awaiting` sorted set indexes
//! paused runs for the inbox; it lives in another slot, so it is kept outside the scripts and
//! readers re-check each run's status.

use crate::audit::{AuditEntry, chain};
use crate::names::Names;
use crate::now_ms;
use crate::run::{CallResult, Decision, Run, RunId, RunStatus};
use redis::Script;
use redis::aio::ConnectionManager;
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

static CREATE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/create.lua")));
static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/claim.lua")));
static LEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/lease.lua")));
static SAVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/save.lua")));
static DECIDE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/decide.lua")));
static AUDIT_APPEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/audit_append.lua")));
static REPLACE_DOC: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/replace_doc.lua")));
static TAKE_TOKEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/take_token.lua")));
static EXEC_BEGIN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/exec_begin.lua")));

/// Attempts to append to a contended audit chain before giving up.
const AUDIT_RETRIES: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// Another worker took the run over (our lease lapsed) or it left the driving states.
    #[error("this worker no longer holds the run (status now {0:?})")]
    LostLease(String),
}

/// What a claim attempt found.
#[derive(Debug, PartialEq)]
pub enum Claim {
    /// The caller now drives the run, in this status.
    Claimed(RunStatus),
    /// Another worker holds a lease for this long yet.
    Busy(Duration),
    /// Paused with calls still undecided.
    Waiting,
    /// Completed, failed or cancelled.
    Finished(RunStatus),
    Missing,
}

/// The answer to recording a decision.
#[derive(Debug, PartialEq)]
pub enum DecideOutcome {
    Recorded {
        all_decided: bool,
    },
    /// One more approval of a call that needs several; this many so far.
    Vote {
        approvals: u32,
    },
    /// The same decision was recorded before: nothing changed.
    Duplicate(Box<Decision>),
    /// This person's approval of a call that needs several was counted before.
    DuplicateVote,
    /// A different decision was recorded first and stands.
    Conflict(Box<Decision>),
    NoRun,
    NoCall,
    NotWaiting(String),
    StaleDigest {
        current: String,
    },
}

/// What the execution record says about an approved call about to run.
#[derive(Debug, PartialEq)]
pub enum ExecBegin {
    /// First attempt: marked started, run it now.
    Run,
    /// An earlier attempt started and never recorded a result.
    InterruptedBefore,
    /// An earlier attempt finished with this result.
    Done(CallResult),
}

/// The timers kept per held call.
#[derive(Clone, Copy, Debug)]
pub enum Timer {
    Deadline,
    Reminder,
}

/// A timer that is due.
#[derive(Debug, Clone)]
pub struct DueTimer {
    pub member: String,
    pub run_id: RunId,
    pub call_id: String,
    pub digest: String,
}

/// How a saved run goes on.
pub enum Save<'a> {
    /// Still being driven (a checkpoint between turns).
    Progress,
    /// Paused: these (call id, digest) pairs wait for a person.
    Pause(&'a [(String, String)]),
    /// Completed or failed: keep it this long, then let Redis drop it.
    Finish { retention: Duration },
}

#[derive(Clone)]
pub struct Store {
    conn: ConnectionManager,
    names: Names,
}

impl Store {
    /// Connects, set to fail fast while Redis is away: one quick retry of a lost connection,
    /// not the default six with growing pauses (about 9 s), so a request gets its 503 within
    /// about a second; whoever called retries later (a client, or JetStream's redelivery),
    /// and each command tries to reconnect again.
    pub async fn connect(url: &str, names: Names) -> Result<Self, StoreError> {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_secs(1)))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(100))
            .set_max_delay(Duration::from_millis(100));
        let conn = redis::Client::open(url)?
            .get_connection_manager_with_config(config)
            .await?;
        Ok(Self { conn, names })
    }

    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Checks the connection for readiness probes.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Stores a new queued run; false if a run with this id exists already.
    pub async fn create(&self, run: &Run) -> Result<bool, StoreError> {
        let created: i64 = CREATE
            .key(self.names.run_key(&run.run_id))
            .arg(to_json(run)?)
            .arg(now_ms())
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(created == 1)
    }

    /// The run with its authoritative status, if it exists.
    pub async fn load(&self, id: &RunId) -> Result<Option<Run>, StoreError> {
        let (status, doc): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.names.run_key(id))
            .arg("status")
            .arg("doc")
            .query_async(&mut self.conn.clone())
            .await?;
        let (Some(status), Some(doc)) = (status, doc) else {
            return Ok(None);
        };
        let mut run: Run = from_json(&doc)?;
        run.status = RunStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown status {status:?}")))?;
        Ok(Some(run))
    }

    pub async fn decisions(&self, id: &RunId) -> Result<HashMap<String, Decision>, StoreError> {
        let raw: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.names.decisions_key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        raw.into_iter()
            .map(|(k, v)| Ok((k, from_json(&v)?)))
            .collect()
    }

    pub async fn claim(
        &self,
        id: &RunId,
        owner: &str,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let reply: Vec<String> = CLAIM
            .key(self.names.run_key(id))
            .arg(owner)
            .arg(now_ms())
            .arg(lease.as_millis() as i64)
            .invoke_async(&mut self.conn.clone())
            .await?;
        let status = || {
            RunStatus::parse(&reply[1])
                .ok_or_else(|| StoreError::Corrupt(format!("unknown status {:?}", reply[1])))
        };
        Ok(match reply[0].as_str() {
            "claimed" => Claim::Claimed(status()?),
            "busy" => Claim::Busy(Duration::from_millis(reply[2].parse().unwrap_or(0))),
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
        let ok: i64 = LEASE
            .key(self.names.run_key(id))
            .arg(owner)
            .arg(now_ms())
            .arg(lease_ms)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(ok == 1)
    }

    /// Writes the run as the lease holder. The run's `status` must match `how`.
    pub async fn save(
        &self,
        run: &Run,
        owner: &str,
        lease: Duration,
        how: Save<'_>,
    ) -> Result<(), StoreError> {
        let id = &run.run_id;
        let mut script = SAVE.prepare_invoke();
        script
            .key(self.names.run_key(id))
            .key(self.names.calls_key(id))
            .key(self.names.decisions_key(id))
            .key(self.names.exec_key(id))
            .key(self.names.votes_key(id))
            .key(self.names.refs_key(id))
            .arg(owner)
            .arg(now_ms())
            .arg(lease.as_millis() as i64)
            .arg(run.status.as_str())
            .arg(to_json(run)?);
        match how {
            Save::Progress => {
                script.arg(0).arg(0).arg(0);
            }
            Save::Finish { retention } => {
                script.arg(retention.as_secs().max(1)).arg(0).arg(0);
            }
            Save::Pause(calls) => {
                script.arg(0).arg(run.turns).arg(calls.len());
                for (call_id, digest) in calls {
                    script.arg(call_id).arg(format!("{}:{digest}", run.turns));
                }
            }
        }
        let reply: Vec<String> = script.invoke_async(&mut self.conn.clone()).await?;
        if reply[0] == "ok" {
            Ok(())
        } else {
            Err(StoreError::LostLease(reply[1].clone()))
        }
    }

    /// Records a decision atomically: first decision per call wins. With a `quorum` above 1
    /// an approval counts once per principal until the quorum is met.
    pub async fn decide(
        &self,
        id: &RunId,
        decision: &Decision,
        quorum: u32,
    ) -> Result<DecideOutcome, StoreError> {
        let action = serde_json::to_value(decision.action)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let reply: Vec<String> = DECIDE
            .key(self.names.run_key(id))
            .key(self.names.calls_key(id))
            .key(self.names.decisions_key(id))
            .key(self.names.votes_key(id))
            .arg(&decision.call_id)
            .arg(&decision.digest)
            .arg(to_json(decision)?)
            .arg(&decision.fingerprint)
            .arg(&decision.decided_by)
            .arg(quorum)
            .arg(action.as_str().unwrap_or_default())
            .invoke_async(&mut self.conn.clone())
            .await?;
        let [kind, detail] = <[String; 2]>::try_from(reply)
            .map_err(|r| StoreError::Corrupt(format!("decide replied {r:?}")))?;
        Ok(match kind.as_str() {
            "recorded" => DecideOutcome::Recorded {
                all_decided: detail == "1",
            },
            "vote" => DecideOutcome::Vote {
                approvals: detail.parse().unwrap_or(0),
            },
            "duplicate_vote" => DecideOutcome::DuplicateVote,
            "duplicate" => DecideOutcome::Duplicate(Box::new(from_json(&detail)?)),
            "conflict" => DecideOutcome::Conflict(Box::new(from_json(&detail)?)),
            "no_run" => DecideOutcome::NoRun,
            "no_call" => DecideOutcome::NoCall,
            "not_waiting" => DecideOutcome::NotWaiting(detail),
            "stale_digest" => DecideOutcome::StaleDigest { current: detail },
            other => return Err(StoreError::Corrupt(format!("decide replied {other:?}"))),
        })
    }

    /// Appends an entry to the run's hash chain, then the same element to the global log.
    /// The global log is not one chain (every writer of the deployment would contend for
    /// its head); each of its elements carries its run chain's `prev` and `hash`, so an edit
    /// there shows too.
    pub async fn audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        let element = self
            .append_chained(&self.names.audit_key(&entry.run_id), entry)
            .await?;
        let _: i64 = redis::cmd("RPUSH")
            .arg(self.names.global_audit_key())
            .arg(element)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Appends with compare-and-set on the chain's head (a writer that lost a race retries
    /// on the head it was shown); returns the stored element.
    async fn append_chained(&self, key: &str, entry: &AuditEntry) -> Result<String, StoreError> {
        let mut prev = String::new();
        for _ in 0..AUDIT_RETRIES {
            let element = chain(&prev, entry).to_string();
            let reply: Vec<String> = AUDIT_APPEND
                .key(key)
                .arg(&prev)
                .arg(&element)
                .invoke_async(&mut self.conn.clone())
                .await?;
            if reply[0] == "1" {
                return Ok(element);
            }
            prev = reply[1].clone();
        }
        Err(StoreError::Corrupt(format!(
            "audit chain {key} kept moving"
        )))
    }

    /// Remembers where a channel's message about a call is.
    pub async fn set_channel_ref(
        &self,
        id: &RunId,
        call_id: &str,
        channel: &str,
        reference: &str,
    ) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("HSET")
            .arg(self.names.refs_key(id))
            .arg(format!("{call_id}|{channel}"))
            .arg(reference)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    pub async fn channel_ref(
        &self,
        id: &RunId,
        call_id: &str,
        channel: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(redis::cmd("HGET")
            .arg(self.names.refs_key(id))
            .arg(format!("{call_id}|{channel}"))
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Stores what a single-use link token may do, under the token's hash, for `ttl`.
    pub async fn put_link_token(
        &self,
        token_hash: &str,
        grant: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let _: () = redis::cmd("SET")
            .arg(self.names.link_token_key(token_hash))
            .arg(grant)
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// What a link token may do, without using it up.
    pub async fn peek_link_token(&self, token_hash: &str) -> Result<Option<String>, StoreError> {
        Ok(redis::cmd("GET")
            .arg(self.names.link_token_key(token_hash))
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Uses a link token up: one caller gets it, with the time it had left.
    pub async fn take_link_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<(String, Duration)>, StoreError> {
        let reply: Vec<String> = TAKE_TOKEN
            .key(self.names.link_token_key(token_hash))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(match reply.as_slice() {
            [grant, ttl] => Some((
                grant.clone(),
                Duration::from_millis(ttl.parse::<u64>().unwrap_or(1)),
            )),
            _ => None,
        })
    }

    /// The stored elements of a run's audit trail, oldest first.
    pub async fn audit_trail(&self, id: &RunId) -> Result<Vec<serde_json::Value>, StoreError> {
        let raw: Vec<String> = redis::cmd("LRANGE")
            .arg(self.names.audit_key(id))
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn.clone())
            .await?;
        raw.iter().map(|r| from_json(r)).collect()
    }

    /// Marks an approved call as started, or says what an earlier attempt left.
    pub async fn exec_begin(&self, id: &RunId, call_id: &str) -> Result<ExecBegin, StoreError> {
        let reply: Vec<String> = EXEC_BEGIN
            .key(self.names.exec_key(id))
            .arg(call_id)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(match reply[0].as_str() {
            "run" => ExecBegin::Run,
            "started" => ExecBegin::InterruptedBefore,
            _ => ExecBegin::Done(from_json(&reply[1])?),
        })
    }

    /// Records the result of a call marked started.
    pub async fn exec_finish(
        &self,
        id: &RunId,
        call_id: &str,
        result: &CallResult,
    ) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("HSET")
            .arg(self.names.exec_key(id))
            .arg(call_id)
            .arg(to_json(result)?)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Binds an idempotency key to a run id unless it is bound already; returns the run it
    /// was bound to before, if any.
    pub async fn bind_idempotency_key(
        &self,
        key_digest: &str,
        run: &RunId,
        ttl: Duration,
    ) -> Result<Option<RunId>, StoreError> {
        let previous: Option<String> = redis::cmd("SET")
            .arg(self.names.idempotency_key(key_digest))
            .arg(run.as_str())
            .arg("NX")
            .arg("GET")
            .arg("EX")
            .arg(ttl.as_secs().max(1))
            .query_async(&mut self.conn.clone())
            .await?;
        previous
            .map(|p| RunId::parse(&p).ok_or_else(|| StoreError::Corrupt(format!("run id {p:?}"))))
            .transpose()
    }

    /// Adds or removes a run in the index of paused runs.
    pub async fn index_awaiting(&self, id: &RunId, awaiting: bool) -> Result<(), StoreError> {
        let mut cmd = if awaiting {
            let mut c = redis::cmd("ZADD");
            c.arg(self.names.awaiting_key()).arg(now_ms());
            c
        } else {
            let mut c = redis::cmd("ZREM");
            c.arg(self.names.awaiting_key());
            c
        };
        let _: i64 = cmd
            .arg(id.as_str())
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Puts held calls' timers where the sweepers look. Idempotent: a member already there
    /// gets the new time.
    pub async fn schedule(
        &self,
        timer: Timer,
        id: &RunId,
        calls: &[(&str, &str, i64)],
    ) -> Result<(), StoreError> {
        if calls.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(self.timer_key(timer));
        for (call_id, digest, at) in calls {
            cmd.arg(*at).arg(format!("{id}|{call_id}|{digest}"));
        }
        let _: i64 = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Timers that are due, oldest first, at most `limit`. Only the due front of the set is
    /// read, however many calls wait.
    pub async fn due(
        &self,
        timer: Timer,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<DueTimer>, StoreError> {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.timer_key(timer))
            .arg("-inf")
            .arg(now_ms)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(members
            .into_iter()
            .filter_map(|member| {
                let mut parts = member.splitn(3, '|');
                let run_id = RunId::parse(parts.next()?)?;
                let call_id = parts.next()?.to_string();
                let digest = parts.next()?.to_string();
                Some(DueTimer {
                    member,
                    run_id,
                    call_id,
                    digest,
                })
            })
            .collect())
    }

    /// Removes a handled timer; true for the one caller that removed it.
    pub async fn drop_timer(&self, timer: Timer, member: &str) -> Result<bool, StoreError> {
        let removed: i64 = redis::cmd("ZREM")
            .arg(self.timer_key(timer))
            .arg(member)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(removed == 1)
    }

    fn timer_key(&self, timer: Timer) -> String {
        match timer {
            Timer::Deadline => self.names.deadlines_key(),
            Timer::Reminder => self.names.reminders_key(),
        }
    }

    /// The run with the version it was read at, for [`Store::replace_paused`].
    pub async fn load_versioned(&self, id: &RunId) -> Result<Option<(Run, String)>, StoreError> {
        let (status, doc, version): (Option<String>, Option<String>, Option<String>) =
            redis::cmd("HMGET")
                .arg(self.names.run_key(id))
                .arg("status")
                .arg("doc")
                .arg("version")
                .query_async(&mut self.conn.clone())
                .await?;
        let (Some(status), Some(doc), Some(version)) = (status, doc, version) else {
            return Ok(None);
        };
        let mut run: Run = from_json(&doc)?;
        run.status = RunStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown status {status:?}")))?;
        Ok(Some((run, version)))
    }

    /// Rewrites a paused run if it is unchanged since `version` and `call_id` is undecided.
    pub async fn replace_paused(
        &self,
        run: &Run,
        version: &str,
        call_id: &str,
    ) -> Result<bool, StoreError> {
        let replaced: i64 = REPLACE_DOC
            .key(self.names.run_key(&run.run_id))
            .key(self.names.decisions_key(&run.run_id))
            .arg(version)
            .arg(call_id)
            .arg(to_json(run)?)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(replaced == 1)
    }

    /// At most `limit` runs of the paused index strictly after `after` (from the start when
    /// `None`), oldest first, runs that paused in the same millisecond in order of id, as
    /// Redis keeps them. Only that slice is read, however many runs wait. Some may have moved
    /// on since: re-check them.
    pub async fn awaiting(
        &self,
        after: Option<&Awaiting>,
        limit: usize,
    ) -> Result<Vec<Awaiting>, StoreError> {
        let key = self.names.awaiting_key();
        let mut page = Vec::new();
        let mut min = "-inf".to_string();
        if let Some(after) = after {
            // Runs that paused in the cursor's millisecond: the few after it by id come first.
            let tied: Vec<String> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(after.since_ms)
                .arg(after.since_ms)
                .arg("BYSCORE")
                .query_async(&mut self.conn.clone())
                .await?;
            page.extend(
                tied.iter()
                    .filter(|id| id.as_str() > after.run_id.as_str())
                    .filter_map(|id| RunId::parse(id))
                    .take(limit)
                    .map(|run_id| Awaiting {
                        run_id,
                        since_ms: after.since_ms,
                    }),
            );
            min = format!("({}", after.since_ms);
        }
        if page.len() < limit {
            let rest: Vec<String> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(min)
                .arg("+inf")
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(0)
                .arg(limit - page.len())
                .arg("WITHSCORES")
                .query_async(&mut self.conn.clone())
                .await?;
            for pair in rest.chunks_exact(2) {
                let since_ms = pair[1]
                    .parse::<f64>()
                    .map_err(|_| StoreError::Corrupt(format!("awaiting score {:?}", pair[1])))?;
                if let Some(run_id) = RunId::parse(&pair[0]) {
                    page.push(Awaiting {
                        run_id,
                        since_ms: since_ms as i64,
                    });
                }
            }
        }
        Ok(page)
    }
}

/// A run's place in the index of paused runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Awaiting {
    pub run_id: RunId,
    /// When it paused (ms since the epoch): its score in the index.
    pub since_ms: i64,
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}
