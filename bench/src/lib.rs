//! The refund scenario under load, against real NATS and Redis and the services' release
//! binaries as separate processes. See `BENCHMARKS.md` for the command and the figures.
//!
//! For each worker count: fresh servers (or a fresh namespace on given ones), a gateway and
//! the workers; then, per level of runs in flight, a warm-up and a measured window whose CPU
//! time per process comes from `/proc/<pid>/stat`; then what completed runs left in Redis and
//! JetStream; with the first worker count, many runs left paused and a new run's cycle while
//! they wait. Every cycle is checked (paused before the refund, refund requested exactly
//! once, completed with the model's answer), and all runs again at the end.

// Support code for its own tests and binaries, read beside its uses: never a library for others.
#![allow(missing_docs)]

pub mod config;
pub mod fakes;
pub mod load;
pub mod measure;
pub mod report;
pub mod servers;

use anyhow::Context;
use config::Options;
use countersign_model::run::RunId;
use countersign_runtime::names::Names;
use countersign_store::keys::Keys;
use fakes::Fakes;
use load::{Load, Times};
use measure::Percentiles;
use report::{CompletedRuns, Cpu, Latency, Level, Report, SystemReport, Waiting, WorkerRss};
use servers::{Infra, Shared, System};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs with this many in flight leave the waiting runs paused.
const FILL_CONCURRENCY: usize = 256;
/// Runs sampled for `MEMORY USAGE`.
const MEMORY_SAMPLE: usize = 50;
/// How long the system is left alone before memory is read and before the final check.
const SETTLE: Duration = Duration::from_secs(2);
/// How long idle CPU is measured before the first level.
const IDLE_WINDOW: Duration = Duration::from_secs(5);

/// Runs the whole benchmark and returns its figures; `report.violations` lists every check
/// that failed.
pub async fn run(options: Options) -> anyhow::Result<Report> {
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let bin_dir = servers::bin_dir(options.bin_dir.as_deref())?;
    if options.build {
        servers::build_services(&bin_dir)?;
    }
    let work_dir = options.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("countersign-bench-{}", std::process::id()))
    });
    std::fs::create_dir_all(&work_dir).with_context(|| format!("create {}", work_dir.display()))?;
    eprintln!("configs, logs and data under {}", work_dir.display());

    let mut report = Report {
        started_at,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        commit: commit(),
        machine: measure::Machine::read(),
        load_average_after: String::new(),
        versions: report::Versions {
            nats_server: measure::version_of(&servers::program("nats-server"), &["--version"]),
            redis_server: measure::version_of(&servers::program("redis-server"), &["--version"]),
            rustc: measure::version_of(Path::new("rustc"), &["--version"]),
        },
        options: options.clone(),
        servers_started_here: options.nats_url.is_none() && options.redis_url.is_none(),
        systems: Vec::new(),
        runs_checked: report::RunsChecked::default(),
        stray_events: 0,
        unparsed_messages: 0,
        violations: Vec::new(),
    };
    let fakes = Arc::new(Fakes::start(2)?);
    let clock = measure::clock_ticks_per_sec();

    for (i, &workers) in options.workers.iter().enumerate() {
        let dir = work_dir.join(format!("workers-{workers}-{i}"));
        std::fs::create_dir_all(&dir)?;
        let bench = SystemBench::start(&options, &dir, &fakes, workers, clock).await?;
        // The waiting runs and the profile are taken with the first worker count only.
        let (system, load) = bench.measure(&options, i == 0).await?;
        let (completed, paused) = load.runs_checked();
        report.runs_checked.completed += completed;
        report.runs_checked.paused += paused;
        let (stray, unparsed) = load.hub().leftovers();
        report.stray_events += stray;
        report.unparsed_messages += unparsed;
        report.violations.extend(load.violations());
        report.systems.push(system);
        if !report.violations.is_empty() {
            break;
        }
    }
    report.load_average_after = measure::load_average();
    // A folder the caller named is theirs to remove.
    if report.violations.is_empty() && !options.keep && options.work_dir.is_none() {
        let _ = std::fs::remove_dir_all(&work_dir);
    } else {
        eprintln!("kept {} (logs of every process)", work_dir.display());
    }
    Ok(report)
}

/// One system under test and what measures it.
struct SystemBench {
    // Dropped in this order: the services first, then the servers they use.
    system: System,
    infra: Infra,
    load: Arc<Load>,
    redis: redis::aio::MultiplexedConnection,
    jetstream: async_nats::jetstream::Context,
    names: Names,
    clock: u64,
}

impl SystemBench {
    async fn start(
        options: &Options,
        dir: &Path,
        fakes: &Arc<Fakes>,
        workers: usize,
        clock: u64,
    ) -> anyhow::Result<Self> {
        eprintln!("starting {workers} worker(s)");
        let infra = Infra::start(
            options.nats_url.as_deref(),
            options.redis_url.as_deref(),
            dir,
        )
        .await?;
        // On servers of our own the documented names; on given ones, a namespace of our own.
        let namespace = if infra.nats.is_some() && infra.redis.is_some() {
            String::new()
        } else {
            format!("bench_{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
        };
        let names = Names::new(&namespace)?;
        let agents_dir: PathBuf = dir.join("agents");
        servers::write_agent(&agents_dir, &fakes.model_url, &fakes.tools_url)?;
        let bin_dir = servers::bin_dir(options.bin_dir.as_deref())?;
        let system = System::start(
            &bin_dir,
            dir,
            &Shared {
                nats_url: &infra.nats_url,
                redis_url: &infra.redis_url,
                namespace: &namespace,
                agents_dir: &agents_dir,
                log_level: &options.log_level,
                otlp: options.otlp.then_some(fakes.tools_url.as_str()),
            },
            workers,
            options.worker_concurrency,
        )
        .await?;
        let load = Load::connect(
            &infra.nats_url,
            &names,
            &system.gateway_url,
            fakes.clone(),
            options.digest_from,
            options.timeout,
        )
        .await?;
        let redis = redis::Client::open(infra.redis_url.as_str())?
            .get_multiplexed_async_connection()
            .await
            .context("connect to Redis")?;
        let jetstream = async_nats::jetstream::new(async_nats::connect(&infra.nats_url).await?);
        Ok(Self {
            system,
            infra,
            load,
            redis,
            jetstream,
            names,
            clock,
        })
    }

    async fn measure(
        mut self,
        options: &Options,
        first: bool,
    ) -> anyhow::Result<(SystemReport, Arc<Load>)> {
        let workers = self.system.workers.len();
        let idle = self.idle().await?;
        let rss_at_start = self.worker_rss();
        let used_before = measure::redis_used_memory(&mut self.redis).await?;
        let js_before = self.jetstream_bytes().await;

        let mut levels = Vec::new();
        for &concurrency in &options.concurrency {
            let perf = options
                .perf
                .as_deref()
                .filter(|_| first)
                .filter(|_| concurrency == options.perf_level);
            let level = self
                .level(concurrency, options.warmup, options.cycles, perf)
                .await?;
            eprintln!(
                "{workers} worker(s), {concurrency} in flight: {:.0} cycles/s, {:.2} CPU-ms per cycle, cycle p50 {:.2} ms",
                level.cycles_per_sec, level.cpu_ms_per_cycle.total, level.latency.cycle.p50_ms
            );
            levels.push(level);
            if !self.load.violations().is_empty() {
                break;
            }
        }

        tokio::time::sleep(SETTLE).await;
        let runs = self.load.runs_checked().0;
        let used_after = measure::redis_used_memory(&mut self.redis).await?;
        let js_after = self.jetstream_bytes().await;
        let (completed_sample, _) = self.load.sample_runs(MEMORY_SAMPLE);
        let (jetstream_per_run, jetstream_by_stream) = per_stream(&js_before, &js_after, runs);
        let completed = CompletedRuns {
            runs,
            redis_bytes_per_run_used_memory: per(used_after as f64 - used_before as f64, runs),
            redis_bytes_per_run_memory_usage: self.memory_usage(&completed_sample).await?,
            jetstream_bytes_per_run: jetstream_per_run,
            jetstream_bytes_per_run_by_stream: jetstream_by_stream,
        };
        let worker_rss_kib = WorkerRss {
            at_start: rss_at_start,
            after_levels: self.worker_rss(),
        };

        let waiting = if first && options.waiting > 0 && self.load.violations().is_empty() {
            Some(self.waiting(options).await?)
        } else {
            None
        };

        tokio::time::sleep(SETTLE).await;
        self.load.recheck();
        self.system.check_alive()?;
        self.infra.check_alive()?;
        let load = self.load.clone();
        Ok((
            SystemReport {
                workers,
                idle_cpu_ms_per_sec: idle,
                levels,
                completed,
                worker_rss_kib,
                waiting,
            },
            load,
        ))
    }

    /// A warm-up, then `cycles` measured cycles with `concurrency` in flight.
    /// With `perf`, the gateway and the first worker are sampled during the measured window
    /// into that folder.
    async fn level(
        &mut self,
        concurrency: usize,
        warmup: usize,
        cycles: usize,
        perf: Option<&Path>,
    ) -> anyhow::Result<Level> {
        if warmup > 0 {
            self.load.cycles(concurrency, warmup).await;
        }
        let mut recorders = Vec::new();
        if let Some(dir) = perf {
            std::fs::create_dir_all(dir)?;
            let targets = std::iter::once(("gateway", self.system.gateway.pid))
                .chain(self.system.workers.first().map(|w| ("worker-1", w.pid)));
            for (name, pid) in targets {
                recorders.push(servers::perf_record(
                    pid,
                    &dir.join(format!("{name}-{concurrency}.perf.data")),
                    &dir.join(format!("{name}-{concurrency}.perf.log")),
                )?);
            }
            // perf needs a moment to attach before the window opens.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let commands_before = measure::redis_command_calls(&mut self.redis).await?;
        let before = self.snapshot()?;
        let times = self.load.cycles(concurrency, cycles).await;
        let after = self.snapshot()?;
        let commands_after = measure::redis_command_calls(&mut self.redis).await?;
        for mut recorder in recorders {
            recorder.stop();
        }
        self.system.check_alive()?;
        self.infra.check_alive()?;
        let mut level = level(concurrency, &times, &before, &after, self.clock);
        // Includes the two INFO calls that read it, and whatever the sweeps ran meanwhile.
        level.redis_commands_per_cycle = commands_after
            .iter()
            .filter_map(|(name, &a)| {
                let b = commands_before.get(name).copied().unwrap_or(0);
                let per = per(a.saturating_sub(b) as f64, level.cycles)?;
                (per > 0.0).then(|| (name.clone(), (per * 100.0).round() / 100.0))
            })
            .collect();
        Ok(level)
    }

    /// CPU time each process spends per second with no run going: the sweeps and
    /// housekeeping that one cycle at a time pays for alone, and many share.
    async fn idle(&self) -> anyhow::Result<Cpu> {
        tokio::time::sleep(SETTLE).await;
        let before = self.snapshot()?;
        tokio::time::sleep(IDLE_WINDOW).await;
        let after = self.snapshot()?;
        let seconds = after.at.duration_since(before.at).as_secs_f64();
        Ok(cpu(&before, &after, self.clock, seconds))
    }

    /// Leaves `options.waiting` runs paused, reads what they cost, and measures a new run's
    /// cycle while they wait.
    async fn waiting(&mut self, options: &Options) -> anyhow::Result<Waiting> {
        eprintln!("leaving {} runs paused", options.waiting);
        tokio::time::sleep(SETTLE).await;
        let used_before = measure::redis_used_memory(&mut self.redis).await?;
        let js_before = self.jetstream_bytes().await;
        let rss_before = self.worker_rss();
        let started = Instant::now();
        let runs = self
            .load
            .leave_paused(FILL_CONCURRENCY, options.waiting)
            .await;
        let fill_seconds = started.elapsed().as_secs_f64();
        tokio::time::sleep(SETTLE).await;
        let used_after = measure::redis_used_memory(&mut self.redis).await?;
        let js_after = self.jetstream_bytes().await;
        let (_, paused_sample) = self.load.sample_runs(MEMORY_SAMPLE);
        let memory_usage = self.memory_usage(&paused_sample).await?;
        eprintln!(
            "{runs} runs paused in {fill_seconds:.1} s; measuring one run at a time while they wait"
        );
        let probe = self
            .level(
                1,
                options.warmup.min(100),
                options.waiting_probe.max(1),
                None,
            )
            .await?;
        // Well after the fill (the outbox sweeps look at marks older than five seconds), so
        // this is what waiting runs cost while nothing happens.
        let idle = self.idle().await?;
        let (jetstream_per_run, jetstream_by_stream) = per_stream(&js_before, &js_after, runs);
        Ok(Waiting {
            runs,
            fill_seconds,
            redis_used_memory_before: used_before,
            redis_used_memory_after: used_after,
            redis_bytes_per_paused_run_used_memory: per(
                used_after as f64 - used_before as f64,
                runs,
            )
            .unwrap_or(0.0),
            redis_bytes_per_paused_run_memory_usage: memory_usage,
            jetstream_bytes_per_paused_run: jetstream_per_run,
            jetstream_bytes_per_paused_run_by_stream: jetstream_by_stream,
            idle_cpu_ms_per_sec: idle,
            worker_rss_kib_before: rss_before,
            worker_rss_kib_after: self.worker_rss(),
            probe,
        })
    }

    fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let countersign: Vec<u32> = std::iter::once(self.system.gateway.pid)
            .chain(self.system.workers.iter().map(|w| w.pid))
            .collect();
        Ok(Snapshot {
            at: Instant::now(),
            gateway: measure::process_ticks(self.system.gateway.pid)?,
            workers: self
                .system
                .workers
                .iter()
                .map(|w| measure::process_ticks(w.pid))
                .collect::<anyhow::Result<_>>()?,
            nats: self
                .infra
                .nats
                .as_ref()
                .map(|p| measure::process_ticks(p.pid))
                .transpose()?,
            redis: self
                .infra
                .redis
                .as_ref()
                .map(|p| measure::process_ticks(p.pid))
                .transpose()?,
            load_generator: measure::own_threads_ticks(load::THREADS),
            fakes: measure::own_threads_ticks(fakes::THREADS),
            context_switches: countersign.into_iter().map(measure::context_switches).sum(),
        })
    }

    fn worker_rss(&self) -> Vec<u64> {
        self.system
            .workers
            .iter()
            .map(|w| measure::rss_kib(w.pid).unwrap_or(0))
            .collect()
    }

    /// The bytes of each of the deployment's streams, if every one answers.
    async fn jetstream_bytes(&self) -> Option<BTreeMap<String, u64>> {
        let mut bytes = BTreeMap::new();
        for name in self.names.streams() {
            let mut stream = self.jetstream.get_stream(&name).await.ok()?;
            let size = stream.info().await.ok()?.state.bytes;
            bytes.insert(name, size);
        }
        Some(bytes)
    }

    /// The mean over `runs` of `MEMORY USAGE` summed over each run's keys.
    async fn memory_usage(&mut self, runs: &[String]) -> anyhow::Result<Option<f64>> {
        if runs.is_empty() {
            return Ok(None);
        }
        let mut total = 0;
        for run in runs {
            let run = RunId::parse(run).context("the gateway answered a malformed run id")?;
            let keys = Keys::of(&self.names).run_keys(&run);
            total += measure::redis_memory_usage(&mut self.redis, &keys).await?;
        }
        Ok(Some(total as f64 / runs.len() as f64))
    }
}

/// CPU ticks and context switches at one moment.
struct Snapshot {
    at: Instant,
    gateway: u64,
    workers: Vec<u64>,
    nats: Option<u64>,
    redis: Option<u64>,
    load_generator: u64,
    fakes: u64,
    context_switches: u64,
}

/// Stream growth per run, in all and per stream.
fn per_stream(
    before: &Option<BTreeMap<String, u64>>,
    after: &Option<BTreeMap<String, u64>>,
    runs: usize,
) -> (Option<f64>, BTreeMap<String, f64>) {
    let (Some(before), Some(after)) = (before, after) else {
        return (None, BTreeMap::new());
    };
    let by_stream: BTreeMap<String, f64> = after
        .iter()
        .filter_map(|(name, &a)| {
            let b = before.get(name).copied().unwrap_or(0);
            Some((name.clone(), per(a as f64 - b as f64, runs)?))
        })
        .collect();
    let total = per(
        after.values().sum::<u64>() as f64 - before.values().sum::<u64>() as f64,
        runs,
    );
    (total, by_stream)
}

fn per(amount: f64, count: usize) -> Option<f64> {
    (count > 0).then(|| amount / count as f64)
}

/// CPU milliseconds of each process between two snapshots, divided by `per` (cycles, or
/// seconds).
fn cpu(before: &Snapshot, after: &Snapshot, clock: u64, per: f64) -> Cpu {
    let ms = |b: u64, a: u64| {
        if per > 0.0 {
            a.saturating_sub(b) as f64 * 1000.0 / clock as f64 / per
        } else {
            0.0
        }
    };
    let workers: Vec<f64> = before
        .workers
        .iter()
        .zip(&after.workers)
        .map(|(&b, &a)| ms(b, a))
        .collect();
    let workers_total = workers.iter().sum();
    let gateway = ms(before.gateway, after.gateway);
    let nats = before.nats.zip(after.nats).map(|(b, a)| ms(b, a));
    let redis = before.redis.zip(after.redis).map(|(b, a)| ms(b, a));
    Cpu {
        gateway,
        total: gateway + workers_total + nats.unwrap_or(0.0) + redis.unwrap_or(0.0),
        workers,
        workers_total,
        nats,
        redis,
        bench_load_generator: ms(before.load_generator, after.load_generator),
        bench_fakes: ms(before.fakes, after.fakes),
    }
}

fn level(
    concurrency: usize,
    times: &[Times],
    before: &Snapshot,
    after: &Snapshot,
    clock: u64,
) -> Level {
    let cycles = times.len();
    let seconds = after.at.duration_since(before.at).as_secs_f64();
    let cpu = cpu(before, after, clock, cycles as f64);
    let pick = |f: fn(&Times) -> u64| Percentiles::of(times.iter().map(f).collect());
    Level {
        concurrency,
        cycles,
        seconds,
        cycles_per_sec: cycles as f64 / seconds.max(1e-9),
        cpu_ms_per_cycle: cpu,
        context_switches_per_cycle: per(
            after
                .context_switches
                .saturating_sub(before.context_switches) as f64,
            cycles,
        )
        .unwrap_or(0.0),
        latency: Latency {
            start: pick(|t| t.start),
            pause: pick(|t| t.pause),
            read: pick(|t| t.read),
            decision: pick(|t| t.decision),
            resume: pick(|t| t.resume),
            cycle: pick(|t| t.cycle),
        },
        load_average_after: measure::load_average(),
        redis_commands_per_cycle: BTreeMap::new(),
    }
}

/// The commit the benchmark was built from, if this is a git checkout.
fn commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}
