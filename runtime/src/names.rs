//! Subject, stream, consumer and key names. A namespace prefixes all of them so several
//! deployments (and parallel tests) can share one NATS and one Redis.

use countersign_model::run::RunId;

/// Names for one deployment. An empty namespace gives the documented names as they are
/// (`runs.start`, stream `RUNS`, keys `cs:run:{id}`).
#[derive(Clone, Debug)]
pub struct Names {
    namespace: String,
}

/// countersign's two services, as far as what they announce on NATS goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    Gateway,
    Worker,
}

/// Error for a namespace that cannot be part of a subject, stream name or key.
#[derive(Debug, thiserror::Error)]
#[error("namespace {0:?} may hold only ASCII letters, digits, '-' and '_'")]
pub struct BadNamespace(String);

impl Names {
    pub fn new(namespace: &str) -> Result<Self, BadNamespace> {
        let ok = namespace
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok {
            return Err(BadNamespace(namespace.to_string()));
        }
        Ok(Self {
            namespace: namespace.to_string(),
        })
    }

    fn subject(&self, rest: &str) -> String {
        if self.namespace.is_empty() {
            rest.to_string()
        } else {
            format!("{}.{rest}", self.namespace)
        }
    }

    fn upper(&self, name: &str) -> String {
        if self.namespace.is_empty() {
            name.to_string()
        } else {
            format!("{}_{name}", self.namespace)
        }
    }

    /// The one service that announces on `subject` (a subject of this namespace), or `None`
    /// for those both do (`approval.expired.*`, `audit.*`). `deploy/nats-server.conf` lets
    /// each service's NATS user publish only its own and the shared ones.
    pub fn announcer(&self, subject: &str) -> Option<Service> {
        let prefix = self.subject("");
        let rest = subject.strip_prefix(prefix.as_str()).unwrap_or(subject);
        let starts = |prefixes: &[&str]| prefixes.iter().any(|p| rest.starts_with(p));
        if rest == "runs.start" || starts(&["approval.decided.", "approval.cancelled.", "deliver."])
        {
            Some(Service::Gateway)
        } else if starts(&["approval.requested.", "approval.reminder.", "run."]) {
            Some(Service::Worker)
        } else {
            None
        }
    }

    /// Work queue subject for new runs.
    pub fn runs_start(&self) -> String {
        self.subject("runs.start")
    }
    pub fn approval_requested(&self, run: &RunId) -> String {
        self.subject(&format!("approval.requested.{run}"))
    }
    pub fn approval_decided(&self, run: &RunId) -> String {
        self.subject(&format!("approval.decided.{run}"))
    }
    pub fn approval_reminder(&self, run: &RunId) -> String {
        self.subject(&format!("approval.reminder.{run}"))
    }
    pub fn approval_expired(&self, run: &RunId) -> String {
        self.subject(&format!("approval.expired.{run}"))
    }
    pub fn approval_cancelled(&self, run: &RunId) -> String {
        self.subject(&format!("approval.cancelled.{run}"))
    }
    pub fn run_cancelled(&self, run: &RunId) -> String {
        self.subject(&format!("run.cancelled.{run}"))
    }
    pub fn approval_decided_all(&self) -> String {
        self.subject("approval.decided.*")
    }
    pub fn approval_all(&self) -> String {
        self.subject("approval.>")
    }
    pub fn run_completed(&self, run: &RunId) -> String {
        self.subject(&format!("run.completed.{run}"))
    }
    pub fn run_attention(&self, run: &RunId) -> String {
        self.subject(&format!("run.attention.{run}"))
    }
    pub fn run_failed(&self, run: &RunId) -> String {
        self.subject(&format!("run.failed.{run}"))
    }
    pub fn run_events_all(&self) -> String {
        self.subject("run.>")
    }
    /// The global audit log: every element of every run's chain, on the `AUDIT` stream.
    pub fn audit_subject(&self, run: &RunId) -> String {
        self.subject(&format!("audit.{run}"))
    }
    pub fn audit_all(&self) -> String {
        self.subject("audit.>")
    }

    /// Work queue subject for one notification to one channel target
    /// (`deliver.webhook.ops`); `target` must be a subject token.
    pub fn deliver(&self, kind: &str, target: &str) -> String {
        self.subject(&format!("deliver.{kind}.{target}"))
    }
    pub fn deliver_all(&self) -> String {
        self.subject("deliver.>")
    }

    /// Every stream of the deployment.
    pub fn streams(&self) -> [String; 5] {
        [
            self.runs_stream(),
            self.approvals_stream(),
            self.deliveries_stream(),
            self.run_events_stream(),
            self.audit_stream(),
        ]
    }

    pub fn runs_stream(&self) -> String {
        self.upper("RUNS")
    }
    pub fn approvals_stream(&self) -> String {
        self.upper("APPROVALS")
    }
    pub fn run_events_stream(&self) -> String {
        self.upper("RUN_EVENTS")
    }
    pub fn deliveries_stream(&self) -> String {
        self.upper("DELIVERIES")
    }
    pub fn audit_stream(&self) -> String {
        self.upper("AUDIT")
    }
    /// The durable consumer gateways share to turn approval events into deliveries.
    pub fn notifier_consumer(&self) -> String {
        self.upper("gateway-notifier")
    }
    /// The durable consumer gateways share to deliver notifications.
    pub fn deliverer_consumer(&self) -> String {
        self.upper("gateway-deliverer")
    }
    /// The durable consumer all workers share for `runs.start`.
    pub fn start_consumer(&self) -> String {
        self.upper("workers-start")
    }
    /// The durable consumer all workers share for `approval.decided.*`.
    pub fn decided_consumer(&self) -> String {
        self.upper("workers-decided")
    }

    fn key(&self, rest: &str) -> String {
        if self.namespace.is_empty() {
            format!("cs:{rest}")
        } else {
            format!("cs:{}:{rest}", self.namespace)
        }
    }
    /// Hash: status, version, turn, counters, lease and the run document.
    pub fn run_key(&self, run: &RunId) -> String {
        self.key(&format!("run:{{{run}}}"))
    }
    /// Hash: call id -> the [`countersign_model::run::HeldCall`] (JSON) of every call held for a person.
    pub fn calls_key(&self, run: &RunId) -> String {
        self.key(&format!("calls:{{{run}}}"))
    }
    /// Hash: call id -> the recorded decision (JSON).
    pub fn decisions_key(&self, run: &RunId) -> String {
        self.key(&format!("decisions:{{{run}}}"))
    }
    /// Hash: `call_id|principal` -> one approval of a call that needs several, and
    /// `call_id#` -> how many there are. No call id holds `|` or `#` (see
    /// [`countersign_model::run::Run::calls_asked`]), so one call's fields never read as another's.
    pub fn votes_key(&self, run: &RunId) -> String {
        self.key(&format!("votes:{{{run}}}"))
    }
    /// Hash: `call_id|channel` -> where the channel's message about the call is (for Slack,
    /// `channel_id|ts`), so it can be updated once the call is decided.
    pub fn refs_key(&self, run: &RunId) -> String {
        self.key(&format!("refs:{{{run}}}"))
    }
    /// List: the run's hash-chained audit trail. It has no TTL: it outlives the run.
    pub fn audit_key(&self, run: &RunId) -> String {
        self.key(&format!("audit:{{{run}}}"))
    }
    /// Hash: message id -> `subject\npayload` of what the run's scripts announced and
    /// JetStream has not yet acknowledged (see [`crate::outbox`]).
    pub fn outbox_key(&self, run: &RunId) -> String {
        self.key(&format!("outbox:{{{run}}}"))
    }
    /// List: the latest refused decisions on the run, newest first, capped.
    pub fn refusals_key(&self, run: &RunId) -> String {
        self.key(&format!("refusals:{{{run}}}"))
    }
    /// Sorted set of run ids scored by when a script last wrote (or was about to write) to
    /// their outbox: where the outbox sweepers look. One per index shard.
    pub fn outbox_index_key(&self, shard: Shard) -> String {
        self.shard_key("outbox", shard)
    }
    /// Every key a run's scripts take, in the order the scripts expect (see
    /// `lua/prelude.lua`).
    pub fn run_keys(&self, run: &RunId) -> [String; 9] {
        [
            self.run_key(run),
            self.calls_key(run),
            self.decisions_key(run),
            self.votes_key(run),
            self.refs_key(run),
            self.exec_key(run),
            self.audit_key(run),
            self.outbox_key(run),
            self.refusals_key(run),
        ]
    }
    /// Hash: call id -> "started" or the recorded result (JSON) of an executed call.
    pub fn exec_key(&self, run: &RunId) -> String {
        self.key(&format!("exec:{{{run}}}"))
    }
    /// String: the body hash a signed request's `webhook-id` came with, per sender.
    pub fn webhook_id_key(&self, sender: &str, webhook_id: &str) -> String {
        let id = countersign_model::digest::sha256_hex(format!("{sender}\n{webhook_id}"));
        self.key(&format!("webhook-id:{id}"))
    }
    /// Sorted set: the principals who have a call's page open, scored by when their page
    /// last asked (ms); it expires soon after the last one leaves.
    pub fn presence_key(&self, run: &RunId, call_id: &str) -> String {
        self.key(&format!("presence:{{{run}}}:{call_id}"))
    }
    /// String: the run an idempotency key started.
    pub fn idempotency_key(&self, digest: &str) -> String {
        self.key(&format!("idem:{digest}"))
    }
    /// String: what a single-use link token (email approvals) may do, by the token's hash;
    /// in the run's slot, so the decision script spends it.
    pub fn link_token_key(&self, run: &RunId, token_hash: &str) -> String {
        self.key(&format!("link:{{{run}}}:{token_hash}"))
    }
    /// String: a reviewer's web session (JSON), by the SHA-256 of its cookie, so the store
    /// never holds a usable cookie; it expires.
    pub fn session_key(&self, cookie_hash: &str) -> String {
        self.key(&format!("session:{cookie_hash}"))
    }
    /// Set: the cookie hashes of a principal's sessions (by the SHA-256 of the principal),
    /// so an admin can end them all; it lasts as long as their newest session.
    pub fn sessions_of_key(&self, principal: &str) -> String {
        self.key(&format!(
            "sessions-of:{}",
            countersign_model::digest::sha256_hex(principal)
        ))
    }
    /// String: whom a one-time sign-in link signs in, by the SHA-256 of its token; the first
    /// use deletes it, and it expires.
    pub fn sign_in_token_key(&self, token_hash: &str) -> String {
        self.key(&format!("sign-in:{token_hash}"))
    }
    /// String: present while a sign-in link mailed to an address is recent, so the form
    /// cannot be used to flood a mailbox; by the SHA-256 of the address.
    pub fn sign_in_throttle_key(&self, address_hash: &str) -> String {
        self.key(&format!("sign-in-mailed:{address_hash}"))
    }
    /// Sorted set of `run_id|call_id|digest` scored by deadline (ms): what the sweepers look
    /// at, only the due front of it each time. One per index shard.
    pub fn deadlines_key(&self, shard: Shard) -> String {
        self.shard_key("deadlines", shard)
    }
    /// Sorted set of `run_id|call_id|digest` scored by when to remind. One per index shard.
    pub fn reminders_key(&self, shard: Shard) -> String {
        self.shard_key("reminders", shard)
    }
    /// Sorted set of runs awaiting approval, scored by when they paused: the inbox index.
    /// One per index shard.
    pub fn awaiting_key(&self, shard: Shard) -> String {
        self.shard_key("awaiting", shard)
    }
    /// String: the worker that sweeps a shard's timers, for a short lease.
    pub fn sweep_lease_key(&self, shard: Shard) -> String {
        self.shard_key("sweeper", shard)
    }
    /// A shard's keys share the hash tag `{shard-NN}`, so a script may take several of them
    /// (the sweep lease and a timer set) under Redis Cluster.
    fn shard_key(&self, index: &str, shard: Shard) -> String {
        self.key(&format!("{index}:{{shard-{:02}}}", shard.0))
    }
}

/// The `Nats-Msg-Id` of each fact: the same fact always gets the same id, so JetStream stores a
/// repeated publish of it once. (An audit element's id, `audit:{run}:{hash}`, is made by the
/// scripts' prelude, which computes the hash.)
pub mod msg_id {
    use countersign_model::run::RunId;

    pub fn start(run: &RunId) -> String {
        format!("start:{run}")
    }
    /// The job that brings a worker to finish a cancelled run.
    pub fn cancel(run: &RunId) -> String {
        format!("cancel:{run}")
    }
    pub fn requested(run: &RunId, turn: u32) -> String {
        format!("requested:{run}:{turn}")
    }
    pub fn decided(run: &RunId, call: &str) -> String {
        format!("decided:{run}:{call}")
    }
    pub fn expired(run: &RunId, call: &str) -> String {
        format!("expired:{run}:{call}")
    }
    pub fn reminder(run: &RunId, call: &str, escalated: bool) -> String {
        let kind = if escalated { "escalated" } else { "reminder" };
        format!("{kind}:{run}:{call}")
    }
    pub fn cancelled(run: &RunId, call: &str) -> String {
        format!("cancelled:{run}:{call}")
    }
    /// A call's outcome lost in a crash, or (no call) a run whose state cannot be read.
    pub fn attention(run: &RunId, call: Option<&str>) -> String {
        match call {
            Some(call) => format!("attention:{run}:{call}"),
            None => format!("attention:{run}"),
        }
    }
    /// A run's end: completed, failed or cancelled (one of them, once).
    pub fn end(run: &RunId) -> String {
        format!("end:{run}")
    }
}

/// One of the [`Shard::COUNT`] parts the deployment-wide indexes (deadlines, reminders,
/// paused runs, outbox marks) are split into, so that no single Redis key (one slot, one
/// Cluster node) takes a write for every run. A run's shard follows from its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shard(u8);

impl Shard {
    /// Fixed: changing it would leave entries in shards nobody reads.
    pub const COUNT: u8 = 16;

    pub fn of(run: &RunId) -> Self {
        // FNV-1a: stable across processes and versions, unlike the std hasher.
        let hash = run.as_str().bytes().fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        Self((hash % u32::from(Self::COUNT)) as u8)
    }

    pub fn all() -> impl Iterator<Item = Self> {
        (0..Self::COUNT).map(Self)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_subject_has_the_service_that_announces_it() {
        let run = RunId::parse("run_1").unwrap();
        for namespace in ["", "t1"] {
            let n = Names::new(namespace).unwrap();
            for (subject, announcer) in [
                (n.runs_start(), Some(Service::Gateway)),
                (n.approval_decided(&run), Some(Service::Gateway)),
                (n.approval_requested(&run), Some(Service::Worker)),
                (n.approval_reminder(&run), Some(Service::Worker)),
                (n.approval_cancelled(&run), Some(Service::Gateway)),
                (n.run_completed(&run), Some(Service::Worker)),
                (n.run_cancelled(&run), Some(Service::Worker)),
                (n.approval_expired(&run), None),
            ] {
                assert_eq!(n.announcer(&subject), announcer, "{subject}");
            }
        }
    }

    use super::*;

    #[test]
    fn empty_namespace_gives_the_documented_names() {
        let n = Names::new("").unwrap();
        let run = RunId::parse("run_1").unwrap();
        assert_eq!(n.runs_start(), "runs.start");
        assert_eq!(n.approval_decided(&run), "approval.decided.run_1");
        assert_eq!(n.runs_stream(), "RUNS");
        assert_eq!(n.run_key(&run), "cs:run:{run_1}");
    }

    #[test]
    fn a_namespace_prefixes_subjects_streams_and_keys() {
        let n = Names::new("t1").unwrap();
        let run = RunId::parse("run_1").unwrap();
        assert_eq!(n.runs_start(), "t1.runs.start");
        assert_eq!(n.approvals_stream(), "t1_APPROVALS");
        assert_eq!(n.decisions_key(&run), "cs:t1:decisions:{run_1}");
    }

    #[test]
    fn a_namespace_with_a_dot_is_refused() {
        assert!(Names::new("a.b").is_err());
    }
}
