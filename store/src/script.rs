//! The Lua scripts and what each is given, described once. A script's KEYS and ARGV are
//! named by Rust: the [`argv!`] types push their fields in order, and the header put before
//! every script, generated from the same names, declares each as a Lua local. So a caller
//! cannot put one argument in another's place (the script's type takes only its own
//! arguments), and a script reads `owner`, not `ARGV[4]`.
//!
//! A script on a run is given the run's keys ([`RUN_KEYS`], all in its slot, also listed as
//! `run_keys`), its shard's ([`SHARD_KEYS`]), then the arguments every such script shares
//! ([`OnRun`]), then its own, then its variable tail (audit entries and announcements, read
//! by the prelude from `tail`).

use redis::{Script, ScriptInvocation};
use std::fmt::Write;
use std::marker::PhantomData;
use std::sync::LazyLock;

/// A script's arguments, in ARGV order.
pub(crate) trait Argv {
    /// The Lua name of each field, in the order [`Argv::push`] adds them.
    const NAMES: &'static [&'static str];
    fn push(&self, invocation: &mut ScriptInvocation<'_>);
}

/// Declares a struct of script arguments: its fields, in order, are the ARGV the script sees
/// under the same names.
macro_rules! argv {
    (
        $(#[$doc:meta])*
        $vis:vis struct $name:ident $(<$lt:lifetime>)? {
            $($(#[$field_doc:meta])* $field:ident: $ty:ty),* $(,)?
        }
    ) => {
        $(#[$doc])*
        $vis struct $name $(<$lt>)? {
            $($(#[$field_doc])* pub(crate) $field: $ty),*
        }

        impl $(<$lt>)? $crate::script::Argv for $name $(<$lt>)? {
            const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];
            fn push(&self, invocation: &mut redis::ScriptInvocation<'_>) {
                // Borrowed text and numbers: copying them is free.
                $(invocation.arg(self.$field.clone());)*
            }
        }
    };
}

/// The keys of a run's shard's indexes, in the order [`crate::keys::Keys::shard_keys`] gives
/// them: a script on a run takes them after the run's, on one server (see `lua/shard.lua`).
pub(crate) const SHARD_KEYS: [&str; 4] = [
    "outbox_index_key",
    "awaiting_key",
    "deadlines_key",
    "reminders_key",
];

/// The keys of a run, in the order [`crate::keys::Keys::run_keys`] gives them.
pub(crate) const RUN_KEYS: [&str; 9] = [
    "run_key",
    "calls_key",
    "decisions_key",
    "votes_key",
    "refs_key",
    "exec_key",
    "audit_key",
    "outbox_key",
    "refusals_key",
];

argv! {
    /// What every script on a run is given first.
    pub(crate) struct OnRun<'a> {
        run_id: &'a str,
        /// The subject of the global audit log for this run.
        audit_subject: &'a str,
        /// When the run was marked in the outbox index (ms, Redis's clock), or 0: the script
        /// marks it itself, with the shard's keys it is given.
        mark: i64,
        /// What the step changes in the shard's indexes (see `lua/shard.lua`), when the script
        /// marks the run itself; '' otherwise.
        index: &'a str,
    }
}

argv! {
    /// One audit entry as the prelude's `append_audit` takes it: its canonical JSON, that
    /// text's SHA-256, the head its link was computed from, and the link.
    pub(crate) struct AuditLink<'a> {
        entry: &'a str,
        sha: &'a str,
        prev_guess: &'a str,
        link: &'a str,
    }
}

argv! {
    /// One message for the outbox.
    pub(crate) struct Queued<'a> {
        msg_id: &'a str,
        subject: &'a str,
        payload: &'a str,
    }
}

/// A script whose KEYS are `keys` and whose own ARGV are `A`'s (after [`OnRun`]'s when it is
/// a script on a run).
pub(crate) struct Lua<A> {
    script: Script,
    // Covariant, so a script typed with `'static` arguments takes borrowed ones.
    args: PhantomData<A>,
}

impl<A: Argv> Lua<A> {
    /// A script on one run: the run's keys, its shard's, then `extra_keys` (which a caller
    /// may leave out: they are `nil` then); [`OnRun`], then `A`. It has the whole prelude: the
    /// audit chain, the outbox, the shard's indexes and the tail's readers.
    pub(crate) fn on_run(extra_keys: &[&str], body: &str) -> Self {
        let keys: Vec<&str> = RUN_KEYS
            .iter()
            .chain(&SHARD_KEYS)
            .chain(extra_keys)
            .copied()
            .collect();
        let argv: Vec<&str> = OnRun::NAMES.iter().chain(A::NAMES).copied().collect();
        let mut header = Self::header(&keys, &argv);
        let _ = writeln!(header, "local run_keys = {{{}}}", RUN_KEYS.join(", "));
        group::<AuditLink>(&mut header, "audit_link");
        group::<Queued>(&mut header, "queued");
        group::<HeldTerms>(&mut header, "held_terms");
        group::<Proposed>(&mut header, "proposed");
        header.push_str(include_str!("lua/shard.lua"));
        header.push_str(include_str!("lua/prelude.lua"));
        Self::new(header, body)
    }

    /// A script given `keys` and `A` alone, with nothing before it but Redis's clock and
    /// `in_chunks`: the scripts that run most often pay for nothing they do not use.
    pub(crate) fn plain(keys: &[&str], body: &str) -> Self {
        Self::new(Self::header(keys, A::NAMES), body)
    }

    /// A script on a run's shard's indexes alone (see `lua/shard.lua`).
    pub(crate) fn marking(keys: &[&str], body: &str) -> Self {
        let mut header = Self::header(keys, A::NAMES);
        header.push_str(include_str!("lua/shard.lua"));
        Self::new(header, body)
    }

    /// Names for the keys and arguments, and where a tail would start.
    fn header(keys: &[&str], argv: &[&str]) -> String {
        let mut header = String::new();
        declare(&mut header, keys, "KEYS", 1);
        declare(&mut header, argv, "ARGV", 1);
        let _ = writeln!(header, "local tail = {}", argv.len() + 1);
        header.push_str(include_str!("lua/clock.lua"));
        header.push_str(include_str!("lua/chunks.lua"));
        header
    }

    fn new(header: String, body: &str) -> Self {
        Self {
            script: Script::new(&format!("{header}\n{body}")),
            args: PhantomData,
        }
    }

    /// An invocation with `args` (after [`OnRun`]'s, for a script on a run: `common`); the
    /// caller adds the keys and the tail.
    pub(crate) fn invocation(&self, common: Option<&OnRun<'_>>, args: &A) -> ScriptInvocation<'_> {
        let mut invocation = self.script.prepare_invoke();
        if let Some(common) = common {
            common.push(&mut invocation);
        }
        args.push(&mut invocation);
        invocation
    }
}

/// `local a, b = KEYS[1], KEYS[2]`, counting from `from`.
fn declare(header: &mut String, names: &[&str], table: &str, from: usize) {
    if names.is_empty() {
        return;
    }
    let places: Vec<String> = (0..names.len())
        .map(|i| format!("{table}[{}]", from + i))
        .collect();
    let _ = writeln!(header, "local {} = {}", names.join(", "), places.join(", "));
}

/// `local function read_NAME(p)`: the group of `G`'s fields at ARGV `p`, as a table, and the
/// index after it.
fn group<G: Argv>(header: &mut String, name: &str) {
    let fields: Vec<String> = G::NAMES
        .iter()
        .enumerate()
        .map(|(i, field)| format!("{field} = ARGV[p + {i}]"))
        .collect();
    let _ = writeln!(
        header,
        "local function read_{name}(p) return {{{}}}, p + {} end",
        fields.join(", "),
        G::NAMES.len()
    );
}

/// Every script, with its keys and arguments. `lua/prelude.lua` comes before each.
macro_rules! scripts {
    ($($(#[$doc:meta])* $name:ident: $args:ty = $make:ident($keys:expr, $file:literal);)*) => {
        $(
            $(#[$doc])*
            pub(crate) static $name: LazyLock<Lua<$args>> =
                LazyLock::new(|| Lua::$make($keys, include_str!(concat!("lua/", $file))));
        )*
    };
}

scripts! {
    OUTBOX_MARK: Mark<'static> = marking(&SHARD_KEYS, "outbox_mark.lua");
    OUTBOX_DUE: OutboxDue = plain(&["outbox_index_key"], "outbox_due.lua");
    OUTBOX_TAKE: Marked<'static> = plain(&["outbox_index_key"], "outbox_take.lua");
    OUTBOX_DROP: Marked<'static> = plain(&["outbox_index_key"], "outbox_drop.lua");
    TIMERS_DUE: TimersDue<'static> =
        plain(&["lease_key", "reminders_key", "deadlines_key"], "timers_due.lua");
    CREATE: Create<'static> = plain(&["run_key"], "create.lua");
    CLAIM: Lease<'static> = plain(&["run_key", "decisions_key"], "claim.lua");
    LEASE: Lease<'static> = plain(&["run_key"], "lease.lua");
    EXEC_BEGIN: ExecBegin<'static> = plain(&["run_key", "exec_key"], "exec_begin.lua");
    SAVE: Save<'static> = on_run(&[], "save.lua");
    AUDIT_APPEND: NoArgs = on_run(&[], "audit_append.lua");
    ESCALATE: Escalate<'static> = on_run(&[], "escalate.lua");
    REMIND: Remind<'static> = on_run(&[], "remind.lua");
    CANCEL: Cancel<'static> = on_run(&[], "cancel.lua");
    AGENT_EXEC: AgentExec<'static> = on_run(&[], "agent_exec.lua");
    GRANT_CREATE: GrantCreate<'static> = plain(
        &["grant_key", "uses_key", "grants_key", "for_key"], "grant_create.lua");
    GRANT_USE: GrantUse<'static> = plain(&["grant_key", "uses_key"], "grant_use.lua");
    GRANT_RELEASE: GrantRelease<'static> = plain(&["grant_key", "uses_key"], "grant_release.lua");
    GRANT_REVOKE: GrantRevoke<'static> = plain(&["grant_key"], "grant_revoke.lua");
    DELEGATION_CREATE: DelegationCreate<'static> =
        plain(&["delegation_key", "delegations_key"], "delegation_create.lua");
    DELEGATION_USE: GrantUse<'static> =
        plain(&["delegation_key", "uses_key"], "delegation_use.lua");
    DELEGATION_RELEASE: GrantRelease<'static> =
        plain(&["delegation_key", "uses_key"], "delegation_release.lua");
    DELEGATION_END: DelegationEnd<'static> = plain(&["delegation_key"], "delegation_end.lua");
    WINDOW_ADD: WindowAdd<'static> = plain(&["entries_key", "amounts_key"], "window_add.lua");
    WINDOW_REMOVE: WindowMember<'static> =
        plain(&["entries_key", "amounts_key"], "window_remove.lua");
    /// The one place a decision becomes true; `link_key` is the email link used, if any.
    DECIDE: Decide<'static> = on_run(&["link_key"], "decide.lua");
}

argv! {
    /// A run to mark in its shard's outbox index, and what else the step changes there (see
    /// `lua/shard.lua`).
    pub(crate) struct Mark<'a> {
        run: &'a str,
        index: &'a str,
    }
}

argv! {
    pub(crate) struct OutboxDue {
        grace_ms: i64,
        limit: usize,
    }
}

argv! {
    /// A run and the mark it is expected to have.
    pub(crate) struct Marked<'a> {
        run: &'a str,
        mark: i64,
    }
}

argv! {
    pub(crate) struct TimersDue<'a> {
        /// The worker that sweeps the shard.
        sweeper: &'a str,
        lease_ms: u64,
        limit: usize,
    }
}

argv! {
    pub(crate) struct Create<'a> {
        doc: &'a [u8],
        requested_by: &'a str,
        /// Kept beside the document for the decision script, which checks a grant's agent.
        agent: &'a str,
    }
}

argv! {
    /// A claim, a renewal, or a release (`lease_ms` 0).
    pub(crate) struct Lease<'a> {
        owner: &'a str,
        lease_ms: i64,
    }
}

argv! {
    pub(crate) struct ExecBegin<'a> {
        /// The worker that must hold the run's lease.
        owner: &'a str,
        call_id: &'a str,
        /// The attempt's own mark.
        token: &'a str,
    }
}

argv! {
    /// Tail: the [`HeldTerms`] of a pause, the audit entries, the announcements.
    pub(crate) struct Save<'a> {
        owner: &'a str,
        lease_ms: i64,
        status: &'a str,
        doc: &'a [u8],
        /// 0 unless the run finished: then it is kept this long.
        ttl_secs: u64,
        turn: u32,
        /// The attempt that marks `starts` started ('' for none).
        start_token: &'a str,
        /// The ids of the calls to mark started, separated by spaces (call ids hold none).
        starts: &'a str,
    }
}

argv! {
    /// One call a pause holds, with the terms its decisions are checked against (JSON).
    pub(crate) struct HeldTerms<'a> {
        call_id: &'a str,
        terms: &'a str,
    }
}

argv! {
    /// Tail: the audit entry and the announcement.
    pub(crate) struct Escalate<'a> {
        /// The run's version when the caller read it.
        version: &'a str,
        call_id: &'a str,
        doc: &'a [u8],
        terms: &'a str,
    }
}

argv! {
    /// Tail: the audit entry and the announcement.
    pub(crate) struct Remind<'a> {
        call_id: &'a str,
    }
}

argv! {
    /// A step of the execution record of a call released to an external agent. Tail: its
    /// audit entry.
    pub(crate) struct AgentExec<'a> {
        start_field: &'a str,
        end_field: &'a str,
        attempt: &'a str,
        /// `started` or `ended`.
        phase: &'a str,
        record: &'a str,
    }
}

argv! {
    /// Tail: the audit entry and the nudge.
    pub(crate) struct Cancel<'a> {
        cancellation: &'a str,
        cancelled_subject: &'a str,
        /// The message id of a call's `approval.cancelled`, but the call id.
        cancelled_id_prefix: &'a str,
        /// A held call's `approval.cancelled`, but its call id and channels.
        cancelled_event: &'a str,
    }
}

argv! {
    /// Tail: the count of decisions, then each as [`Proposed`].
    pub(crate) struct Decide<'a> {
        principal: &'a str,
        door: &'a str,
        /// Who decides, when it is not a person: `deadline` or `policy`.
        by: &'a str,
        /// The principal's role decides (the gateway's configuration knows roles).
        role_decides: bool,
        /// The gateway signs receipts.
        receipts: bool,
        decided_subject: &'a str,
        expired_subject: &'a str,
        /// What the email link used must still grant; empty without one.
        grant: &'a str,
        /// The standing grant deciding (JSON); empty when a person decides.
        under_grant: &'a str,
        /// The delegation a person decides under (JSON, `from` and `to`); empty if none.
        delegated: &'a str,
    }
}

argv! {
    /// One decision of a request.
    pub(crate) struct Proposed<'a> {
        call_id: &'a str,
        digest: &'a str,
        action: &'a str,
        /// The decision as recorded (JSON).
        json: &'a str,
        fingerprint: &'a str,
        /// The digest its edit was checked against; empty if none.
        checked: &'a str,
        /// Who its receipt names, sorted, joined with ", "; empty without one.
        receipt_for: &'a str,
        entry: &'a str,
        sha: &'a str,
        prev_guess: &'a str,
        link: &'a str,
        decided_id: &'a str,
        expired_id: &'a str,
        /// Its `approval.decided`, but what the script alone knows: whether the turn is all
        /// decided, everyone a quorum's decision names, and the channels.
        decided_event: &'a str,
        /// Its `approval.expired`, should the deadline decide, but the deadline and channels.
        expired_event: &'a str,
    }
}

argv! {
    pub(crate) struct GrantCreate<'a> {
        id: &'a str,
        /// The grant (JSON); the script sets `created_at` and `expires_at` on Redis's clock.
        def: &'a str,
        expires_in_ms: u64,
        /// How long an ended grant is kept to be listed.
        keep_ms: u64,
    }
}

argv! {
    pub(crate) struct GrantUse<'a> {
        /// `run_id|call_id`.
        use_key: &'a str,
        /// The [`countersign_model::grant::GrantUse`] (JSON), `at` set by the script.
        use_json: &'a str,
    }
}

argv! {
    pub(crate) struct DelegationCreate<'a> {
        id: &'a str,
        /// The delegation (JSON); the script sets `created_at` and `ends_at` on Redis's clock.
        def: &'a str,
        lasts_ms: u64,
        /// How long an ended delegation is kept to be listed.
        keep_ms: u64,
    }
}

argv! {
    pub(crate) struct DelegationEnd<'a> {
        /// The [`countersign_model::delegation::Ended`] (JSON), `at` set by the script.
        ending: &'a str,
    }
}

argv! {
    /// One call's share of a window.
    pub(crate) struct WindowAdd<'a> {
        /// `run_id|call_id`.
        member: &'a str,
        amount: &'a str,
        over_ms: i64,
    }
}

argv! {
    pub(crate) struct WindowMember<'a> {
        /// `run_id|call_id`.
        member: &'a str,
    }
}

argv! {
    pub(crate) struct GrantRelease<'a> {
        use_key: &'a str,
    }
}

argv! {
    pub(crate) struct GrantRevoke<'a> {
        /// The [`countersign_model::grant::Revocation`] (JSON), `at` set by the script.
        revocation: &'a str,
    }
}

/// Scripts that take no arguments of their own.
pub(crate) struct NoArgs;

impl Argv for NoArgs {
    const NAMES: &'static [&'static str] = &[];
    fn push(&self, _: &mut ScriptInvocation<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    argv! {
        struct Two<'a> {
            owner: &'a str,
            lease_ms: i64,
        }
    }

    #[test]
    fn the_header_names_each_key_and_argument_where_the_caller_puts_it() {
        let mut header = String::new();
        declare(&mut header, &RUN_KEYS[..2], "KEYS", 1);
        declare(&mut header, Two::NAMES, "ARGV", 4);
        group::<Queued>(&mut header, "queued");
        assert_eq!(
            header,
            "local run_key, calls_key = KEYS[1], KEYS[2]\n\
             local owner, lease_ms = ARGV[4], ARGV[5]\n\
             local function read_queued(p) return {msg_id = ARGV[p + 0], \
             subject = ARGV[p + 1], payload = ARGV[p + 2]}, p + 3 end\n"
        );
    }
}
