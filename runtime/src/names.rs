//! Subject, stream, consumer and message-id names on NATS. A namespace prefixes all of them
//! (and the Redis keys, see the store's `keys`) so several deployments (and parallel tests)
//! can share one NATS and one Redis.

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
    /// The approval gateway.
    Gateway,
    /// The agent worker.
    Worker,
}

/// Error for a namespace that cannot be part of a subject, stream name or key.
#[derive(Debug, thiserror::Error)]
#[error("namespace {0:?} may hold only ASCII letters, digits, '-' and '_'")]
pub struct BadNamespace(String);

impl Names {
    /// The names of `namespace`; refused unless it holds only ASCII letters, digits, '-' and
    /// '_' (empty is fine).
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

    /// The prefix every name of the deployment carries; empty for the documented names.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn subject(&self, rest: &str) -> String {
        if self.namespace.is_empty() {
            rest.to_string()
        } else {
            format!("{}.{rest}", self.namespace)
        }
    }

    /// A subject of this namespace without the namespace's prefix.
    fn unprefixed<'a>(&self, subject: &'a str) -> &'a str {
        match self.namespace.is_empty() {
            true => subject,
            false => subject
                .strip_prefix(self.namespace.as_str())
                .and_then(|rest| rest.strip_prefix('.'))
                .unwrap_or(subject),
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
    /// for those both do: `approval.decided.*` (a person's decision through a gateway, an
    /// expiry or a call closed by a policy change through a worker), `approval.expired.*`,
    /// `audit.*`. `deploy/nats-server.conf` lets each service's NATS user publish only its
    /// own and the shared ones.
    pub fn announcer(&self, subject: &str) -> Option<Service> {
        let rest = self.unprefixed(subject);
        let starts = |prefixes: &[&str]| prefixes.iter().any(|p| rest.starts_with(p));
        if rest == "runs.start" || starts(&["approval.cancelled.", "deliver."]) {
            Some(Service::Gateway)
        } else if starts(&["approval.requested.", "approval.reminder.", "run."]) {
            Some(Service::Worker)
        } else {
            None
        }
    }

    /// What kind of message `subject` (of this namespace) carries, for metrics: the subject
    /// without the namespace and the run's id (`approval.decided`, `run.completed`,
    /// `audit`, `live`, `deliver.webhook`, `runs.start`).
    pub fn kind<'a>(&self, subject: &'a str) -> &'a str {
        let rest = self.unprefixed(subject);
        if rest == "runs.start" {
            return rest;
        }
        match rest.rsplit_once('.') {
            Some((kind, _)) => kind,
            None => rest,
        }
    }

    /// Work queue subject for new runs.
    pub fn runs_start(&self) -> String {
        self.subject("runs.start")
    }
    /// Where the worker announces that a run paused on held calls.
    pub fn approval_requested(&self, run: &RunId) -> String {
        self.subject(&format!("approval.requested.{run}"))
    }
    /// Where a decision on one of the run's held calls is announced.
    pub fn approval_decided(&self, run: &RunId) -> String {
        self.subject(&format!("approval.decided.{run}"))
    }
    /// Where the worker announces a reminder or an escalation of one of the run's held calls.
    pub fn approval_reminder(&self, run: &RunId) -> String {
        self.subject(&format!("approval.reminder.{run}"))
    }
    /// Where the expiry of one of the run's held calls is announced.
    pub fn approval_expired(&self, run: &RunId) -> String {
        self.subject(&format!("approval.expired.{run}"))
    }
    /// Where the gateway announces the run's held calls closed by its cancel.
    pub fn approval_cancelled(&self, run: &RunId) -> String {
        self.subject(&format!("approval.cancelled.{run}"))
    }
    /// Where the run's end by cancel is announced.
    pub fn run_cancelled(&self, run: &RunId) -> String {
        self.subject(&format!("run.cancelled.{run}"))
    }
    /// Every run's decisions, which workers consume to resume runs.
    pub fn approval_decided_all(&self) -> String {
        self.subject("approval.decided.*")
    }
    /// Every `approval.*` announcement, the subjects of the `APPROVALS` stream.
    pub fn approval_all(&self) -> String {
        self.subject("approval.>")
    }
    /// Where the run's completion is announced.
    pub fn run_completed(&self, run: &RunId) -> String {
        self.subject(&format!("run.completed.{run}"))
    }
    /// Where a run that needs a person's look is announced.
    pub fn run_attention(&self, run: &RunId) -> String {
        self.subject(&format!("run.attention.{run}"))
    }
    /// Where a re-check of one of the run's calls after a policy change is announced.
    pub fn run_policy_changed(&self, run: &RunId) -> String {
        self.subject(&format!("run.policy_changed.{run}"))
    }
    /// Where a shadow policy's disagreement on one of the run's calls is announced.
    pub fn run_policy_shadow(&self, run: &RunId) -> String {
        self.subject(&format!("run.policy_shadow.{run}"))
    }
    /// Where the run's failure is announced.
    pub fn run_failed(&self, run: &RunId) -> String {
        self.subject(&format!("run.failed.{run}"))
    }
    /// Every `run.*` event of one run (completed, failed, cancelled, attention).
    pub fn run_events(&self, run: &RunId) -> String {
        self.subject(&format!("run.*.{run}"))
    }
    /// Every run's `run.*` events, the subjects of the `RUN_EVENTS` stream.
    pub fn run_events_all(&self) -> String {
        self.subject("run.>")
    }
    /// The global audit log: every element of every run's chain, on the `AUDIT` stream.
    pub fn audit_subject(&self, run: &RunId) -> String {
        self.subject(&format!("audit.{run}"))
    }
    /// What precedes the run's id in [`Names::audit_subject`].
    pub fn audit_subject_prefix(&self) -> String {
        self.subject("audit.")
    }
    /// The whole audit log, the subjects of the `AUDIT` stream.
    pub fn audit_all(&self) -> String {
        self.subject("audit.>")
    }

    /// One run's live events (the model's text as it comes, its tool calls and results, and
    /// a copy of each announcement about the run), on the `LIVE` stream.
    pub fn live_subject(&self, run: &RunId) -> String {
        self.subject(&format!("live.{run}"))
    }
    /// Every run's live events, the subjects of the `LIVE` stream.
    pub fn live_all(&self) -> String {
        self.subject("live.*")
    }
    /// Where the live copy of an announcement on `subject` goes: the announcements about a
    /// run (`approval.*.<run>`, `run.*.<run>`), not the audit elements, jobs or deliveries,
    /// nor a shadow policy's findings (for operators, not for whoever follows the run).
    pub fn live_copy(&self, subject: &str) -> Option<String> {
        let (kind, run) = self.unprefixed(subject).rsplit_once('.')?;
        let about_a_run = (kind.starts_with("approval.") || kind.starts_with("run."))
            && kind != "run.policy_shadow";
        (about_a_run && !run.is_empty()).then(|| self.subject(&format!("live.{run}")))
    }

    /// Work queue subject for one delivery to one channel target (`deliver.webhook.ops`);
    /// `target` must be a subject token.
    pub fn delivery(&self, kind: &str, target: &str) -> String {
        self.subject(&format!("deliver.{kind}.{target}"))
    }
    /// Every delivery, the subjects of the `DELIVERIES` stream.
    pub fn delivery_all(&self) -> String {
        self.subject("deliver.>")
    }

    /// Every stream of the deployment.
    pub fn streams(&self) -> [String; 6] {
        [
            self.runs_stream(),
            self.approvals_stream(),
            self.deliveries_stream(),
            self.run_events_stream(),
            self.audit_stream(),
            self.live_stream(),
        ]
    }

    /// The work-queue stream of `runs.start` jobs (`RUNS`).
    pub fn runs_stream(&self) -> String {
        self.upper("RUNS")
    }
    /// The stream of every `approval.*` announcement (`APPROVALS`), kept for a while.
    pub fn approvals_stream(&self) -> String {
        self.upper("APPROVALS")
    }
    /// The stream of every `run.*` event (`RUN_EVENTS`), kept for a while.
    pub fn run_events_stream(&self) -> String {
        self.upper("RUN_EVENTS")
    }
    /// The work-queue stream of deliveries to channels (`DELIVERIES`).
    pub fn deliveries_stream(&self) -> String {
        self.upper("DELIVERIES")
    }
    /// The stream of the audit log (`AUDIT`), bounded in age and size.
    pub fn audit_stream(&self) -> String {
        self.upper("AUDIT")
    }
    /// The stream of runs' live events (`LIVE`), bounded in age and size.
    pub fn live_stream(&self) -> String {
        self.upper("LIVE")
    }
    /// The durable consumer gateways share to fan approval events out into deliveries.
    pub fn fan_out_consumer(&self) -> String {
        self.upper("gateway-notifier")
    }
    /// The durable consumer gateways share to send deliveries to their channels.
    pub fn deliveries_consumer(&self) -> String {
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
}

/// The `Nats-Msg-Id` of each fact: the same fact always gets the same id, so JetStream stores a
/// repeated publish of it once. (An audit element's id, `audit:{run}:{hash}`, is made by the
/// scripts' prelude, which computes the hash.)
pub mod msg_id {
    use countersign_model::run::RunId;

    /// The job that starts a run.
    pub fn start(run: &RunId) -> String {
        format!("start:{run}")
    }
    /// The job that brings a worker to finish a cancelled run.
    pub fn cancel(run: &RunId) -> String {
        format!("cancel:{run}")
    }
    /// The pause of a run in turn `turn`.
    pub fn requested(run: &RunId, turn: u32) -> String {
        format!("requested:{run}:{turn}")
    }
    /// The pause of a turn whose call `call` is held again after a policy change.
    pub fn requested_again(run: &RunId, call: &str) -> String {
        format!("requested:{run}:{call}")
    }
    /// The re-check of call `call` after a policy change.
    pub fn policy_changed(run: &RunId, call: &str) -> String {
        format!("policy_changed:{run}:{call}")
    }
    /// A shadow policy's finding on call `call`.
    pub fn policy_shadow(run: &RunId, call: &str) -> String {
        format!("policy_shadow:{run}:{call}")
    }
    /// The decision on call `call`.
    pub fn decided(run: &RunId, call: &str) -> String {
        format!("decided:{run}:{call}")
    }
    /// The expiry of call `call`.
    pub fn expired(run: &RunId, call: &str) -> String {
        format!("expired:{run}:{call}")
    }
    /// A reminder about call `call`, or (`escalated`) its escalation.
    pub fn reminder(run: &RunId, call: &str, escalated: bool) -> String {
        let kind = if escalated { "escalated" } else { "reminder" };
        format!("{kind}:{run}:{call}")
    }
    /// The close of call `call` by its run's cancel.
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

#[cfg(test)]
mod tests {
    #[test]
    fn each_subject_has_the_service_that_announces_it() {
        let run = RunId::parse("run_1").unwrap();
        for namespace in ["", "t1"] {
            let n = Names::new(namespace).unwrap();
            for (subject, announcer) in [
                (n.runs_start(), Some(Service::Gateway)),
                (n.approval_decided(&run), None),
                (n.approval_requested(&run), Some(Service::Worker)),
                (n.approval_reminder(&run), Some(Service::Worker)),
                (n.approval_cancelled(&run), Some(Service::Gateway)),
                (n.run_completed(&run), Some(Service::Worker)),
                (n.run_cancelled(&run), Some(Service::Worker)),
                (n.approval_expired(&run), None),
                (n.audit_subject(&run), None),
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
    }

    #[test]
    fn a_namespace_prefixes_subjects_and_streams() {
        let n = Names::new("t1").unwrap();
        let run = RunId::parse("run_1").unwrap();
        assert_eq!(n.runs_start(), "t1.runs.start");
        assert_eq!(n.approval_decided(&run), "t1.approval.decided.run_1");
        assert_eq!(n.approvals_stream(), "t1_APPROVALS");
    }

    #[test]
    fn announcements_about_a_run_have_a_live_copy_and_nothing_else_does() {
        let run = RunId::parse("run_1").unwrap();
        for namespace in ["", "t1"] {
            let n = Names::new(namespace).unwrap();
            let live = n.live_subject(&run);
            for subject in [
                n.approval_requested(&run),
                n.approval_decided(&run),
                n.approval_expired(&run),
                n.approval_reminder(&run),
                n.run_completed(&run),
                n.run_failed(&run),
                n.run_cancelled(&run),
            ] {
                assert_eq!(n.live_copy(&subject).as_ref(), Some(&live), "{subject}");
            }
            for subject in [
                n.runs_start(),
                n.audit_subject(&run),
                n.delivery("slack", "ops"),
                n.run_policy_shadow(&run),
            ] {
                assert_eq!(n.live_copy(&subject), None, "{subject}");
            }
        }
    }

    #[test]
    fn a_subject_s_kind_leaves_out_the_namespace_and_the_run() {
        let run = RunId::parse("run_1").unwrap();
        for namespace in ["", "t1"] {
            let n = Names::new(namespace).unwrap();
            assert_eq!(n.kind(&n.approval_decided(&run)), "approval.decided");
            assert_eq!(n.kind(&n.run_completed(&run)), "run.completed");
            assert_eq!(n.kind(&n.audit_subject(&run)), "audit");
            assert_eq!(n.kind(&n.runs_start()), "runs.start");
        }
    }

    #[test]
    fn a_namespace_with_a_dot_is_refused() {
        assert!(Names::new("a.b").is_err());
    }
}
