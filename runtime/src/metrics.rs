//! What a service counts and times, served as Prometheus text at `GET /metrics` (the
//! gateway's listener, a worker's health port). Each process makes one [`Metrics`] at start and
//! hands a clone to each part that records (the store times its Redis commands, the relay
//! its publishes, the engine or the routes the rest), so the figures are that process's;
//! Prometheus sums them over the deployment.
//!
//! - `countersign_runs_total{event}`: `started` (gateway), `paused`, `resumed`, `completed`,
//!   `failed`, `cancelled` (worker).
//! - `countersign_calls_total{event}`: `held` for a person, `expired`, `escalated`, and
//!   `resolved` once a held turn goes back to the model; held − resolved is what is pending.
//! - `countersign_decisions_total{door, outcome}`: `recorded`, or the refusal's code.
//! - `countersign_grants_total{event}`: standing grants `made`, `used` (a call approved
//!   under one), `revoked`.
//! - `countersign_agent_reloads_total{outcome}`: the agents' folder changed and was
//!   `loaded`, or `refused` (the error is logged; the agents loaded before stay).
//! - `countersign_policy_rechecks_total{outcome}`: calls held or decided under a policy that
//!   has changed since, checked again: `released` (the policy now lets it run), `reheld`
//!   (asked again under the new terms), `refused` (its tool is gone or its input no longer
//!   fits), `superseded` (a waiting call closed so that it is checked again).
//! - `countersign_policy_shadow_total{tool, outcome}`: calls a tool's shadow policy sorted
//!   differently from its live one: `would_hold`, `would_release`, `other_reviewers`.
//! - `countersign_reviewer_seconds{tool, verdict}`: a tool's reviewer model's verdicts on
//!   held calls, in shadow, by verdict (`approve`, `ask_person`, `outside_envelope`, `error`),
//!   and what each took (worker).
//! - `countersign_live_streams_total{event}`: followers of a run's live events (`GET
//!   /v1/runs/{id}/events`) `opened`, and how they ended: `ended` with the run, `left` (the
//!   client went away), `cut` (it read too slowly and was cut off).
//! - `countersign_pause_seconds` (run created → paused), `countersign_decision_seconds` (held
//!   → decided), `countersign_resume_seconds` (last decision → the model called again).
//! - `countersign_model_tokens_total{provider, kind}`: the tokens the providers counted for
//!   the agents' model calls, `input` and `output` (worker; what the agents cost).
//! - `countersign_model_call_seconds{provider}`, `countersign_tool_call_seconds{tool}`,
//!   `countersign_redis_command_seconds{command}`, `countersign_jetstream_publish_seconds`.
//! - `countersign_announcements_total{kind, sent}`: announcements from the outbox that
//!   JetStream took (`kind` is the subject without namespace and run: `approval.decided`,
//!   `run.completed`, `audit`, …), `sent` `at_once` by the process that made the change or
//!   `late` by an outbox sweeper (NATS was away, or refused the publish).
//! - `countersign_call_wait_wakeups_total{by}`: how a client waiting for a call's outcome
//!   (the MCP proxy, the door of external agents) learned to read its run again: a `run.*`
//!   `event` on NATS, or the `poll` that stands in when none comes.
//! - `countersign_jetstream_redeliveries_total{stream}` and
//!   `countersign_delivery_failures_total{channel}`.
//! - `countersign_unknown_run_messages_total{stream}`: messages a worker acked without
//!   effect because the run they name is not stored (a `runs.start` published by someone
//!   other than a gateway, a decision about a run long gone).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// One label and its value (`event="paused"`, `tool="issue_refund"`, …); a decision has two.
type Labels = Vec<(&'static str, String)>;

type Timings = Family<Labels, Histogram, fn() -> Histogram>;

/// From 100 µs to about 2 minutes: Redis commands at the short end, people at the long.
fn buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.5, 16))
}

/// Decisions wait on people: from a second to about a week.
fn human_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 3.0, 14))
}

/// One process's counters and timings (see the module's list); clones share them.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

struct Inner {
    registry: Registry,
    runs: Family<Labels, Counter>,
    calls: Family<Labels, Counter>,
    decisions: Family<Labels, Counter>,
    grants: Family<Labels, Counter>,
    reloads: Family<Labels, Counter>,
    rechecks: Family<Labels, Counter>,
    shadow: Family<Labels, Counter>,
    reviewer: Timings,
    live: Family<Labels, Counter>,
    announcements: Family<Labels, Counter>,
    wakeups: Family<Labels, Counter>,
    pause: Histogram,
    decision: Histogram,
    resume: Histogram,
    model: Timings,
    tokens: Family<Labels, Counter>,
    tool: Timings,
    redis: Timings,
    publish: Histogram,
    redeliveries: Family<Labels, Counter>,
    delivery_failures: Family<Labels, Counter>,
    unknown_runs: Family<Labels, Counter>,
}

impl Default for Metrics {
    // Long because it is one table: every metric is made and registered, with its name and
    // help text, in one place, so the list of what is exported reads top to bottom.
    fn default() -> Self {
        let mut inner = Inner {
            registry: Registry::with_prefix("countersign"),
            runs: Family::default(),
            calls: Family::default(),
            decisions: Family::default(),
            grants: Family::default(),
            reloads: Family::default(),
            rechecks: Family::default(),
            shadow: Family::default(),
            reviewer: Family::new_with_constructor(buckets),
            live: Family::default(),
            announcements: Family::default(),
            wakeups: Family::default(),
            pause: buckets(),
            decision: human_buckets(),
            resume: buckets(),
            model: Family::new_with_constructor(buckets),
            tokens: Family::default(),
            tool: Family::new_with_constructor(buckets),
            redis: Family::new_with_constructor(buckets),
            publish: buckets(),
            redeliveries: Family::default(),
            delivery_failures: Family::default(),
            unknown_runs: Family::default(),
        };
        let r = &mut inner.registry;
        r.register("runs", "Runs by what happened to them", inner.runs.clone());
        r.register(
            "calls",
            "Calls held for a person, and how they ended",
            inner.calls.clone(),
        );
        r.register(
            "decisions",
            "Decisions by channel and outcome",
            inner.decisions.clone(),
        );
        r.register(
            "grants",
            "Standing grants made, used and revoked",
            inner.grants.clone(),
        );
        r.register(
            "agent_reloads",
            "Changes of the agents' folder, loaded or refused",
            inner.reloads.clone(),
        );
        r.register(
            "policy_rechecks",
            "Calls checked again because their policy changed, by outcome",
            inner.rechecks.clone(),
        );
        r.register(
            "policy_shadow",
            "Calls a shadow policy sorted differently from the live one",
            inner.shadow.clone(),
        );
        r.register(
            "reviewer_seconds",
            "Reviewer models' verdicts on held calls, in shadow, and what each took",
            inner.reviewer.clone(),
        );
        r.register(
            "live_streams",
            "Followers of runs' live events, opened and how they ended",
            inner.live.clone(),
        );
        r.register(
            "announcements",
            "Announcements JetStream took, by kind and whether sent at once or late",
            inner.announcements.clone(),
        );
        r.register(
            "call_wait_wakeups",
            "How clients waiting for a call's outcome were woken: a run event or the poll",
            inner.wakeups.clone(),
        );
        r.register(
            "pause_seconds",
            "From a run's creation to its pause",
            inner.pause.clone(),
        );
        r.register(
            "decision_seconds",
            "From a call held to its decision",
            inner.decision.clone(),
        );
        r.register(
            "resume_seconds",
            "From a turn's last decision to the next model call",
            inner.resume.clone(),
        );
        r.register("model_call_seconds", "Model API calls", inner.model.clone());
        r.register(
            "model_tokens",
            "Tokens the providers counted for the agents' model calls",
            inner.tokens.clone(),
        );
        r.register("tool_call_seconds", "Tool calls", inner.tool.clone());
        r.register(
            "redis_command_seconds",
            "Redis round trips by command",
            inner.redis.clone(),
        );
        r.register(
            "jetstream_publish_seconds",
            "JetStream publishes until acknowledged",
            inner.publish.clone(),
        );
        r.register(
            "jetstream_redeliveries",
            "Messages JetStream delivered again",
            inner.redeliveries.clone(),
        );
        r.register(
            "delivery_failures",
            "Channel deliveries that failed",
            inner.delivery_failures.clone(),
        );
        r.register(
            "unknown_run_messages",
            "Messages naming a run that is not stored, acked without effect",
            inner.unknown_runs.clone(),
        );
        Self(Arc::new(inner))
    }
}

impl Metrics {
    /// The content type of [`Metrics::encode`]'s text.
    pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

    /// Everything, in Prometheus's text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.0.registry)
            .expect("writing to a string does not fail");
        text
    }

    /// Counts a run's `event` in `countersign_runs_total` (`started`, `paused`,
    /// `completed`...).
    pub fn run(&self, event: &'static str) {
        self.0.runs.get_or_create(&label("event", event)).inc();
    }

    /// Counts `n` calls' `event` in `countersign_calls_total` (`held`, `expired`, `escalated`,
    /// `resolved`).
    pub fn calls(&self, event: &'static str, n: usize) {
        self.0
            .calls
            .get_or_create(&label("event", event))
            .inc_by(n as u64);
    }

    /// Counts a decision through `door` in `countersign_decisions_total`: `recorded`, or the
    /// refusal's code.
    pub fn decision(&self, door: &str, outcome: &str) {
        let labels = vec![("door", door.to_string()), ("outcome", outcome.to_string())];
        self.0.decisions.get_or_create(&labels).inc();
    }

    /// Counts a standing grant's `event` in `countersign_grants_total` (`made`, `used`,
    /// `revoked`).
    pub fn grant(&self, event: &'static str) {
        self.0.grants.get_or_create(&label("event", event)).inc();
    }

    /// Counts a change of the agents' folder, `loaded` or `refused`.
    pub fn agent_reload(&self, outcome: &'static str) {
        self.0
            .reloads
            .get_or_create(&label("outcome", outcome))
            .inc();
    }

    /// Counts a call checked again after a policy change, by outcome (`released`, `reheld`,
    /// `refused`, `superseded`).
    pub fn policy_recheck(&self, outcome: &'static str) {
        self.0
            .rechecks
            .get_or_create(&label("outcome", outcome))
            .inc();
    }

    /// Counts a call of `tool` that its shadow policy sorted differently, by how (`would_hold`,
    /// `would_release`, `other_reviewers`).
    pub fn policy_shadow(&self, tool: &str, outcome: &'static str) {
        let labels = vec![("tool", tool.to_string()), ("outcome", outcome.to_string())];
        self.0.shadow.get_or_create(&labels).inc();
    }

    /// Times a reviewer model's `verdict` on a held call of `tool`.
    pub fn reviewer_verdict(&self, tool: &str, verdict: &'static str, took: Duration) {
        let labels = vec![("tool", tool.to_string()), ("verdict", verdict.to_string())];
        self.0
            .reviewer
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// Counts a follower of a run's live events `opened`, or how it ended (`ended`, `left`,
    /// `cut`).
    pub fn live_stream(&self, event: &'static str) {
        self.0.live.get_or_create(&label("event", event)).inc();
    }

    /// An announcement of `kind` that JetStream took, sent `late` by a sweeper or at once.
    pub fn announced(&self, kind: &str, late: bool) {
        let sent = if late { "late" } else { "at_once" };
        let labels = vec![("kind", kind.to_string()), ("sent", sent.to_string())];
        self.0.announcements.get_or_create(&labels).inc();
    }

    /// Counts how a client waiting for a call's outcome was woken: `event` or `poll`.
    pub fn call_wait_wakeup(&self, by: &'static str) {
        self.0.wakeups.get_or_create(&label("by", by)).inc();
    }

    /// Times a run from its creation to its pause, `ms` milliseconds.
    pub fn paused_after(&self, ms: i64) {
        self.0.pause.observe(seconds(ms));
    }

    /// Times a call from held to decided, `ms` milliseconds.
    pub fn decided_after(&self, ms: i64) {
        self.0.decision.observe(seconds(ms));
    }

    /// Times a turn from its last decision to the next model call, `ms` milliseconds.
    pub fn resumed_after(&self, ms: i64) {
        self.0.resume.observe(seconds(ms));
    }

    /// Times one call of the model API of `provider`.
    pub fn model_call(&self, provider: &str, took: Duration) {
        let timing = self.0.model.get_or_create(&label("provider", provider));
        timing.observe(took.as_secs_f64());
    }

    /// Counts the tokens `provider` counted for one of an agent's model calls.
    pub fn model_tokens(&self, provider: &str, input: u64, output: u64) {
        for (kind, n) in [("input", input), ("output", output)] {
            let labels = vec![
                ("provider", provider.to_string()),
                ("kind", kind.to_string()),
            ];
            self.0.tokens.get_or_create(&labels).inc_by(n);
        }
    }

    /// Times one call of `tool`.
    pub fn tool_call(&self, tool: &str, took: Duration) {
        let timing = self.0.tool.get_or_create(&label("tool", tool));
        timing.observe(took.as_secs_f64());
    }

    /// Times one Redis round trip of `command`.
    pub fn redis_command(&self, command: &str, took: Duration) {
        let timing = self.0.redis.get_or_create(&label("command", command));
        timing.observe(took.as_secs_f64());
    }

    /// Times one JetStream publish until it was acknowledged.
    pub fn published(&self, took: Duration) {
        self.0.publish.observe(took.as_secs_f64());
    }

    /// Counts a message JetStream delivered again on `stream`.
    pub fn redelivered(&self, stream: &str) {
        self.0
            .redeliveries
            .get_or_create(&label("stream", stream))
            .inc();
    }

    /// Counts a message on `stream` a worker acked without effect because its run is not
    /// stored.
    pub fn unknown_run(&self, stream: &str) {
        self.0
            .unknown_runs
            .get_or_create(&label("stream", stream))
            .inc();
    }

    /// Counts a delivery to `channel` that failed.
    pub fn delivery_failed(&self, channel: &str) {
        let failures = self
            .0
            .delivery_failures
            .get_or_create(&label("channel", channel));
        failures.inc();
    }
}

fn label(name: &'static str, value: &str) -> Labels {
    vec![(name, value.to_string())]
}

/// Milliseconds between two clocks' readings as seconds; never negative (clocks differ).
fn seconds(ms: i64) -> f64 {
    ms.max(0) as f64 / 1000.0
}
