//! The model check: random histories of several runs at once, played against real NATS and
//! Redis, a gateway in-process and two worker processes, then checked against the reference
//! model of the run (`countersign_tests::model_check`): what the gateway answered, each run's
//! record and audit trail (its chain recomputed) and every request the tools received.
//!
//! A history is drawn from a seed, printed first. Operations: starts; decisions raced from two
//! doors (approve, edit, reject); decisions quoting a stale digest; cancels at any stage;
//! waits that let 3 s deadlines pass; policy reloads (the refund limit switched); SIGKILLs of
//! a worker process (at random, the one sending a tool request, or one just after the
//! reviewer model gave a verdict), each followed by a new one; NATS and Redis restarts. The
//! refund tool has a live reviewer model, which approves the calls of even runs inside its
//! envelope in its own name.
//!
//! - `MODEL_CHECK_SEED`: the seed (default: a random one, printed).
//! - `MODEL_CHECK_HISTORIES`: how many histories (default 8: about two minutes in CI).
//! - `MODEL_CHECK_OPS`: the most operations a history has (default 20).
//! - `MODEL_CHECK_RUNS`: the most runs a history has (default 5; at least 3).
//! - `MODEL_CHECK_HISTORY`: a history's JSON, or a file holding it: plays that one only.
//! - `MODEL_CHECK_SHRINK`: how many smaller histories a failure may play to shrink (default 4).
//! - `MODEL_CHECK_WORKER_LOGS`: the worker processes' logs on stderr, at this filter.
//! - `MODEL_CHECK_WORKER_BIN`: another build of the worker to check (an `agent-worker` built
//!   from another commit, say), in place of this package's `worker_process`.

use countersign_fake_model::FakeModel;
use countersign_runtime::names::Names;
use countersign_store::keys::{Keys, Shard};
use countersign_tests::app::{
    ADMIN_KEY, INTEGRATION_KEY, PATIENCE, REQUESTER_KEY, REVIEWER_KEY, gateway_config,
    worker_process_config_file,
};
use countersign_tests::infra::Infra;
use countersign_tests::model_check::history::{
    self, ENVELOPE, INITIAL_LIMIT, Size, edited_input, input_text,
};
use countersign_tests::model_check::rng::Rng;
use countersign_tests::model_check::shrink::Shrinker;
use countersign_tests::model_check::tools::Tools;
use countersign_tests::model_check::{
    Act, Answer, Asked, Door, Ended, History, Observations, Op, Violation, brain, check, procs,
};
use futures::future::join_all;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Child;
use tokio_util::sync::CancellationToken;

/// How long the model takes to answer and a tool to answer: wide enough windows for a cancel
/// or a kill to land in.
const MODEL_LATENCY: Duration = Duration::from_millis(250);
const TOOL_DELAY: Duration = Duration::from_millis(300);
/// How long an operation waits for the state it acts in (a run paused, a worker driving a
/// run, a tool request in flight) before it acts anyway or is skipped.
const OP_PATIENCE: Duration = Duration::from_secs(5);
/// How long the runs get to end once the operations are done: every held call expires within
/// 3 s of being held, and a run has at most two turns.
const END_PATIENCE: Duration = Duration::from_secs(120);
const WORKERS: usize = 2;

struct Settings {
    seed: u64,
    histories: u64,
    size: Size,
    shrink: usize,
    given: Option<History>,
}

impl Settings {
    fn from_env() -> Self {
        let number = |name: &str, default: u64| {
            std::env::var(name).map_or(default, |v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
            })
        };
        let given = std::env::var("MODEL_CHECK_HISTORY").ok().map(|given| {
            let text = match given.trim_start().starts_with('{') {
                true => given,
                false => std::fs::read_to_string(&given)
                    .unwrap_or_else(|e| panic!("MODEL_CHECK_HISTORY={given:?}: {e}")),
            };
            History::from_json(&text).unwrap_or_else(|e| panic!("MODEL_CHECK_HISTORY: {e}"))
        });
        Self {
            seed: number("MODEL_CHECK_SEED", uuid::Uuid::new_v4().as_u64_pair().0),
            histories: number("MODEL_CHECK_HISTORIES", 8),
            size: Size {
                runs: (3, number("MODEL_CHECK_RUNS", 5).max(3)),
                ops: (8, number("MODEL_CHECK_OPS", 20).max(8)),
            },
            shrink: number("MODEL_CHECK_SHRINK", 4) as usize,
            given,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_of_runs_keep_every_promise_of_the_run() {
    let settings = Settings::from_env();
    let histories: Vec<History> = match &settings.given {
        Some(history) => vec![history.clone()],
        None => {
            let mut seeds = Rng::new(settings.seed);
            (0..settings.histories)
                .map(|_| history::generate(seeds.next_u64(), settings.size))
                .collect()
        }
    };
    println!(
        "model check: seed {} ({} histories; MODEL_CHECK_SEED={} plays them again)",
        settings.seed,
        histories.len(),
        settings.seed
    );
    let infra = Infra::start_restartable().await;
    let began = Instant::now();
    let mut totals = Totals::default();
    let mut failures = Vec::new();
    for (i, history) in histories.into_iter().enumerate() {
        let (found, played) = play(&infra, &history).await;
        totals.add(&played);
        println!(
            "model check: history {} (seed {}): {}\n  {}",
            i + 1,
            history.seed,
            played.summary(),
            history.to_json()
        );
        if found.is_empty() {
            continue;
        }
        let report = format!(
            "history {} (seed {}) broke {} promises:\n{}\nplay it again with MODEL_CHECK_HISTORY='{}'\n",
            i + 1,
            history.seed,
            found.len(),
            lines(&found),
            history.to_json()
        );
        println!("model check: {report}");
        failures.push((history, found, report));
    }
    println!(
        "model check: {} in {:?}; {} of the histories failed",
        totals.summary(),
        began.elapsed(),
        failures.len()
    );
    // The first failure is shrunk; the others are reported as they are.
    let Some((history, found, _)) = failures.first() else {
        return;
    };
    let mut report: Vec<String> = failures.iter().map(|(_, _, r)| r.clone()).collect();
    let (smaller, still) = shrink(&infra, history.clone(), found, settings.shrink).await;
    if let Some(still) = still {
        report.push(format!(
            "the first shrunk to {} ops, which break:\n{}\nplay it again with MODEL_CHECK_HISTORY='{}'\n",
            smaller.ops.len(),
            lines(&still),
            smaller.to_json()
        ));
    }
    panic!("model check:\n{}", report.join("\n"));
}

fn lines(found: &[Violation]) -> String {
    let lines: Vec<String> = found.iter().map(|v| format!("  {v}")).collect();
    lines.join("\n")
}

/// Plays smaller histories (at most `budget`) that still break one of the promises `found`
/// broke; the smallest, and what it breaks, if any smaller one does.
async fn shrink(
    infra: &Infra,
    history: History,
    found: &[Violation],
    budget: usize,
) -> (History, Option<Vec<Violation>>) {
    let mut shrinker = Shrinker::new(history);
    let mut best = None;
    for _ in 0..budget {
        let Some(candidate) = shrinker.candidate() else {
            break;
        };
        let (again, _) = play(infra, &candidate).await;
        let same = again
            .iter()
            .any(|v| found.iter().any(|f| f.invariant == v.invariant));
        println!(
            "model check: shrinking, {} ops: {}",
            candidate.ops.len(),
            if same { "still fails" } else { "passes" }
        );
        if same {
            best = Some(again);
        }
        shrinker.tried(candidate, same);
    }
    (shrinker.best().clone(), best)
}

/// What one history did, for the summary.
#[derive(Default)]
struct Totals {
    histories: usize,
    ops: BTreeMap<&'static str, usize>,
    skipped: usize,
    runs: BTreeMap<String, usize>,
    tool_requests: usize,
    model_answers: usize,
    answers: BTreeMap<u16, usize>,
    /// The reviewer model's verdicts, and the calls it decided.
    verdicts: BTreeMap<String, usize>,
    model_decided: usize,
}

impl Totals {
    fn add(&mut self, other: &Totals) {
        self.histories += other.histories;
        for (k, n) in &other.ops {
            *self.ops.entry(k).or_default() += n;
        }
        self.skipped += other.skipped;
        for (k, n) in &other.runs {
            *self.runs.entry(k.clone()).or_default() += n;
        }
        self.tool_requests += other.tool_requests;
        self.model_answers += other.model_answers;
        for (k, n) in &other.answers {
            *self.answers.entry(*k).or_default() += n;
        }
        for (k, n) in &other.verdicts {
            *self.verdicts.entry(k.clone()).or_default() += n;
        }
        self.model_decided += other.model_decided;
    }

    fn summary(&self) -> String {
        format!(
            "{} histories; ops {:?} ({} skipped: their run was not in the state they act in); \
             runs ended {:?}; {} tool requests, {} model answers; gateway answers by status {:?}; \
             reviewer verdicts {:?}, {} calls decided by it",
            self.histories,
            self.ops,
            self.skipped,
            self.runs,
            self.tool_requests,
            self.model_answers,
            self.answers,
            self.verdicts,
            self.model_decided
        )
    }
}

/// The services of one history, in a namespace of their own on the shared servers.
struct Stage<'a> {
    infra: &'a Infra,
    http: reqwest::Client,
    dir: PathBuf,
    agents: PathBuf,
    model: FakeModel,
    tools: Tools,
    gateway_url: String,
    gateway: CancellationToken,
    gateway_task: tokio::task::JoinHandle<anyhow::Result<()>>,
    namespace: String,
    worker_config: PathBuf,
    workers: Vec<Child>,
    model_log: brain::AnswerLog,
    obs: Observations,
    totals: Totals,
}

/// Plays `history` on fresh services; the promises it broke, and what it did.
async fn play(infra: &Infra, history: &History) -> (Vec<Violation>, Totals) {
    let mut stage = Stage::start(infra, history).await;
    for op in &history.ops {
        let name = op_name(op);
        *stage.totals.ops.entry(name).or_default() += 1;
        if !stage.play(op).await {
            stage.totals.skipped += 1;
        }
    }
    stage.wait_for_the_end().await;
    let (obs, totals) = stage.stop().await;
    (check(&obs), totals)
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Start { .. } => "start",
        Op::Decide { by, .. } if by.len() > 1 => "decide_raced",
        Op::Decide { .. } => "decide",
        Op::Stale { .. } => "stale",
        Op::Cancel { .. } => "cancel",
        Op::Wait { .. } => "wait",
        Op::Reload { .. } => "reload",
        Op::Kill {
            in_flight: true, ..
        } => "kill_in_flight",
        Op::Kill {
            after_verdict: true,
            ..
        } => "kill_after_verdict",
        Op::Kill { .. } => "kill",
        Op::RestartNats => "restart_nats",
        Op::RestartRedis => "restart_redis",
    }
}

/// The agent file: a free lookup, idempotent; a refund free up to `limit` and held for a
/// person above it for 3 s at most, not idempotent, with a live reviewer model (the fake)
/// inside `ENVELOPE`.
fn agent_file(model_url: &str, tools_url: &str, limit: u32) -> String {
    format!(
        r#"name = "refunds"
system = "You are the model check's support agent."
max_turns = 6

[model]
provider = "anthropic"
name = "fake-model"
max_tokens = 1024
base_url = "{model_url}"

[[tools]]
name = "get_order"
description = "Look up an order by id."
input_schema = {{ type = "object", properties = {{ order_id = {{ type = "string" }} }}, required = ["order_id"] }}
http = {{ url = "{tools_url}/lookup" }}
idempotent = true
approval = "never"

[[tools]]
name = "issue_refund"
description = "Refund an amount in USD for an order."
input_schema = {{ type = "object", properties = {{ order_id = {{ type = "string" }}, amount = {{ type = "number", exclusiveMinimum = 0, maximum = 500 }}, reason = {{ type = "string", maxLength = 500 }} }}, required = ["order_id", "amount", "reason"] }}
http = {{ url = "{tools_url}/refunds" }}

[tools.approval]
when = "input.amount > {limit}.0"
reason = "Refund of ${{{{ input.amount }}}} moves money"
summary = "Refund ${{{{ input.amount }}}} for order {{{{ input.order_id }}}}"
timeout = "3s"

[tools.reviewer]
provider = "anthropic"
model = "fake-reviewer"
envelope = "input.amount <= {ENVELOPE}.0"
mode = "live"
timeout_ms = 5000
base_url = "{model_url}"
"#
    )
}

impl<'a> Stage<'a> {
    async fn start(infra: &'a Infra, history: &'a History) -> Stage<'a> {
        let namespace = infra.new_namespace().await;
        let dir = std::env::temp_dir().join(format!("countersign-model-check-{namespace}"));
        let agents = dir.join("agents");
        std::fs::create_dir_all(&agents).unwrap();
        let tools = Tools::start().await;
        tools.set_delay(TOOL_DELAY);
        let (brain, model_log) = brain::brain();
        let model = FakeModel::start(brain).await;
        model.set_latency(MODEL_LATENCY);
        std::fs::write(
            agents.join("refunds.toml"),
            agent_file(&model.base_url, &tools.base_url, INITIAL_LIMIT),
        )
        .unwrap();

        let mut config = gateway_config(infra, &namespace, &agents);
        config.agents_reload_ms = 200;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gateway_url = format!("http://{}", listener.local_addr().unwrap());
        let gateway = CancellationToken::new();
        let task = tokio::spawn(approval_gateway::run(config, listener, gateway.clone()));
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        countersign_tests::wait_for("the gateway to be ready", PATIENCE, || async {
            assert!(
                !task.is_finished(),
                "the gateway stopped before it was ready"
            );
            let r = http.get(format!("{gateway_url}/readyz")).send().await;
            r.ok().filter(|r| r.status().is_success()).map(|_| ())
        })
        .await;
        let worker_config = worker_process_config_file(
            infra,
            &namespace,
            &dir,
            &agents,
            "agents_reload_ms = 200\n",
        );
        let mut stage = Stage {
            infra,
            http,
            dir,
            agents,
            model,
            tools,
            gateway_url,
            gateway,
            gateway_task: task,
            namespace,
            worker_config,
            workers: Vec::new(),
            model_log,
            obs: Observations {
                run_ids: vec![None; history.runs.len()],
                inputs: (0..history.runs.len())
                    .map(|i| input_text(i, &history.runs[i]))
                    .collect(),
                limits: history.limits(),
                disrupted: history.disrupted(),
                restarts: history.restarts(),
                ..Default::default()
            },
            totals: Totals {
                histories: 1,
                ..Default::default()
            },
        };
        for _ in 0..WORKERS {
            let worker = stage.spawn_worker();
            stage.workers.push(worker);
        }
        stage
    }

    fn spawn_worker(&self) -> Child {
        let mut command = super::chaos::worker_command(&self.worker_config);
        if let Ok(bin) = std::env::var("MODEL_CHECK_WORKER_BIN") {
            let mut other = tokio::process::Command::new(bin);
            other
                .env("COUNTERSIGN_CONFIG", &self.worker_config)
                .env("RUST_LOG", "error")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true);
            command = other;
        }
        if let Ok(filter) = std::env::var("MODEL_CHECK_WORKER_LOGS") {
            command.env("RUST_LOG", filter).stderr(Stdio::inherit());
        }
        command.spawn().expect("start a worker process")
    }

    /// Plays one operation; false when it was skipped (its run not started, or not in the
    /// state it acts in).
    async fn play(&mut self, op: &Op) -> bool {
        match op {
            Op::Start { run } => {
                self.start_run(*run).await;
                true
            }
            Op::Decide { run, call, by } => self.decide(*run, *call, by, false).await,
            Op::Stale { run, call } => {
                let by = [(Door::Reviewer, Act::Approve)];
                self.decide(*run, *call, &by, true).await
            }
            Op::Cancel { run, running } => self.cancel(*run, *running).await,
            Op::Wait { ms } => {
                // An operation of the history: time passing is what lets deadlines expire.
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                true
            }
            Op::Reload { limit } => {
                let text = agent_file(&self.model.base_url, &self.tools.base_url, *limit);
                std::fs::write(self.agents.join("refunds.toml"), text).unwrap();
                true
            }
            Op::Kill {
                worker,
                in_flight,
                after_verdict,
            } => {
                if *after_verdict {
                    self.verdict_given().await;
                }
                self.kill(*worker, *in_flight).await;
                true
            }
            Op::RestartNats => {
                self.infra.restart_nats().await;
                true
            }
            Op::RestartRedis => {
                self.infra.restart_redis().await;
                true
            }
        }
    }

    async fn start_run(&mut self, run: usize) {
        let input = &self.obs.inputs[run];
        let body = json!({"agent": "refunds", "input": input});
        let (status, answer, _, _) = self
            .send(reqwest::Method::POST, "/v1/runs", REQUESTER_KEY, body)
            .await;
        assert_eq!(status, 202, "starting run {run}: {answer}");
        self.obs.run_ids[run] = Some(answer["run_id"].as_str().unwrap().to_string());
    }

    /// Sends a request to the gateway, again after each 503 (a server it needs is away) for
    /// a while; the last status and body, how many 503s came first, and when it was first sent.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Value,
    ) -> (u16, Value, u32, Instant) {
        let sent = Instant::now();
        let mut unavailable = 0;
        loop {
            let response = self
                .http
                .request(method.clone(), format!("{}{path}", self.gateway_url))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .expect("the gateway answers");
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            if status != 503 || sent.elapsed() > PATIENCE {
                return (status, value, unavailable, sent);
            }
            unavailable += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The run's record, when the gateway can read it.
    async fn record(&self, run_id: &str) -> Option<Value> {
        let response = self
            .http
            .get(format!("{}/v1/runs/{run_id}", self.gateway_url))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }

    /// Waits (a while at most) until the run's status is one of `statuses` or it has
    /// ended; its record then, or the last one read.
    async fn record_when(&self, run_id: &str, statuses: &[&str]) -> Option<Value> {
        let deadline = Instant::now() + OP_PATIENCE;
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(record) = self.record(run_id).await {
                let status = record["status"].as_str().unwrap_or_default();
                if statuses.contains(&status) || ended(status) {
                    return Some(record);
                }
                last = Some(record);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        last
    }

    /// A run waiting for a decision: `run` once it waits, or, while it does not (it is still
    /// thinking, or it ended), the first other started run that waits now; its index and
    /// record.
    async fn waiting_run(&self, run: usize) -> Option<(usize, Value)> {
        let count = self.obs.run_ids.len();
        let deadline = Instant::now() + OP_PATIENCE;
        while Instant::now() < deadline {
            for i in (0..count).map(|k| (run + k) % count) {
                let Some(run_id) = &self.obs.run_ids[i] else {
                    continue;
                };
                if let Some(record) = self.record(run_id).await
                    && record["status"] == "awaiting_approval"
                {
                    return Some((i, record));
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Decides the `call`-th call a run waits on (see [`Stage::waiting_run`]), through each
    /// door at once.
    async fn decide(&mut self, run: usize, call: usize, by: &[(Door, Act)], stale: bool) -> bool {
        let Some((run, record)) = self.waiting_run(run).await else {
            return false;
        };
        let run_id = self.obs.run_ids[run].clone().unwrap();
        let pending = record["pending"].as_array().cloned().unwrap_or_default();
        if pending.is_empty() {
            return false;
        }
        let held = &pending[call % pending.len()];
        let call_id = held["call_id"].as_str().unwrap().to_string();
        let shown = held["input"].clone();
        let mut digest = held["digest"].as_str().unwrap().to_string();
        if stale {
            // The digest of something else: its last digit changed.
            let last = if digest.ends_with('0') { "1" } else { "0" };
            digest.replace_range(digest.len() - 1.., last);
        }
        let answers = join_all(by.iter().map(|(door, act)| {
            let mut decision = json!({"call_id": call_id, "digest": digest, "action": act.name()});
            let runs_with = match act {
                Act::Approve => Some(shown.clone()),
                Act::Edit { amount } => {
                    decision["input"] = edited_input(&shown, *amount);
                    Some(decision["input"].clone())
                }
                Act::Reject => {
                    decision["reason"] = json!("the model check says no");
                    None
                }
            };
            // An edit to exactly what is shown (a call edited before and held again under a
            // new policy, edited to the same amount) is recorded as an approval (docs/api.md).
            let unchanged = matches!(act, Act::Edit { .. }) && decision["input"] == shown;
            let asked = Asked::Decide {
                run,
                call_id: call_id.clone(),
                principal: door.principal(),
                action: if unchanged { "approve" } else { act.name() },
                runs_with,
                stale,
            };
            self.decision(&run_id, *door, decision, asked)
        }))
        .await;
        self.obs.answers.extend(answers);
        true
    }

    /// Sends one decision through `door`; the gateway's answer.
    async fn decision(&self, run_id: &str, door: Door, decision: Value, asked: Asked) -> Answer {
        let (path, key, body) = match door {
            Door::Reviewer => (
                format!("/v1/runs/{run_id}/decisions"),
                REVIEWER_KEY,
                json!({"decisions": [decision]}),
            ),
            Door::Integration => (
                format!("/v1/runs/{run_id}/decisions"),
                INTEGRATION_KEY,
                json!({"decided_by": door.principal(), "decisions": [decision]}),
            ),
            Door::Batch => {
                let mut decision = decision;
                decision["run_id"] = json!(run_id);
                (
                    "/v1/decisions".to_string(),
                    INTEGRATION_KEY,
                    json!({"decided_by": door.principal(), "decisions": [decision]}),
                )
            }
        };
        let (mut status, body, unavailable, sent) =
            self.send(reqwest::Method::POST, &path, key, body).await;
        // The batch door answers 200 with each decision's own outcome.
        let result = match door {
            Door::Batch if status == 200 => body["results"][0].clone(),
            _ => body["decisions"][0].clone(),
        };
        let error = match door {
            Door::Batch if result["status"] == "refused" => {
                status = result["http_status"].as_u64().unwrap_or(0) as u16;
                result["error"].clone()
            }
            _ => body["error"].clone(),
        };
        Answer {
            asked,
            sent,
            at: Instant::now(),
            status,
            code: error["code"].as_str().map(str::to_string),
            said: match error["message"].as_str() {
                Some(message) => message.to_string(),
                None => result["status"].as_str().unwrap_or_default().to_string(),
            },
            unavailable,
        }
    }

    /// The requester cancels the run, at once or once a worker drives it.
    async fn cancel(&mut self, run: usize, running: bool) -> bool {
        let Some(run_id) = self.obs.run_ids[run].clone() else {
            return false;
        };
        if running {
            self.record_when(&run_id, &["running", "resuming"]).await;
        }
        let path = format!("/v1/runs/{run_id}/cancel");
        let (status, body, unavailable, sent) = self
            .send(
                reqwest::Method::POST,
                &path,
                REQUESTER_KEY,
                json!({"reason": "model check"}),
            )
            .await;
        self.obs.answers.push(Answer {
            asked: Asked::Cancel { run },
            sent,
            at: Instant::now(),
            status,
            code: body["error"]["code"].as_str().map(str::to_string),
            said: body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            unavailable,
        });
        true
    }

    /// Waits (a while at most) until the reviewer model gives its next verdict.
    async fn verdict_given(&self) {
        let since = Instant::now();
        let deadline = since + OP_PATIENCE;
        while Instant::now() < deadline {
            let given = {
                let log = self.model_log.lock().unwrap();
                log.iter().any(|a| a.review && a.at > since)
            };
            if given {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGKILLs a worker process, the one sending a tool request if asked and one does
    /// within a while, and starts another in its place.
    async fn kill(&mut self, worker: usize, in_flight: bool) {
        let mut victim = worker % self.workers.len();
        if in_flight {
            let deadline = Instant::now() + OP_PATIENCE;
            while Instant::now() < deadline {
                let pids: Vec<u32> = self.workers.iter().filter_map(Child::id).collect();
                let sender = self
                    .tools
                    .in_flight()
                    .and_then(|peer| procs::owner_of(peer, &pids));
                if let Some(pid) = sender {
                    victim = self
                        .workers
                        .iter()
                        .position(|w| w.id() == Some(pid))
                        .unwrap();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let child = &mut self.workers[victim];
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        self.workers[victim] = self.spawn_worker();
    }

    /// Waits until every run started has ended, or for [`END_PATIENCE`] at most.
    async fn wait_for_the_end(&mut self) {
        let deadline = Instant::now() + END_PATIENCE;
        let started: Vec<(usize, String)> = self
            .obs
            .run_ids
            .iter()
            .enumerate()
            .filter_map(|(i, id)| Some((i, id.clone()?)))
            .collect();
        loop {
            let mut open = Vec::new();
            for (run, id) in &started {
                let status = match self.record(id).await {
                    Some(record) => record["status"].as_str().unwrap_or_default().to_string(),
                    None => "unreadable".into(),
                };
                if !ended(&status) {
                    open.push((*run, status));
                }
            }
            if open.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                self.obs.unfinished = open;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.obs.indexed = self.indexed().await;
        for (run, run_id) in started {
            let record = self.record(&run_id).await.unwrap_or(Value::Null);
            let trail = match self
                .http
                .get(format!("{}/v1/runs/{run_id}/audit", self.gateway_url))
                .bearer_auth(ADMIN_KEY)
                .send()
                .await
            {
                Ok(response) => response.json().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            };
            let status = record["status"]
                .as_str()
                .unwrap_or("unreadable")
                .to_string();
            *self.totals.runs.entry(status).or_default() += 1;
            for entry in trail["entries"].as_array().into_iter().flatten() {
                let entry = &entry["entry"];
                match entry["kind"].as_str() {
                    Some("reviewer_verdict") => {
                        let verdict = entry["detail"]["verdict"].as_str().unwrap_or_default();
                        *self.totals.verdicts.entry(verdict.into()).or_default() += 1;
                    }
                    Some("decided")
                        if entry["actor"]
                            .as_str()
                            .is_some_and(|a| a.starts_with("model:")) =>
                    {
                        self.totals.model_decided += 1;
                    }
                    _ => {}
                }
            }
            self.obs.ended.push(Ended {
                run,
                run_id,
                record,
                trail,
            });
        }
    }

    /// What the shards' indexes of waiting hold now: (index, member).
    async fn indexed(&self) -> Vec<(String, String)> {
        let keys = Keys::of(&Names::new(&self.namespace).unwrap());
        let mut redis = self.infra.redis().await;
        let mut found = Vec::new();
        for shard in Shard::all() {
            let [_, awaiting, deadlines, reminders] = keys.shard_keys(shard);
            for (index, key) in [
                ("awaiting", awaiting),
                ("deadlines", deadlines),
                ("reminders", reminders),
            ] {
                let members: Vec<String> = redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut redis)
                    .await
                    .expect("Redis answers once the history is over");
                found.extend(members.into_iter().map(|m| (index.to_string(), m)));
            }
        }
        found
    }

    /// Stops the workers and the gateway and hands over what was observed.
    async fn stop(mut self) -> (Observations, Totals) {
        for worker in &mut self.workers {
            let _ = worker.start_kill();
            let _ = worker.wait().await;
        }
        self.gateway.cancel();
        let _ = self.gateway_task.await;
        // Each AUDIT stream reserves its byte limit of the server's storage: the history's
        // streams go, so the next history starts on a NATS as empty as this one did.
        let js = self.infra.jetstream().await;
        for stream in Names::new(&self.namespace).unwrap().streams() {
            let _ = js.delete_stream(&stream).await;
        }
        self.infra.forget_namespace(&self.namespace);
        let _ = std::fs::remove_dir_all(&self.dir);
        self.obs.tools = self.tools.requests();
        self.obs.model = self.model_log.lock().unwrap().clone();
        self.totals.tool_requests = self.obs.tools.len();
        self.totals.model_answers = self.obs.model.len();
        for answer in &self.obs.answers {
            *self.totals.answers.entry(answer.status).or_default() += 1;
        }
        (self.obs, self.totals)
    }
}

fn ended(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}
