//! The figures: JSON for machines, a table for people.

use crate::config::Options;
use crate::measure::{Machine, Percentiles};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Debug, Serialize)]
pub struct Report {
    pub started_at: String,
    pub command: String,
    pub commit: String,
    pub machine: Machine,
    /// The load averages when the benchmark ended.
    pub load_average_after: String,
    pub versions: Versions,
    pub options: Options,
    /// `true` when NATS and Redis were started here, so their CPU and memory are counted.
    pub servers_started_here: bool,
    pub systems: Vec<SystemReport>,
    /// Runs whose refunds were counted at the tools service, at the end.
    pub runs_checked: RunsChecked,
    /// Events received for runs already done (a repeat is harmless for the checks but worth
    /// knowing), and messages on the subscribed subjects that were not events.
    pub stray_events: usize,
    pub unparsed_messages: u64,
    pub violations: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct RunsChecked {
    pub completed: usize,
    pub paused: usize,
}

#[derive(Debug, Serialize)]
pub struct Versions {
    pub nats_server: String,
    pub redis_server: String,
    pub rustc: String,
}

/// One system: a gateway and `workers` workers on fresh servers (or a fresh namespace).
#[derive(Debug, Serialize)]
pub struct SystemReport {
    pub workers: usize,
    /// CPU-ms per second of each process with no run going (same fields as per cycle).
    pub idle_cpu_ms_per_sec: Cpu,
    pub levels: Vec<Level>,
    pub completed: CompletedRuns,
    pub worker_rss_kib: WorkerRss,
    pub waiting: Option<Waiting>,
}

#[derive(Debug, Serialize)]
pub struct Level {
    pub concurrency: usize,
    /// Cycles measured that passed every check.
    pub cycles: usize,
    pub seconds: f64,
    pub cycles_per_sec: f64,
    pub cpu_ms_per_cycle: Cpu,
    /// Context switches of the gateway and the workers per cycle.
    pub context_switches_per_cycle: f64,
    pub latency: Latency,
    pub load_average_after: String,
    /// Redis commands run per cycle, by name (`INFO commandstats`): `evalsha` counts script
    /// runs, and the commands a script calls are counted too, so this is work, not round
    /// trips.
    pub redis_commands_per_cycle: BTreeMap<String, f64>,
}

/// CPU milliseconds per cycle, per process; `total` is the system under test (gateway,
/// workers, and NATS and Redis when started here). The benchmark's own load generator and
/// fake servers are shown apart and not in the total.
#[derive(Debug, Default, Serialize)]
pub struct Cpu {
    pub gateway: f64,
    pub workers: Vec<f64>,
    pub workers_total: f64,
    pub nats: Option<f64>,
    pub redis: Option<f64>,
    pub total: f64,
    pub bench_load_generator: f64,
    pub bench_fakes: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct Latency {
    /// `POST /v1/runs` → `202`.
    pub start: Percentiles,
    /// `POST /v1/runs` sent → `approval.requested` received.
    pub pause: Percentiles,
    /// `GET /v1/runs/{id}` → `200` (all zero with `--digest-from event`).
    pub read: Percentiles,
    /// `POST …/decisions` → `200`.
    pub decision: Percentiles,
    /// Decision sent → `run.completed` received.
    pub resume: Percentiles,
    /// `POST /v1/runs` sent → `run.completed` received.
    pub cycle: Percentiles,
}

/// What completed runs leave behind.
#[derive(Debug, Default, Serialize)]
pub struct CompletedRuns {
    /// Runs completed on this system (warm-ups included), the divisor below.
    pub runs: usize,
    /// Redis `used_memory` growth over all of them, per run: everything a run leaves,
    /// index entries in other keys included.
    pub redis_bytes_per_run_used_memory: Option<f64>,
    /// `MEMORY USAGE … SAMPLES 0` summed over a run's own keys, averaged over a sample.
    pub redis_bytes_per_run_memory_usage: Option<f64>,
    /// Growth of all the deployment's JetStream streams, per run.
    pub jetstream_bytes_per_run: Option<f64>,
    pub jetstream_bytes_per_run_by_stream: BTreeMap<String, f64>,
}

#[derive(Debug, Default, Serialize)]
pub struct WorkerRss {
    pub at_start: Vec<u64>,
    pub after_levels: Vec<u64>,
}

/// Many runs left paused, and a new run's cycle while they wait.
#[derive(Debug, Serialize)]
pub struct Waiting {
    pub runs: usize,
    /// How long leaving them paused took (256 in flight).
    pub fill_seconds: f64,
    pub redis_used_memory_before: u64,
    pub redis_used_memory_after: u64,
    pub redis_bytes_per_paused_run_used_memory: f64,
    pub redis_bytes_per_paused_run_memory_usage: Option<f64>,
    pub jetstream_bytes_per_paused_run: Option<f64>,
    pub jetstream_bytes_per_paused_run_by_stream: BTreeMap<String, f64>,
    /// CPU-ms per second of each process with these runs waiting and nothing else going.
    pub idle_cpu_ms_per_sec: Cpu,
    pub worker_rss_kib_before: Vec<u64>,
    pub worker_rss_kib_after: Vec<u64>,
    /// One run at a time while they wait.
    pub probe: Level,
}

fn ms(p: &Percentiles) -> String {
    format!("{:.2}/{:.2}", p.p50_ms, p.p99_ms)
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

fn level_row(out: &mut String, workers: usize, label: &str, l: &Level) {
    let c = &l.cpu_ms_per_cycle;
    let _ = writeln!(
        out,
        "{workers:>3} {label:>9} {:>8.0} | {:>5.2} {:>5.2} {:>5} {:>5} {:>6.2} | {:>5.2} {:>5.2} | {:>5.1} {:>5.1} | {:>11} {:>11} {:>11} {:>11} {:>11}",
        l.cycles_per_sec,
        c.gateway,
        c.workers_total,
        opt(c.nats, 2),
        opt(c.redis, 2),
        c.total,
        c.bench_load_generator,
        c.bench_fakes,
        l.context_switches_per_cycle,
        l.redis_commands_per_cycle.values().sum::<f64>(),
        ms(&l.latency.pause),
        ms(&l.latency.read),
        ms(&l.latency.decision),
        ms(&l.latency.resume),
        ms(&l.latency.cycle),
    );
}

/// The table printed on stdout.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "countersign-bench at {} ({}), {} CPUs, {} GiB, kernel {}, load {} before / {} after",
        report.commit,
        report.started_at,
        report.machine.cpus,
        report.machine.memory_gib,
        report.machine.kernel,
        report.machine.load_average,
        report.load_average_after
    );
    let _ = writeln!(
        out,
        "{}; {}; {}\n",
        report.versions.nats_server, report.versions.redis_server, report.versions.rustc
    );
    let _ = writeln!(
        out,
        "                       |      CPU-ms per cycle            | bench CPU-ms | per cycle   | latency p50/p99 ms"
    );
    let _ = writeln!(
        out,
        "wrk in-flight cycles/s | gatew  wrks  nats redis  total | loadg fakes | ctxsw rcmds |       pause        read    decision      resume       cycle"
    );
    for system in &report.systems {
        for level in &system.levels {
            level_row(
                &mut out,
                system.workers,
                &level.concurrency.to_string(),
                level,
            );
        }
        if let Some(w) = &system.waiting {
            level_row(&mut out, system.workers, "1+waiting", &w.probe);
        }
    }
    let _ = writeln!(out);
    for system in &report.systems {
        let i = &system.idle_cpu_ms_per_sec;
        let _ = writeln!(
            out,
            "{} worker(s): idle CPU-ms per second: gateway {:.1}, workers {:.1}, nats {}, redis {}, total {:.1}",
            system.workers,
            i.gateway,
            i.workers_total,
            opt(i.nats, 1),
            opt(i.redis, 1),
            i.total,
        );
        let c = &system.completed;
        let _ = writeln!(
            out,
            "{} worker(s): per completed run ({} runs): Redis {} B (used_memory delta), {} B (MEMORY USAGE of its keys), JetStream {} B; worker RSS KiB {:?} at start, {:?} after the levels",
            system.workers,
            c.runs,
            opt(c.redis_bytes_per_run_used_memory, 0),
            opt(c.redis_bytes_per_run_memory_usage, 0),
            opt(c.jetstream_bytes_per_run, 0),
            system.worker_rss_kib.at_start,
            system.worker_rss_kib.after_levels,
        );
        if let Some(w) = &system.waiting {
            let _ = writeln!(
                out,
                "{} worker(s): {} runs paused in {:.1} s: Redis used_memory {:.1} MB -> {:.1} MB, {:.0} B per paused run (used_memory delta), {} B (MEMORY USAGE of its keys), JetStream {} B; worker RSS KiB {:?} -> {:?}; a new run's cycle p50 {:.2} ms while they wait",
                system.workers,
                w.runs,
                w.fill_seconds,
                w.redis_used_memory_before as f64 / 1e6,
                w.redis_used_memory_after as f64 / 1e6,
                w.redis_bytes_per_paused_run_used_memory,
                opt(w.redis_bytes_per_paused_run_memory_usage, 0),
                opt(w.jetstream_bytes_per_paused_run, 0),
                w.worker_rss_kib_before,
                w.worker_rss_kib_after,
                w.probe.latency.cycle.p50_ms,
            );
            let i = &w.idle_cpu_ms_per_sec;
            let _ = writeln!(
                out,
                "{} worker(s): idle CPU-ms per second while they wait: gateway {:.1}, workers {:.1}, nats {}, redis {}, total {:.1}",
                system.workers,
                i.gateway,
                i.workers_total,
                opt(i.nats, 1),
                opt(i.redis, 1),
                i.total,
            );
        }
    }
    let _ = writeln!(
        out,
        "\nchecked: {} completed runs (refund requested exactly once each), {} paused runs (never refunded); {} stray events, {} unparsed messages",
        report.runs_checked.completed,
        report.runs_checked.paused,
        report.stray_events,
        report.unparsed_messages
    );
    if report.violations.is_empty() {
        let _ = writeln!(out, "violations: none");
    } else {
        let _ = writeln!(out, "VIOLATIONS ({}):", report.violations.len());
        for v in report.violations.iter().take(20) {
            let _ = writeln!(out, "  {v}");
        }
    }
    out
}
