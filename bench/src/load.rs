//! The load generator: closed-loop clients, each driving one refund run at a time through
//! the gateway's HTTP API, and one core-NATS subscription that sees every run pause and
//! end.
//!
//! A run's pause and completion are taken from the events the services publish
//! (`approval.requested.<run>`, `run.completed.<run>`), timestamped as the subscription
//! receives them. That costs NATS one more subscriber per message and the gateway nothing,
//! where polling `GET /v1/runs/{id}` would add requests to the very process being measured.
//! An event may arrive before the `202` that names its run does, so [`Hub`] queues events
//! nobody waits for yet.

use crate::config::DigestFrom;
use crate::fakes::Fakes;
use crate::servers::{AGENT, REQUESTER_KEY, REVIEWER_KEY};
use anyhow::{Context, bail, ensure};
use countersign_fake_model::REFUND_ANSWER;
use countersign_model::events::{Envelope, Event};
use countersign_model::run::HeldCall;
use countersign_runtime::names::Names;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The name prefix of the load generator's threads.
pub const THREADS: &str = "loadgen";

/// One event about one run, and when the subscription received it.
pub struct Seen {
    pub at: Instant,
    pub event: Event,
}

enum Slot {
    Waiting(oneshot::Sender<Seen>),
    Queued(VecDeque<Seen>),
}

/// Hands each run's events to whoever drives that run, in the order they arrived.
#[derive(Default)]
pub struct Hub {
    slots: Mutex<HashMap<String, Slot>>,
    unparsed: AtomicU64,
}

impl Hub {
    fn deliver(&self, run: &str, seen: Seen) {
        let mut slots = self.slots.lock().unwrap();
        match slots.remove(run) {
            Some(Slot::Waiting(tx)) => {
                // A driver that gave up waiting dropped its receiver: nothing to hand over.
                let _ = tx.send(seen);
            }
            Some(Slot::Queued(mut queue)) => {
                queue.push_back(seen);
                slots.insert(run.to_string(), Slot::Queued(queue));
            }
            None => {
                slots.insert(run.to_string(), Slot::Queued(VecDeque::from([seen])));
            }
        }
    }

    /// The run's next event, waiting at most `timeout` for it.
    pub async fn next(&self, run: &str, timeout: Duration) -> anyhow::Result<Seen> {
        let rx = {
            let mut slots = self.slots.lock().unwrap();
            match slots.remove(run) {
                Some(Slot::Queued(mut queue)) => {
                    let seen = queue.pop_front();
                    if !queue.is_empty() {
                        slots.insert(run.to_string(), Slot::Queued(queue));
                    }
                    if let Some(seen) = seen {
                        return Ok(seen);
                    }
                    let (tx, rx) = oneshot::channel();
                    slots.insert(run.to_string(), Slot::Waiting(tx));
                    rx
                }
                Some(Slot::Waiting(tx)) => {
                    slots.insert(run.to_string(), Slot::Waiting(tx));
                    bail!("two drivers wait on one run");
                }
                None => {
                    let (tx, rx) = oneshot::channel();
                    slots.insert(run.to_string(), Slot::Waiting(tx));
                    rx
                }
            }
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(seen)) => Ok(seen),
            _ => {
                self.forget(run);
                bail!("no event within {} s", timeout.as_secs())
            }
        }
    }

    /// Drops what is kept for a run its driver is done with.
    pub fn forget(&self, run: &str) {
        self.slots.lock().unwrap().remove(run);
    }

    /// Events kept for runs nobody drives (repeats seen after a run was done), and
    /// messages that were not events.
    pub fn leftovers(&self) -> (usize, u64) {
        let slots = self.slots.lock().unwrap();
        let queued = slots
            .values()
            .map(|slot| match slot {
                Slot::Queued(q) => q.len(),
                Slot::Waiting(_) => 0,
            })
            .sum();
        (queued, self.unparsed.load(Ordering::Relaxed))
    }
}

/// The run an event is about, unless the benchmark has no use for it (decisions are seen
/// in the answer to the decision request).
fn run_of(event: &Event) -> Option<&str> {
    match event {
        Event::ApprovalRequested { run_id, .. }
        | Event::ApprovalReminder { run_id, .. }
        | Event::ApprovalExpired { run_id, .. }
        | Event::ApprovalCancelled { run_id, .. }
        | Event::RunAttention { run_id, .. }
        | Event::RunPolicyChanged { run_id, .. }
        | Event::RunPolicyShadow { run_id, .. }
        | Event::RunCompleted { run_id, .. }
        | Event::RunFailed { run_id, .. }
        | Event::RunCancelled { run_id, .. } => Some(run_id.as_str()),
        Event::ApprovalDecided { .. } | Event::RunStart { .. } => None,
    }
}

fn kind(event: &Event) -> &'static str {
    match event {
        Event::RunStart { .. } => "run.start",
        Event::ApprovalRequested { .. } => "approval.requested",
        Event::ApprovalDecided { .. } => "approval.decided",
        Event::ApprovalReminder { .. } => "approval.reminder",
        Event::ApprovalExpired { .. } => "approval.expired",
        Event::ApprovalCancelled { .. } => "approval.cancelled",
        Event::RunAttention { .. } => "run.attention",
        Event::RunPolicyChanged { .. } => "run.policy_changed",
        Event::RunPolicyShadow { .. } => "run.policy_shadow",
        Event::RunCompleted { .. } => "run.completed",
        Event::RunFailed { .. } => "run.failed",
        Event::RunCancelled { .. } => "run.cancelled",
    }
}

/// How long each step of one cycle took, in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Times {
    /// `POST /v1/runs` sent → `202`.
    pub start: u64,
    /// `POST /v1/runs` sent → `approval.requested` received.
    pub pause: u64,
    /// `GET /v1/runs/{id}` sent → `200` (zero when the digest comes from the event).
    pub read: u64,
    /// `POST /v1/runs/{id}/decisions` sent → `200`.
    pub decision: u64,
    /// Decision sent → `run.completed` received.
    pub resume: u64,
    /// `POST /v1/runs` sent → `run.completed` received.
    pub cycle: u64,
}

#[derive(Deserialize)]
struct Started {
    run_id: String,
}

#[derive(Deserialize)]
struct RunView {
    status: String,
    pending: Vec<PendingView>,
}

#[derive(Deserialize)]
struct PendingView {
    call_id: String,
    tool: String,
    digest: String,
}

#[derive(Deserialize)]
struct Decided {
    decisions: Vec<DecidedCall>,
}

#[derive(Deserialize)]
struct DecidedCall {
    call_id: String,
    status: String,
}

/// Stops the level's clients once this many violations are recorded: the figures of a
/// broken system are not worth waiting for.
const MAX_VIOLATIONS: usize = 20;

pub struct Load {
    http: reqwest::Client,
    gateway: String,
    hub: Arc<Hub>,
    fakes: Arc<Fakes>,
    digest_from: DigestFrom,
    timeout: Duration,
    violations: Mutex<Vec<String>>,
    /// Runs that completed (checked again at the end) and runs left paused.
    completed: Mutex<Vec<String>>,
    paused: Mutex<Vec<String>>,
    /// The NATS client behind the subscription: kept so it lives as long as the load.
    _nats: async_nats::Client,
}

impl Load {
    /// Subscribes to the deployment's events and prepares the HTTP client.
    pub async fn connect(
        nats_url: &str,
        names: &Names,
        gateway: &str,
        fakes: Arc<Fakes>,
        digest_from: DigestFrom,
        timeout: Duration,
    ) -> anyhow::Result<Arc<Self>> {
        let nats = async_nats::connect(nats_url)
            .await
            .with_context(|| format!("connect to NATS at {nats_url}"))?;
        let approvals = nats.subscribe(names.approval_all()).await?;
        let ends = nats.subscribe(names.run_events_all()).await?;
        nats.flush().await?;
        let hub = Arc::new(Hub::default());
        let sink = hub.clone();
        tokio::spawn(async move {
            let mut events = futures::stream::select(approvals, ends);
            while let Some(message) = events.next().await {
                let at = Instant::now();
                match serde_json::from_slice::<Envelope>(&message.payload) {
                    Ok(envelope) => {
                        if let Some(run) = run_of(&envelope.event).map(str::to_string) {
                            sink.deliver(
                                &run,
                                Seen {
                                    at,
                                    event: envelope.event,
                                },
                            );
                        }
                    }
                    Err(_) => {
                        sink.unparsed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        // Keep-alive, with idle connections dropped well before the gateway closes them
        // (header_read_timeout_ms, 5 s), so no request races a close.
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(1024)
            .tcp_nodelay(true)
            .build()?;
        Ok(Arc::new(Self {
            http,
            gateway: gateway.to_string(),
            hub,
            fakes,
            digest_from,
            timeout,
            violations: Mutex::default(),
            completed: Mutex::default(),
            paused: Mutex::default(),
            _nats: nats,
        }))
    }

    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }

    fn violation(&self, what: String) {
        let mut v = self.violations.lock().unwrap();
        if v.len() < 1000 {
            v.push(what);
        }
    }

    fn failed(&self) -> bool {
        self.violations.lock().unwrap().len() >= MAX_VIOLATIONS
    }

    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// Some runs that completed and some left paused (for `MEMORY USAGE`).
    pub fn sample_runs(&self, n: usize) -> (Vec<String>, Vec<String>) {
        let take = |runs: &Mutex<Vec<String>>| {
            let runs = runs.lock().unwrap();
            runs.iter().rev().take(n).cloned().collect()
        };
        (take(&self.completed), take(&self.paused))
    }

    /// `cycles` full cycles with `concurrency` clients, each starting its next run once its
    /// last completed. Returns the times of the cycles that passed every check.
    pub async fn cycles(self: &Arc<Self>, concurrency: usize, cycles: usize) -> Vec<Times> {
        self.clients(
            concurrency,
            cycles,
            |load| async move { load.cycle().await },
        )
        .await
    }

    /// Starts `runs` runs, `concurrency` at a time, and leaves each paused once it is.
    pub async fn leave_paused(self: &Arc<Self>, concurrency: usize, runs: usize) -> usize {
        let paused = self
            .clients(concurrency, runs, |load| async move {
                load.pause_only().await.map(|_| Times::default())
            })
            .await;
        paused.len()
    }

    async fn clients<F, Fut>(
        self: &Arc<Self>,
        concurrency: usize,
        total: usize,
        one: F,
    ) -> Vec<Times>
    where
        F: Fn(Arc<Self>) -> Fut + Send + Sync + Copy + 'static,
        Fut: Future<Output = anyhow::Result<Times>> + Send,
    {
        let next = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..concurrency.min(total))
            .map(|_| {
                let load = self.clone();
                let next = next.clone();
                tokio::spawn(async move {
                    let mut times = Vec::new();
                    while next.fetch_add(1, Ordering::Relaxed) < total && !load.failed() {
                        match one(load.clone()).await {
                            Ok(t) => times.push(t),
                            Err(e) => load.violation(format!("{e:#}")),
                        }
                    }
                    times
                })
            })
            .collect();
        let mut all = Vec::with_capacity(total);
        for task in tasks {
            match task.await {
                Ok(times) => all.extend(times),
                Err(e) => self.violation(format!("a client task panicked: {e}")),
            }
        }
        all
    }

    async fn start_run(&self) -> anyhow::Result<String> {
        let answer = self
            .http
            .post(format!("{}/v1/runs", self.gateway))
            .bearer_auth(REQUESTER_KEY)
            .json(
                &json!({"agent": AGENT, "input": "Order A-1001 arrived broken. Please refund it."}),
            )
            .send()
            .await
            .context("POST /v1/runs")?;
        let status = answer.status();
        ensure!(
            status == reqwest::StatusCode::ACCEPTED,
            "POST /v1/runs answered {status}: {}",
            answer.text().await.unwrap_or_default()
        );
        Ok(answer.json::<Started>().await?.run_id)
    }

    /// One cycle: start, pause, read, approve, complete, checking each step.
    async fn cycle(&self) -> anyhow::Result<Times> {
        let t0 = Instant::now();
        let run = self.start_run().await?;
        let started = t0.elapsed();
        let result = self.drive(&run, t0, started).await;
        self.hub.forget(&run);
        match result {
            Ok(times) => {
                self.completed.lock().unwrap().push(run);
                Ok(times)
            }
            Err(e) => Err(e.context(format!("run {run}"))),
        }
    }

    async fn drive(&self, run: &str, t0: Instant, started: Duration) -> anyhow::Result<Times> {
        let (call, paused_at) = self.wait_paused(run).await?;
        let mut times = Times {
            start: micros(started),
            pause: micros(paused_at.saturating_duration_since(t0)),
            ..Times::default()
        };
        let digest = match self.digest_from {
            DigestFrom::Event => call.digest.clone(),
            DigestFrom::Get => {
                let sent = Instant::now();
                let digest = self.read_digest(run, &call).await?;
                times.read = micros(sent.elapsed());
                digest
            }
        };

        let sent = Instant::now();
        let answer = self
            .http
            .post(format!("{}/v1/runs/{run}/decisions", self.gateway))
            .bearer_auth(REVIEWER_KEY)
            .json(&json!({"decisions": [{"call_id": call.call_id, "digest": digest, "action": "approve"}]}))
            .send()
            .await
            .context("POST decisions")?;
        let status = answer.status();
        ensure!(
            status == reqwest::StatusCode::OK,
            "POST decisions answered {status}: {}",
            answer.text().await.unwrap_or_default()
        );
        let decided: Decided = answer.json().await?;
        times.decision = micros(sent.elapsed());
        ensure!(
            decided.decisions.len() == 1
                && decided.decisions[0].call_id == call.call_id
                && decided.decisions[0].status == "recorded",
            "the decision was not recorded as made"
        );

        let end = self
            .hub
            .next(run, self.timeout)
            .await
            .context("waiting for its end")?;
        match &end.event {
            Event::RunCompleted { answer, .. } if answer == REFUND_ANSWER => {}
            other => bail!(
                "after the approval came {} instead of run.completed",
                kind(other)
            ),
        }
        times.resume = micros(end.at.saturating_duration_since(sent));
        times.cycle = micros(end.at.saturating_duration_since(t0));

        let calls = self.fakes.calls(run);
        ensure!(
            calls.lookups == 1,
            "get_order was requested {} times",
            calls.lookups
        );
        ensure!(
            calls.refund_requests() == 1 && calls.refunds.get(&call.call_id) == Some(&1),
            "the refund was requested {:?} times (per call id) where once was due",
            calls.refunds
        );
        Ok(times)
    }

    /// Waits for the run's pause and checks it holds the refund and nothing ran yet.
    async fn wait_paused(&self, run: &str) -> anyhow::Result<(HeldCall, Instant)> {
        let seen = self
            .hub
            .next(run, self.timeout)
            .await
            .context("waiting for its pause")?;
        let Event::ApprovalRequested { calls, .. } = seen.event else {
            bail!("came {} instead of approval.requested", kind(&seen.event));
        };
        let [call] = <[HeldCall; 1]>::try_from(calls)
            .map_err(|calls| anyhow::anyhow!("{} calls held instead of one", calls.len()))?;
        ensure!(
            call.tool == "issue_refund",
            "{} was held instead of issue_refund",
            call.tool
        );
        let ran = self.fakes.calls(run);
        ensure!(
            ran.refund_requests() == 0,
            "the refund ran before its approval"
        );
        ensure!(
            ran.lookups == 1,
            "get_order was requested {} times before the pause",
            ran.lookups
        );
        Ok((call, seen.at))
    }

    /// What a reviewer's screen reads: the run, and the digest of its held refund.
    async fn read_digest(&self, run: &str, call: &HeldCall) -> anyhow::Result<String> {
        let answer = self
            .http
            .get(format!("{}/v1/runs/{run}", self.gateway))
            .bearer_auth(REVIEWER_KEY)
            .send()
            .await
            .context("GET /v1/runs/{id}")?;
        let status = answer.status();
        ensure!(
            status == reqwest::StatusCode::OK,
            "GET /v1/runs/{{id}} answered {status}"
        );
        let view: RunView = answer.json().await?;
        ensure!(
            view.status == "awaiting_approval",
            "the paused run reads as {}",
            view.status
        );
        let held = view
            .pending
            .into_iter()
            .find(|p| p.call_id == call.call_id && p.tool == call.tool)
            .context("the held call is not among the run's pending calls")?;
        ensure!(
            held.digest == call.digest,
            "the run's digest differs from the event's"
        );
        Ok(held.digest)
    }

    async fn pause_only(&self) -> anyhow::Result<()> {
        let run = self.start_run().await?;
        let result = self.wait_paused(&run).await;
        self.hub.forget(&run);
        result.with_context(|| format!("run {run}"))?;
        self.paused.lock().unwrap().push(run);
        Ok(())
    }

    /// Checks again, after the fact, every run this load drove: each completed run's
    /// refund was requested exactly once, each paused run's never. Catches a repeat that
    /// arrived after its cycle was counted.
    pub fn recheck(&self) -> usize {
        let completed = self.completed.lock().unwrap().clone();
        let paused = self.paused.lock().unwrap().clone();
        let mut bad = 0;
        for run in &completed {
            let calls = self.fakes.calls(run);
            if calls.refund_requests() != 1 || calls.lookups != 1 {
                bad += 1;
                self.violation(format!(
                    "run {run}: at the end, refund requests {:?} and {} lookups where one each was due",
                    calls.refunds, calls.lookups
                ));
            }
        }
        for run in &paused {
            let calls = self.fakes.calls(run);
            if calls.refund_requests() != 0 {
                bad += 1;
                self.violation(format!(
                    "run {run}: refunded {:?} while it waits for approval",
                    calls.refunds
                ));
            }
        }
        bad
    }

    pub fn runs_checked(&self) -> (usize, usize) {
        (
            self.completed.lock().unwrap().len(),
            self.paused.lock().unwrap().len(),
        )
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_model::run::RunId;

    fn completed(run: &str) -> Seen {
        Seen {
            at: Instant::now(),
            event: Event::RunCompleted {
                run_id: RunId::parse(run).unwrap(),
                answer: REFUND_ANSWER.into(),
                failed_calls: Vec::new(),
            },
        }
    }

    #[tokio::test]
    async fn an_event_that_arrives_before_its_driver_waits_is_kept_for_it() {
        let hub = Hub::default();
        hub.deliver("run_1", completed("run_1"));
        let seen = hub.next("run_1", Duration::from_secs(1)).await.unwrap();
        assert!(matches!(seen.event, Event::RunCompleted { .. }));
        assert_eq!(hub.leftovers().0, 0);
    }

    #[tokio::test]
    async fn a_waiting_driver_gets_the_event_when_it_arrives() {
        let hub = Arc::new(Hub::default());
        let waiter = {
            let hub = hub.clone();
            tokio::spawn(async move { hub.next("run_2", Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        hub.deliver("run_2", completed("run_2"));
        assert!(waiter.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn a_driver_that_waits_in_vain_times_out_and_leaves_nothing_behind() {
        let hub = Hub::default();
        assert!(hub.next("run_3", Duration::from_millis(20)).await.is_err());
        hub.deliver("run_3", completed("run_3"));
        hub.forget("run_3");
        assert_eq!(hub.leftovers().0, 0);
    }
}
