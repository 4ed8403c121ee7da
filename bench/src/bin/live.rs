//! `cargo run --release -p countersign-bench --bin live [RUNS] [--bin-dir DIR]`: what following
//! a run live costs, against real NATS and Redis and the services' release binaries (build
//! them first: `cargo build --release -p approval-gateway -p agent-worker`).
//!
//! One run at a time, a client follows each refund run from its start (`GET
//! /v1/runs/{id}/events`) while the fake model writes its text a word every 20 ms, as a model's
//! tokens come; the reviewer approves at the pause and the client reads to the end. Printed: the
//! delay from the model writing a piece of text to the client receiving it (percentiles), the
//! events and the `LIVE` stream's bytes per run; then the gateway's resident memory with many
//! clients following one waiting run, per client.

use countersign_bench::measure::rss_kib;
use countersign_bench::servers::{self, AGENT, Infra, REQUESTER_KEY, REVIEWER_KEY, Shared, System};
use countersign_fake_model::{FakeModel, REFUND_SCRIPT};
use countersign_local::demo_tools::DemoTools;
use countersign_model::sse::Decoder;
use countersign_runtime::names::Names;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// How far apart the fake model writes its pieces of text.
const PACE: Duration = Duration::from_millis(20);
/// Clients following one waiting run, for the memory figure.
const FOLLOWERS: usize = 500;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (runs, bin_dir) = servers::count_and_bin_dir(200)?;
    let dir = std::env::temp_dir().join(format!("countersign-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let infra = Infra::start(None, None, &dir).await?;
    let model = FakeModel::start(&*REFUND_SCRIPT).await;
    model.pace_streams(PACE);
    let tools = DemoTools::serve(tokio::net::TcpListener::bind("127.0.0.1:0").await?)?;
    let agents_dir = dir.join("agents");
    servers::write_agent(&agents_dir, &model.base_url, &tools.base_url)?;
    let shared = Shared {
        nats_url: &infra.nats_url,
        redis_url: &infra.redis_url,
        namespace: "",
        agents_dir: &agents_dir,
        log_level: "warn",
        otlp: None,
    };
    let system = System::start(&bin_dir, &dir, &shared, 1, None).await?;
    let client = Client {
        http: reqwest::Client::new(),
        base: system.gateway_url.clone(),
    };

    let mut delays = Vec::new();
    let mut events = 0;
    for _ in 0..runs {
        let written_before = model.texts_written().len();
        let run = client.start().await?;
        let received = client.follow_approving(&run).await?;
        events += received.events;
        let written = &model.texts_written()[written_before..];
        delays.extend(delays_of(written, &received.texts)?);
    }
    delays.sort();
    let at = |q: f64| delays[((delays.len() - 1) as f64 * q) as usize].as_secs_f64() * 1000.0;
    println!(
        "{runs} runs followed one at a time, {} pieces of text {} ms apart",
        delays.len(),
        PACE.as_millis()
    );
    println!(
        "model wrote a piece -> client received it: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        at(0.5),
        at(0.99),
        at(1.0)
    );
    let live = stream_bytes(&infra.nats_url).await?;
    println!(
        "events per run {:.1}; LIVE stream bytes per run {:.0}",
        events as f64 / runs as f64,
        live as f64 / runs as f64
    );

    // Many clients following one run that waits for a person.
    let run = client.start().await?;
    let mut first = client.open(&run).await?;
    let mut decoder = Decoder::default();
    'paused: while let Some(bytes) = first.chunk().await? {
        for event in decoder.push(&bytes) {
            if event.event == "approval.requested" {
                break 'paused;
            }
        }
    }
    let before = rss_kib(system.gateway.pid)?;
    let mut followers = Vec::with_capacity(FOLLOWERS);
    for _ in 0..FOLLOWERS {
        let mut answer = client.open(&run).await?;
        // Read what is there, and keep the connection open and read.
        followers.push(tokio::spawn(async move {
            while let Ok(Some(_)) = answer.chunk().await {}
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(system.gateway.pid)?;
    println!(
        "gateway resident memory with {FOLLOWERS} clients following a waiting run: {} KiB more, {:.1} KiB a client",
        after.saturating_sub(before),
        after.saturating_sub(before) as f64 / FOLLOWERS as f64
    );
    for follower in followers {
        follower.abort();
    }
    Ok(())
}

struct Client {
    http: reqwest::Client,
    base: String,
}

/// What a client received of one run: the text pieces, each with when, and how many events.
struct Received {
    texts: Vec<(Instant, String)>,
    events: usize,
}

impl Client {
    async fn start(&self) -> anyhow::Result<String> {
        let answer = self
            .http
            .post(format!("{}/v1/runs", self.base))
            .bearer_auth(REQUESTER_KEY)
            .json(&json!({"agent": AGENT, "input": "Refund A-1001, it arrived broken."}))
            .send()
            .await?
            .error_for_status()?;
        let body: Value = answer.json().await?;
        Ok(body["run_id"].as_str().unwrap_or_default().to_string())
    }

    async fn open(&self, run: &str) -> anyhow::Result<reqwest::Response> {
        Ok(self
            .http
            .get(format!("{}/v1/runs/{run}/events", self.base))
            .bearer_auth(REQUESTER_KEY)
            .send()
            .await?
            .error_for_status()?)
    }

    /// Follows the run to its end, approving its refund when it pauses.
    async fn follow_approving(&self, run: &str) -> anyhow::Result<Received> {
        let mut answer = self.open(run).await?;
        let mut decoder = Decoder::default();
        let mut received = Received {
            texts: Vec::new(),
            events: 0,
        };
        while let Some(bytes) = answer.chunk().await? {
            let now = Instant::now();
            for event in decoder.push(&bytes) {
                received.events += 1;
                let data: Value = serde_json::from_str(&event.data)?;
                match event.event.as_str() {
                    "text.delta" => received
                        .texts
                        .push((now, data["text"].as_str().unwrap_or_default().into())),
                    "approval.requested" => self.approve(run, &data).await?,
                    _ => {}
                }
            }
        }
        Ok(received)
    }

    async fn approve(&self, run: &str, requested: &Value) -> anyhow::Result<()> {
        let call = &requested["calls"][0];
        self.http
            .post(format!("{}/v1/runs/{run}/decisions", self.base))
            .bearer_auth(REVIEWER_KEY)
            .json(&json!({"decisions": [{"call_id": call["call_id"], "digest": call["digest"], "action": "approve"}]}))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }
}

/// For each piece the client received: how long after the model wrote it (a received piece
/// may join several written ones, which the worker sends together; it counts from the last).
fn delays_of(
    written: &[(Instant, String)],
    received: &[(Instant, String)],
) -> anyhow::Result<Vec<Duration>> {
    let mut written = written.iter();
    let mut delays = Vec::new();
    for (at, text) in received {
        let mut joined = String::new();
        let mut last = None;
        while joined.len() < text.len() {
            let (written_at, piece) = written
                .next()
                .ok_or_else(|| anyhow::anyhow!("the client received text the model never wrote"))?;
            joined.push_str(piece);
            last = Some(*written_at);
        }
        anyhow::ensure!(&joined == text, "received {text:?}, written {joined:?}");
        delays.extend(last.map(|w| at.saturating_duration_since(w)));
    }
    Ok(delays)
}

/// The bytes the `LIVE` stream holds.
async fn stream_bytes(nats_url: &str) -> anyhow::Result<u64> {
    let js = async_nats::jetstream::new(async_nats::connect(nats_url).await?);
    let mut stream = js.get_stream(Names::new("")?.live_stream()).await?;
    Ok(stream.info().await?.state.bytes)
}
