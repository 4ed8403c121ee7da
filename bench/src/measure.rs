//! What the benchmark reads from the kernel and from Redis: CPU time and context switches
//! from `/proc`, resident memory, Redis `INFO` and `MEMORY USAGE`, and percentiles.

use anyhow::{Context, bail};
use std::collections::BTreeMap;
use std::path::Path;

/// CPU time of a process in clock ticks: its threads' user and system time plus that of the
/// children it waited for (which is how Redis's fork for an AOF rewrite is counted).
pub fn process_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    let t = stat_times(&stat)?;
    Ok(t.utime + t.stime + t.cutime + t.cstime)
}

/// CPU ticks of this process's threads whose name starts with `prefix` (the benchmark's
/// own runtimes name their threads, so the load generator and the fake servers are counted
/// apart).
pub fn own_threads_ticks(prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            if !comm.starts_with(prefix) {
                return None;
            }
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let t = stat_times(&stat).ok()?;
            Some(t.utime + t.stime)
        })
        .sum()
}

#[derive(Debug, PartialEq)]
struct StatTimes {
    utime: u64,
    stime: u64,
    cutime: u64,
    cstime: u64,
}

/// Fields 14 to 17 of `/proc/<pid>/stat`. The command name (field 2) may hold spaces and
/// parentheses, so counting starts after its last `)`.
fn stat_times(stat: &str) -> anyhow::Result<StatTimes> {
    let Some(end) = stat.rfind(')') else {
        bail!("no command name in {stat:?}");
    };
    // After the name: field 3 (state) is index 0, so field N is index N - 3.
    let fields: Vec<&str> = stat[end + 1..].split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .with_context(|| format!("stat has no field {n}"))?
            .parse()
            .with_context(|| format!("stat field {n} is not a number"))
    };
    Ok(StatTimes {
        utime: field(14)?,
        stime: field(15)?,
        cutime: field(16)?,
        cstime: field(17)?,
    })
}

/// Voluntary plus involuntary context switches of every thread of a process.
pub fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .map(|status| {
            status_value(&status, "voluntary_ctxt_switches").unwrap_or(0)
                + status_value(&status, "nonvoluntary_ctxt_switches").unwrap_or(0)
        })
        .sum()
}

/// Resident memory of a process in KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    status_value(&status, "VmRSS").context("no VmRSS in /proc/<pid>/status")
}

/// The number of a `Name:   123 kB` line of a `/proc` status-like file.
fn status_value(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`; 100 on Linux
/// everywhere this runs, which is also the fallback).
pub fn clock_ticks_per_sec() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// The machine, as BENCHMARKS.md records it.
#[derive(Debug, serde::Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub load_average: String,
}

impl Machine {
    pub fn read() -> Self {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib = status_value(&meminfo, "MemTotal").unwrap_or(0);
        Self {
            cpus: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            memory_gib: (mem_kib as f64 / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            load_average: load_average(),
        }
    }
}

/// The 1, 5 and 15 minute load averages: whether something else was using the machine.
pub fn load_average() -> String {
    read_trimmed("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn read_trimmed(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The first line a program prints for `args` (its version), or why it could not run.
pub fn version_of(program: &Path, args: &[&str]) -> String {
    match std::process::Command::new(program).args(args).output() {
        Ok(out) => {
            let text = if out.stdout.is_empty() {
                out.stderr
            } else {
                out.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        }
        Err(e) => format!("unavailable: {e}"),
    }
}

/// Redis's `used_memory`, in bytes.
pub async fn redis_used_memory(
    redis: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(redis).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

/// Calls per command since Redis started (`INFO commandstats`), by command name.
pub async fn redis_command_calls(
    redis: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await?;
    Ok(command_calls(&info))
}

/// `cmdstat_evalsha:calls=16,usec=…` lines as `evalsha -> 16`.
fn command_calls(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// The sum of `MEMORY USAGE` over `keys` (absent keys count nothing). `SAMPLES 0` makes
/// Redis count every element of a hash or list, not estimate from a sample.
pub async fn redis_memory_usage(
    redis: &mut redis::aio::MultiplexedConnection,
    keys: &[String],
) -> anyhow::Result<u64> {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0);
    }
    let sizes: Vec<Option<u64>> = pipe.query_async(redis).await?;
    Ok(sizes.into_iter().flatten().sum())
}

/// Latency percentiles of one step, in milliseconds.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
}

impl Percentiles {
    /// From durations in microseconds (sorted here).
    pub fn of(mut micros: Vec<u64>) -> Self {
        if micros.is_empty() {
            return Self::default();
        }
        micros.sort_unstable();
        let ms = |us: u64| us as f64 / 1000.0;
        let mean = micros.iter().sum::<u64>() as f64 / micros.len() as f64;
        Self {
            p50_ms: ms(nearest_rank(&micros, 50.0)),
            p99_ms: ms(nearest_rank(&micros, 99.0)),
            mean_ms: mean / 1000.0,
        }
    }
}

/// The nearest-rank percentile of sorted values: the smallest value with at least `p`% of
/// the values at or below it.
fn nearest_rank(sorted: &[u64], p: f64) -> u64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_are_read_after_a_command_name_with_spaces_and_parentheses() {
        let line = "4242 (tokio (rt) worker) S 1 4242 4242 0 -1 4194560 2000 0 0 0 \
                    1234 567 8 9 20 0 4 0 12345 1000000 2000 18446744073709551615";
        let t = stat_times(line).unwrap();
        assert_eq!(
            t,
            StatTimes {
                utime: 1234,
                stime: 567,
                cutime: 8,
                cstime: 9
            }
        );
    }

    #[test]
    fn this_process_has_cpu_time_and_resident_memory() {
        let pid = std::process::id();
        assert!(process_ticks(pid).is_ok());
        assert!(rss_kib(pid).unwrap() > 0);
    }

    #[test]
    fn status_values_are_found_by_exact_name() {
        let status =
            "VmRSS:\t   38912 kB\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(status_value(status, "VmRSS"), Some(38912));
        assert_eq!(status_value(status, "voluntary_ctxt_switches"), Some(12));
        assert_eq!(status_value(status, "nonvoluntary_ctxt_switches"), Some(3));
        assert_eq!(status_value(status, "VmHWM"), None);
    }

    #[test]
    fn command_stats_are_read_per_command() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=16,usec=900,usec_per_call=56.25,rejected_calls=0,failed_calls=0\r\ncmdstat_hset:calls=3,usec=9\r\n";
        let calls = command_calls(info);
        assert_eq!(calls.get("evalsha"), Some(&16));
        assert_eq!(calls.get("hset"), Some(&3));
        assert_eq!(calls.len(), 2);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let p = Percentiles::of((1..=100).map(|ms| ms * 1000).rev().collect());
        assert_eq!(p.p50_ms, 50.0);
        assert_eq!(p.p99_ms, 99.0);
        assert_eq!(p.mean_ms, 50.5);
        let one = Percentiles::of(vec![7000]);
        assert_eq!((one.p50_ms, one.p99_ms), (7.0, 7.0));
    }
}
