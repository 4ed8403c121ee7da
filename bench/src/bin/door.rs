//! `cargo run --release -p countersign-bench --bin door [ASKS] [--bin-dir DIR]`: what the door
//! of agents written in code adds to a call that needs no person, against real NATS and Redis
//! and the services' release binaries (build them first: `cargo build --release -p
//! approval-gateway -p agent-worker`).
//!
//! One ask at a time, each with its own idempotency key, the external agent `desk` asks
//! `POST /v1/agents/desk/calls` for a call its policy lets through, and the answer (`200`,
//! `allowed`) is timed: a $5 refund countersign runs on the demo refunds service (the answer
//! carries its result), and a note the agent runs itself (released, the answer says it may).
//! Then the same refund sent straight to the refunds service, the cost without countersign.
//! Printed: latency percentiles of each, the asks per second, and the CPU time per ask of the
//! gateway, the worker, NATS and Redis (`/proc/<pid>/stat`).

use countersign_bench::measure::{self, Percentiles};
use countersign_bench::servers::{self, Infra, Proc, REQUESTER_KEY, Shared, System};
use countersign_local::demo_tools::DemoTools;
use serde_json::{Value, json};
use std::time::Instant;

const AGENT: &str = "desk";

/// Asks made before measuring, so connections and caches are warm.
const WARM_UP: usize = 20;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (asks, bin_dir) = servers::count_and_bin_dir(500)?;
    if cfg!(debug_assertions) {
        eprintln!("warning: a debug build of the load generator; figures want --release");
    }
    let dir = std::env::temp_dir().join(format!("countersign-door-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let infra = Infra::start(None, None, &dir).await?;
    let tools = DemoTools::serve(tokio::net::TcpListener::bind("127.0.0.1:0").await?)?;
    let agents_dir = dir.join("agents");
    std::fs::create_dir_all(&agents_dir)?;
    std::fs::write(
        agents_dir.join(format!("{AGENT}.toml")),
        agent_file(&tools.base_url),
    )?;
    let shared = Shared {
        nats_url: &infra.nats_url,
        redis_url: &infra.redis_url,
        namespace: "",
        agents_dir: &agents_dir,
        log_level: "warn",
        otlp: None,
    };
    let system = System::start(&bin_dir, &dir, &shared, 1, None).await?;
    let http = reqwest::Client::new();
    let door = Door {
        http: &http,
        url: format!("{}/v1/agents/{AGENT}/calls", system.gateway_url),
    };
    let refund = json!({"tool": "issue_refund", "input": {"order_id": "A-1001", "amount": 5, "reason": "late"}});
    let note =
        json!({"tool": "note_customer", "input": {"customer": "ana", "note": "prefers email"}});

    for i in 0..WARM_UP {
        door.ask(&format!("warm-{i}"), &refund, "countersign")
            .await?;
    }
    let procs: Vec<&Proc> = [&system.gateway, &system.workers[0]]
        .into_iter()
        .chain(infra.nats.iter())
        .chain(infra.redis.iter())
        .collect();
    let clock = measure::clock_ticks_per_sec();
    let cpu = Cpu::read(&procs)?;
    let started = Instant::now();
    let mut ran = Vec::with_capacity(asks);
    for i in 0..asks {
        ran.push(
            door.ask(&format!("refund-{i}"), &refund, "countersign")
                .await?,
        );
    }
    let ran_per_sec = asks as f64 / started.elapsed().as_secs_f64();
    let ran_cpu = cpu.since(&procs, clock, asks)?;
    let cpu = Cpu::read(&procs)?;
    let mut released = Vec::with_capacity(asks);
    for i in 0..asks {
        released.push(door.ask(&format!("note-{i}"), &note, "agent").await?);
    }
    let released_cpu = cpu.since(&procs, clock, asks)?;
    let mut direct = Vec::with_capacity(asks);
    for i in 0..asks {
        let started = Instant::now();
        let answer = http
            .post(format!("{}/refunds", tools.base_url))
            .header("Idempotency-Key", format!("direct-{i}"))
            .json(&refund["input"])
            .send()
            .await?;
        anyhow::ensure!(
            answer.status().is_success(),
            "the refunds service answered {}",
            answer.status()
        );
        answer.bytes().await?;
        direct.push(started.elapsed().as_micros() as u64);
    }

    println!("{asks} asks one at a time, each a call its policy lets through:");
    let line = |what: &str, micros: Vec<u64>| {
        let p = Percentiles::of(micros);
        println!(
            "  {what:<44} p50 {:>7.2} ms  p99 {:>7.2} ms  mean {:>7.2} ms",
            p.p50_ms, p.p99_ms, p.mean_ms
        );
    };
    line("refund run by countersign (answer has result)", ran);
    line("note released to the agent", released);
    line("refund sent straight to the tool", direct);
    println!("  refunds through the door: {ran_per_sec:.0} asks/s");
    println!("CPU-ms per ask (the tool's own work is not in it):");
    let names: Vec<&str> = procs.iter().map(|p| p.name.as_str()).collect();
    for (what, per_process) in [("refund run", ran_cpu), ("note released", released_cpu)] {
        let each: Vec<String> = names
            .iter()
            .zip(&per_process)
            .map(|(name, ms)| format!("{name} {ms:.2}"))
            .collect();
        let total: f64 = per_process.iter().sum();
        println!("  {what:<14} {}, total {total:.2}", each.join(", "));
    }
    Ok(())
}

/// The CPU ticks of each process at one moment.
struct Cpu(Vec<u64>);

impl Cpu {
    fn read(procs: &[&Proc]) -> anyhow::Result<Self> {
        procs
            .iter()
            .map(|p| measure::process_ticks(p.pid))
            .collect::<anyhow::Result<_>>()
            .map(Self)
    }

    /// CPU-ms per ask of each process since this reading, over `asks` asks.
    fn since(&self, procs: &[&Proc], clock: u64, asks: usize) -> anyhow::Result<Vec<f64>> {
        let now = Self::read(procs)?;
        Ok(self
            .0
            .iter()
            .zip(now.0)
            .map(|(before, after)| (after - before) as f64 * 1000.0 / clock as f64 / asks as f64)
            .collect())
    }
}

/// The external agent: a refund countersign runs (held over $20), a note the agent runs.
fn agent_file(tools_url: &str) -> String {
    format!(
        r#"name = "{AGENT}"

[model]
provider = "external"

[[tools]]
name = "issue_refund"
input_schema = {{ type = "object", properties = {{ order_id = {{ type = "string" }}, amount = {{ type = "number" }}, reason = {{ type = "string" }} }}, required = ["order_id", "amount", "reason"] }}
http = {{ url = "{tools_url}/refunds" }}
[tools.approval]
when = "input.amount > 20.0"

[[tools]]
name = "note_customer"
input_schema = {{ type = "object", properties = {{ customer = {{ type = "string" }}, note = {{ type = "string" }} }}, required = ["customer", "note"] }}
approval = "never"
"#
    )
}

struct Door<'a> {
    http: &'a reqwest::Client,
    url: String,
}

impl Door<'_> {
    /// One ask under idempotency key `key`; its round trip in microseconds, once checked to
    /// be answered `allowed` and run by `executes`.
    async fn ask(&self, key: &str, body: &Value, executes: &str) -> anyhow::Result<u64> {
        let started = Instant::now();
        let answer = self
            .http
            .post(&self.url)
            .bearer_auth(REQUESTER_KEY)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await?;
        let status = answer.status();
        let state: Value = answer.json().await?;
        let elapsed = started.elapsed().as_micros() as u64;
        anyhow::ensure!(
            status == reqwest::StatusCode::OK
                && state["status"] == "allowed"
                && state["executes"] == executes,
            "the door answered {status}: {state}"
        );
        Ok(elapsed)
    }
}
