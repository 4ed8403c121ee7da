//! Chaos: three worker processes share a few hundred runs while a driver approves every
//! pending call and a killer SIGKILLs a random worker every half second or so and starts
//! another.
//! At the end every run is completed, and the refund tool (idempotent, as the policy says)
//! applied each approved refund exactly once.

use countersign_fake_model::refund_brain;
use countersign_tests::app::{TestApp, refunds_agent, worker_process_config_file};
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::json;
use std::collections::HashSet;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

const WORKERS: usize = 3;
/// Runs are started in waves, one wave after each kill, so every kill lands while runs are
/// in flight.
const WAVES: usize = 12;
const WAVE: usize = 25;
const RUNS: usize = WAVES * WAVE;
/// How long the whole test may take before it fails.
const LIMIT: Duration = Duration::from_secs(240);

fn random_below(n: u64) -> u64 {
    (uuid::Uuid::new_v4().as_u128() % n as u128) as u64
}

fn spawn_worker(config: &std::path::Path) -> Child {
    worker_command(config)
        .spawn()
        .expect("start a worker process")
}

/// A worker process on `config`, quiet and killed with its handle.
pub(super) fn worker_command(config: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_worker_process"));
    command
        .env("COUNTERSIGN_CONFIG", config)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

/// A config file for worker processes on the app's servers, whose refund tool is idempotent.
pub(super) fn worker_process_config(app: &TestApp) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("countersign-chaos-{}", app.namespace));
    let agents = dir.join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    let refund_url = format!("http = {{ url = \"{}/refunds\" }}", app.tools.base_url);
    let agent = refunds_agent("anthropic", &app.model.base_url, &app.tools.base_url)
        .replace(&refund_url, &format!("{refund_url}\nidempotent = true"));
    assert!(agent.contains("idempotent = true"));
    std::fs::write(agents.join("refunds.toml"), agent).unwrap();
    let config = worker_process_config_on(app, &dir, &agents);
    (dir, config)
}

/// A config file in `dir` for worker processes on the app's servers that load the agents of
/// `agents`, with short leases so a killed one's runs are taken over within seconds.
pub(super) fn worker_process_config_on(
    app: &TestApp,
    dir: &std::path::Path,
    agents: &std::path::Path,
) -> std::path::PathBuf {
    worker_process_config_file(&app.infra, &app.namespace, dir, agents, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_worker_cleanly_and_another_finishes_its_runs() {
    let app = TestApp::builder(refund_brain).workers(0).start().await;
    let (dir, config) = worker_process_config(&app);
    app.model.set_latency(Duration::from_millis(300));
    let mut first = spawn_worker(&config);
    let inputs: Vec<String> = (0..20).map(|i| format!("Graceful refund {i}.")).collect();
    let runs: Vec<String> = join_all(inputs.iter().map(|i| app.start_run(i))).await;
    // Some runs are mid-model-call when the signal comes.
    countersign_tests::wait_for(
        "the first model calls",
        countersign_tests::app::PATIENCE,
        || async { (!app.model.requests().is_empty()).then_some(()) },
    )
    .await;
    let pid = first.id().unwrap().to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(signalled.success());
    let exit = tokio::time::timeout(Duration::from_secs(30), first.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "a SIGTERMed worker exits cleanly: {exit:?}");

    let _second = spawn_worker(&config);
    let paused = join_all(
        runs.iter()
            .map(|id| app.wait_status(id, "awaiting_approval")),
    )
    .await;
    join_all(
        runs.iter()
            .zip(&paused)
            .map(|(id, run)| app.approve(id, "toolu_2", &run["pending"][0]["digest"])),
    )
    .await;
    join_all(runs.iter().map(|id| app.wait_status(id, "completed"))).await;
    assert_eq!(app.tools.refunds().len(), runs.len());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_workers_lose_no_run_and_apply_no_refund_twice() {
    let app = TestApp::builder(refund_brain).workers(0).start().await;
    let (dir, config) = worker_process_config(&app);
    let mut workers: Vec<Child> = (0..WORKERS).map(|_| spawn_worker(&config)).collect();

    app.model.set_latency(Duration::from_millis(100));

    let began = Instant::now();
    let mut runs: Vec<String> = Vec::new();
    let mut remaining: HashSet<String> = HashSet::new();
    let mut failed = Vec::new();
    let mut kills = 0;
    let mut next_kill = Instant::now();
    let mut approvals_sent = 0;
    while runs.len() < RUNS || !remaining.is_empty() {
        assert!(
            began.elapsed() < LIMIT,
            "{} runs still unfinished after {LIMIT:?}",
            remaining.len()
        );
        if runs.len() < RUNS && Instant::now() >= next_kill {
            if !runs.is_empty() {
                let victim = random_below(WORKERS as u64) as usize;
                workers[victim].kill().await.unwrap();
                workers[victim] = spawn_worker(&config);
                kills += 1;
            }
            let wave: Vec<String> = (runs.len()..runs.len() + WAVE)
                .map(|i| format!("Chaos refund {i}."))
                .collect();
            let started = join_all(wave.iter().map(|input| app.start_run(input))).await;
            remaining.extend(started.iter().cloned());
            runs.extend(started);
            next_kill = Instant::now() + Duration::from_millis(300 + random_below(500));
        }
        // The driver: approve whatever waits.
        let (status, inbox) = app.get("/v1/approvals?status=pending&limit=500").await;
        assert_eq!(status, StatusCode::OK);
        let pending = inbox["approvals"].as_array().unwrap().clone();
        approvals_sent += pending.len();
        let app = &app;
        join_all(pending.iter().map(|a| {
            let decision =
                json!([{"call_id": a["call_id"], "digest": a["digest"], "action": "approve"}]);
            let run_id = a["run_id"].as_str().unwrap().to_string();
            async move { app.decide(&run_id, decision).await }
        }))
        .await;
        // Which runs have finished.
        let ids: Vec<String> = remaining.iter().cloned().collect();
        let states = join_all(ids.iter().map(|id| app.get_run_status(id))).await;
        for (id, status) in ids.iter().zip(states) {
            match status.as_str() {
                "completed" => {
                    remaining.remove(id);
                }
                "failed" => {
                    remaining.remove(id);
                    failed.push(id.clone());
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = began.elapsed();
    for worker in &mut workers {
        worker.kill().await.unwrap();
    }

    let refunds = app.tools.refunds();
    let by_key = app.tools.received_by_key("/refunds");
    let resent = by_key.values().filter(|n| **n > 1).count();
    let missing: Vec<&String> = runs
        .iter()
        .filter(|id| !by_key.contains_key(&format!("{id}:1:toolu_2")))
        .collect();
    println!(
        "chaos: {RUNS} runs, {WORKERS} workers, {kills} SIGKILLs, {} approvals sent, {} completed, \
         {} failed, 0 lost, {} refunds applied ({} duplicated), {resent} refunds re-sent with the \
         same key after a kill, {} model calls, {elapsed:?}",
        approvals_sent,
        RUNS - failed.len(),
        failed.len(),
        refunds.len(),
        refunds.len().saturating_sub(RUNS),
        app.model.requests().len(),
    );
    assert!(failed.is_empty(), "failed runs: {failed:?}");
    assert!(
        missing.is_empty(),
        "runs whose refund never reached the tool: {missing:?}"
    );
    assert_eq!(
        refunds.len(),
        RUNS,
        "each approved refund applied exactly once"
    );
    assert_eq!(kills, WAVES - 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker that finished its runs counts none in flight when it stops, and its log lines,
/// written to a pipe, carry no colour codes.
#[tokio::test]
async fn a_stopped_worker_with_nothing_running_says_none_in_flight_in_plain_text() {
    let app = TestApp::builder(refund_brain).workers(0).start().await;
    let (dir, config) = worker_process_config(&app);
    let mut worker = worker_command(&config)
        .env("RUST_LOG", "agent_worker=info,countersign_runtime=info")
        .env_remove("NO_COLOR")
        .env_remove("LOG_FORMAT")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let run = app.start_run("Refund order A-1.").await;
    app.wait_status(&run, "awaiting_approval").await;
    let pid = worker.id().unwrap().to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(signalled.success());
    let mut log = String::new();
    let mut stdout = worker.stdout.take().unwrap();
    tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut log)
        .await
        .unwrap();
    let exit = worker.wait().await.unwrap();
    assert!(exit.success(), "{exit:?}\n{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a pipe:\n{log}");
    let stopping = log
        .lines()
        .find(|l| l.contains("stopping: no new work taken"))
        .unwrap_or_else(|| panic!("no stopping line in:\n{log}"));
    assert!(stopping.contains("in_flight=0"), "{stopping}");
    let _ = std::fs::remove_dir_all(&dir);
}
