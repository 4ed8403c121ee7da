//! Command-line options. Hand-parsed: a dozen flags do not justify another dependency in the
//! workspace's build.

use anyhow::{Context, bail};
use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "\
countersign-bench: the refund scenario (start, pause, approve, complete) under load

usage: cargo run --release -p countersign-bench -- [options]

  --workers LIST          worker processes, one system per entry (default 1,2,4)
  --concurrency LIST      runs in flight per level (default 1,16,64,256)
  --cycles N              measured cycles per level (default 3000)
  --warmup N              unmeasured cycles before each level (default 300)
  --waiting N             paused runs left waiting for the memory test, with the first
                          worker count; 0 skips it (default 100000, about two minutes
                          on two cores)
  --waiting-probe N       cycles one at a time measured while they wait (default 500)
  --worker-concurrency N  the workers' `concurrency` (default: the worker's own, 16)
  --digest-from get|event where the reviewer takes the digest it approves: GET /v1/runs/{id}
                          (default, as a reviewer's screen would) or the approval.requested event
  --nats-url URL          use this NATS (JetStream enabled, no credentials) instead of
                          starting nats-server
  --redis-url URL         use this Redis instead of starting redis-server (the runs left
                          paused stay there until their deadline, a day later)
  --bin-dir DIR           where approval-gateway and agent-worker are (default: next to this
                          executable)
  --no-build              do not run `cargo build --release` for the services first
  --json PATH             also write the figures as JSON
  --work-dir DIR          configs, logs and server data, kept afterwards (default: a new
                          folder in the temp dir, removed unless a check fails)
  --keep                  keep the default work dir too
  --log-level FILTER      RUST_LOG of the services (default info, as deployed)
  --otlp                  the services export their spans over OTLP/HTTP to a sink in the
                          bench (as with OTEL_EXPORTER_OTLP_ENDPOINT set; off by default)
  --perf DIR              record `perf` samples of the gateway and the first worker during
                          the measured window of one level (with the first worker count), into
                          DIR; that level's figures then include perf's own cost
  --perf-level N          the level (runs in flight) to profile (default 64)
  --timeout-secs N        longest wait for one step of one run before it counts as a
                          violation (default 30)
";

/// Where the simulated reviewer reads the digest it quotes in its decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DigestFrom {
    /// `GET /v1/runs/{id}`: one more request per cycle, as a reviewer's screen makes.
    Get,
    /// The `approval.requested` event the load generator already received.
    Event,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Options {
    pub workers: Vec<usize>,
    pub concurrency: Vec<usize>,
    pub cycles: usize,
    pub warmup: usize,
    pub waiting: usize,
    pub waiting_probe: usize,
    pub worker_concurrency: Option<usize>,
    pub digest_from: DigestFrom,
    pub nats_url: Option<String>,
    pub redis_url: Option<String>,
    pub bin_dir: Option<PathBuf>,
    pub build: bool,
    pub json: Option<PathBuf>,
    pub work_dir: Option<PathBuf>,
    pub keep: bool,
    pub log_level: String,
    pub otlp: bool,
    pub perf: Option<PathBuf>,
    pub perf_level: usize,
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_secs())
}

impl Default for Options {
    fn default() -> Self {
        Self {
            workers: vec![1, 2, 4],
            concurrency: vec![1, 16, 64, 256],
            cycles: 3000,
            warmup: 300,
            waiting: 100_000,
            waiting_probe: 500,
            worker_concurrency: None,
            digest_from: DigestFrom::Get,
            nats_url: None,
            redis_url: None,
            bin_dir: None,
            build: true,
            json: None,
            work_dir: None,
            keep: false,
            log_level: "info".into(),
            otlp: false,
            perf: None,
            perf_level: 64,
            timeout: Duration::from_secs(30),
        }
    }
}

/// What the command line asked for: a run, or the usage text.
#[derive(Debug)]
pub enum Command {
    Run(Box<Options>),
    Help,
}

impl Options {
    pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Command> {
        let mut o = Options::default();
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "-h" | "--help" => return Ok(Command::Help),
                "--workers" => o.workers = list(&flag, &value()?)?,
                "--concurrency" => o.concurrency = list(&flag, &value()?)?,
                "--cycles" => o.cycles = number(&flag, &value()?)?,
                "--warmup" => o.warmup = number(&flag, &value()?)?,
                "--waiting" => o.waiting = number(&flag, &value()?)?,
                "--waiting-probe" => o.waiting_probe = number(&flag, &value()?)?,
                "--worker-concurrency" => {
                    o.worker_concurrency = Some(number(&flag, &value()?)?);
                }
                "--digest-from" => {
                    o.digest_from = match value()?.as_str() {
                        "get" => DigestFrom::Get,
                        "event" => DigestFrom::Event,
                        other => bail!("--digest-from is get or event, not {other:?}"),
                    }
                }
                "--nats-url" => o.nats_url = Some(value()?),
                "--redis-url" => o.redis_url = Some(value()?),
                "--bin-dir" => o.bin_dir = Some(value()?.into()),
                "--no-build" => o.build = false,
                "--json" => o.json = Some(value()?.into()),
                "--work-dir" => o.work_dir = Some(value()?.into()),
                "--keep" => o.keep = true,
                "--log-level" => o.log_level = value()?,
                "--otlp" => o.otlp = true,
                "--perf" => o.perf = Some(value()?.into()),
                "--perf-level" => o.perf_level = number(&flag, &value()?)?,
                "--timeout-secs" => {
                    o.timeout = Duration::from_secs(number(&flag, &value()?)? as u64);
                }
                other => bail!("unknown option {other:?} (see --help)"),
            }
        }
        if o.workers.is_empty() || o.workers.contains(&0) {
            bail!("--workers needs at least one worker per entry");
        }
        if o.concurrency.contains(&0) {
            bail!("--concurrency entries must be at least 1");
        }
        if o.cycles == 0 {
            bail!("--cycles must be at least 1");
        }
        Ok(Command::Run(Box::new(o)))
    }
}

fn number(flag: &str, value: &str) -> anyhow::Result<usize> {
    value
        .replace('_', "")
        .parse()
        .with_context(|| format!("{flag} takes a whole number, not {value:?}"))
}

fn list(flag: &str, value: &str) -> anyhow::Result<Vec<usize>> {
    value
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| number(flag, s.trim()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Options> {
        match Options::parse(args.iter().map(std::string::ToString::to_string))? {
            Command::Run(o) => Ok(*o),
            Command::Help => bail!("help"),
        }
    }

    #[test]
    fn no_arguments_give_the_default_levels() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.workers, [1, 2, 4]);
        assert_eq!(o.concurrency, [1, 16, 64, 256]);
        assert_eq!(o.digest_from, DigestFrom::Get);
        assert!(o.build);
    }

    #[test]
    fn lists_and_numbers_are_read() {
        let o = parse(&[
            "--workers",
            "2",
            "--concurrency",
            "1, 64",
            "--waiting",
            "100_000",
            "--digest-from",
            "event",
            "--no-build",
        ])
        .unwrap();
        assert_eq!(o.workers, [2]);
        assert_eq!(o.concurrency, [1, 64]);
        assert_eq!(o.waiting, 100_000);
        assert_eq!(o.digest_from, DigestFrom::Event);
        assert!(!o.build);
    }

    #[test]
    fn unknown_flags_missing_values_and_zero_workers_are_refused() {
        assert!(parse(&["--wrokers", "1"]).is_err());
        assert!(parse(&["--cycles"]).is_err());
        assert!(parse(&["--workers", "0"]).is_err());
        assert!(parse(&["--cycles", "many"]).is_err());
    }
}
