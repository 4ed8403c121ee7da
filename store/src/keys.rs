//! The Redis keys of one deployment. A namespace (the same as the NATS names', see
//! `countersign_runtime::names`) prefixes them so deployments and parallel tests can share
//! one Redis. Every key of a run carries the hash tag `{run_id}`, so each script touches
//! one Cluster slot; the deployment-wide indexes are split into [`Shard`]s.

use countersign_model::run::RunId;
use countersign_runtime::names::Names;

/// Key names for one deployment: `cs:{rest}`, or `cs:{namespace}:{rest}`.
#[derive(Clone, Debug)]
pub struct Keys {
    namespace: String,
}

impl Keys {
    /// The keys of the deployment `names` belong to (its namespace already checked).
    pub fn of(names: &Names) -> Self {
        Self {
            namespace: names.namespace().to_string(),
        }
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
    /// Hash: call id -> the [`countersign_model::run::DecisionTerms`] (JSON) of every call held for a person.
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
    /// List: the run's hash-chained audit trail, expiring with the run; the `AUDIT` stream
    /// keeps it longer.
    pub fn audit_key(&self, run: &RunId) -> String {
        self.key(&format!("audit:{{{run}}}"))
    }
    /// Hash: message id -> `subject\npayload` of what the run's scripts announced and
    /// JetStream has not yet acknowledged (see [`crate::relay`]).
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
    /// The indexes of a shard a step on one of its runs changes, in the order the scripts
    /// expect (`SHARD_KEYS` in `script.rs`).
    pub fn shard_keys(&self, shard: Shard) -> [String; 4] {
        [
            self.outbox_index_key(shard),
            self.awaiting_key(shard),
            self.deadlines_key(shard),
            self.reminders_key(shard),
        ]
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
    /// Hash of a standing grant: `def` (the grant as made, JSON), `uses`, and `revoked`
    /// (JSON) once revoked. Every grant key shares the hash tag `{grants}`, so a use, a
    /// revocation and the count are one script on one Cluster slot.
    pub fn grant_key(&self, id: &str) -> String {
        self.key(&format!("grant:{{grants}}:{id}"))
    }
    /// Hash: `run_id|call_id` -> the [`countersign_model::grant::GrantUse`] (JSON) of each
    /// call a grant approved.
    pub fn grant_uses_key(&self, id: &str) -> String {
        self.key(&format!("grant-uses:{{grants}}:{id}"))
    }
    /// Sorted set of every grant id kept, scored by when it was made.
    pub fn grants_key(&self) -> String {
        self.key("grants:{grants}")
    }
    /// Sorted set of the grant ids on one agent's tool, scored by when each expires: where a
    /// held call's grants are looked up.
    pub fn grants_for_key(&self, agent: &str, tool: &str) -> String {
        let id = countersign_model::digest::sha256_hex(format!("{agent}\n{tool}"));
        self.key(&format!("grants-for:{{grants}}:{}", &id[..32]))
    }
    /// Hash: a delegation's `def` (JSON) and, once ended early, `ended` (JSON). Every
    /// delegation key shares the hash tag `{delegations}`, so a use and an end are atomic
    /// against each other.
    pub fn delegation_key(&self, id: &str) -> String {
        self.key(&format!("delegation:{{delegations}}:{id}"))
    }
    /// Hash: `run_id|call_id` -> the decision a delegation was used for (JSON).
    pub fn delegation_uses_key(&self, id: &str) -> String {
        self.key(&format!("delegation-uses:{{delegations}}:{id}"))
    }
    /// Sorted set of every delegation id kept, scored by when it was made.
    pub fn delegations_key(&self) -> String {
        self.key("delegations:{delegations}")
    }
    /// Sorted set of the calls counted in one window and key (`Share::id`), scored by when
    /// each was counted (ms); with [`Keys::window_amounts_key`], in the window's own slot.
    pub fn window_entries_key(&self, id: &str) -> String {
        self.key(&format!("window:{{w:{id}}}"))
    }
    /// Hash: each counted call's amount in one window and key.
    pub fn window_amounts_key(&self, id: &str) -> String {
        self.key(&format!("window-amounts:{{w:{id}}}"))
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
    /// String: the principal an MCP proxy session was opened by, by the SHA-256 of its
    /// `Mcp-Session-Id`, so every gateway answers the session to that principal alone; it
    /// expires unless used.
    pub fn mcp_session_key(&self, session_hash: &str) -> String {
        self.key(&format!("mcp-session:{session_hash}"))
    }
    /// String: set once the MCP client of task `run` answered the elicitation that points its
    /// user at call `call`'s page in the inbox, so the task does not ask again; it expires.
    pub fn mcp_elicited_key(&self, run: &str, call: &str) -> String {
        self.key(&format!("mcp-elicited:{run}:{call}"))
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
    /// String: the worker that checks the calls waiting under an agent's earlier versions
    /// once it loaded version `version`.
    pub fn recheck_key(&self, agent: &str, version: &str) -> String {
        self.key(&format!("recheck:{agent}:{version}"))
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

/// One of the [`Shard::COUNT`] parts the deployment-wide indexes (deadlines, reminders,
/// paused runs, outbox marks) are split into, so that no single Redis key (one slot, one
/// Cluster node) takes a write for every run. A run's shard follows from its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shard(u8);

impl Shard {
    /// Fixed: changing it would leave entries in shards nobody reads.
    pub const COUNT: u8 = 16;

    /// The shard of run `run`, from its id (FNV-1a).
    pub fn of(run: &RunId) -> Self {
        // FNV-1a: stable across processes and versions, unlike the std hasher.
        let hash = run.as_str().bytes().fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        Self((hash % u32::from(Self::COUNT)) as u8)
    }

    /// Every shard, in order.
    pub fn all() -> impl Iterator<Item = Self> {
        (0..Self::COUNT).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_prefixes_keys_and_a_runs_keys_share_its_tag() {
        let run = RunId::parse("run_1").unwrap();
        let plain = Keys::of(&Names::new("").unwrap());
        assert_eq!(plain.run_key(&run), "cs:run:{run_1}");
        let spaced = Keys::of(&Names::new("t1").unwrap());
        assert_eq!(spaced.decisions_key(&run), "cs:t1:decisions:{run_1}");
        assert!(spaced.run_keys(&run).iter().all(|k| k.ends_with("{run_1}")));
    }

    #[test]
    fn a_runs_keys_come_in_the_order_the_scripts_name_them() {
        let run = RunId::parse("run_1").unwrap();
        let keys = Keys::of(&Names::new("t1").unwrap()).run_keys(&run);
        for (name, key) in crate::script::RUN_KEYS.iter().zip(keys) {
            let stem = name.strip_suffix("_key").unwrap();
            assert_eq!(key, format!("cs:t1:{stem}:{{run_1}}"));
        }
    }
}
