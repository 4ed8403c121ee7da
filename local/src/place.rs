//! Where a local runner listens and keeps its data, and the check, before anything starts,
//! that no other runner already holds those ports.
//!
//! The ports are 8080 (gateway), 9090 (worker probes), 9100 (demo tools), 14222 (NATS) and
//! 16379 (Redis), each moved up by `COUNTERSIGN_LOCAL_PORT_OFFSET` so a second runner can
//! run beside the first. The data folder is `COUNTERSIGN_LOCAL_DIR`, else `.countersign` in
//! the repository (`.countersign-<offset>` with an offset, so two runners never share one).
//! A runner writes its process id to `runner.pid` there, which is how a second one on the
//! same ports can say which process to stop.

use anyhow::Context;
use std::net::TcpListener;
use std::path::{Path, PathBuf};

/// The variable that moves every port of a local runner up, so a second runner can run beside
/// the first.
pub const OFFSET_VAR: &str = "COUNTERSIGN_LOCAL_PORT_OFFSET";
/// The variable naming the runner's data folder.
pub const DIR_VAR: &str = "COUNTERSIGN_LOCAL_DIR";

/// The address the example agent's tools name, rewritten to the demo tools' own.
pub const EXAMPLE_TOOLS: &str = "127.0.0.1:9100";

const PID_FILE: &str = "runner.pid";

/// Where a local runner listens and keeps its data.
pub struct Place {
    /// How far every port is moved up from its default (0 to 40000).
    pub offset: u16,
    /// The data folder: the child servers' data, their logs, the generated agents.
    pub dir: PathBuf,
    /// The gateway's port (8080 and the offset).
    pub gateway: u16,
    /// The worker's probe port (9090 and the offset).
    pub worker: u16,
    /// The demo tools service's port (9100 and the offset).
    pub tools: u16,
    /// NATS's port (14222 and the offset).
    pub nats: u16,
    /// Redis's port (16379 and the offset).
    pub redis: u16,
}

impl Place {
    /// As the environment says, for the repository at `root`.
    pub fn from_env(root: &Path) -> anyhow::Result<Self> {
        let offset = match std::env::var(OFFSET_VAR) {
            Ok(v) if !v.is_empty() => {
                v.parse().ok().filter(|o| *o <= 40_000).with_context(|| {
                    format!("{OFFSET_VAR} {v:?} is not a number from 0 to 40000")
                })?
            }
            _ => 0,
        };
        let dir = match std::env::var_os(DIR_VAR) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ if offset == 0 => root.join(".countersign"),
            _ => root.join(format!(".countersign-{offset}")),
        };
        Ok(Self {
            offset,
            dir,
            gateway: 8080 + offset,
            worker: 9090 + offset,
            tools: 9100 + offset,
            nats: 14222 + offset,
            redis: 16379 + offset,
        })
    }

    /// The loopback address of `port`, as `host:port`.
    pub fn addr(port: u16) -> String {
        format!("127.0.0.1:{port}")
    }

    /// Fails, saying what to do, when one of `ports` (port, whose) is taken: most likely by
    /// another runner, whose process id is named when its pid file says so.
    pub fn check_free(&self, ports: &[(u16, &str)]) -> anyhow::Result<()> {
        let Some((port, whose)) = ports
            .iter()
            .find(|(port, _)| TcpListener::bind(Self::addr(*port)).is_err())
        else {
            return Ok(());
        };
        let other = self.other_runner();
        let by = other
            .map(|pid| {
                format!(
                    " (by process {pid}, whose pid file is in {})",
                    self.dir.display()
                )
            })
            .unwrap_or_default();
        let stop = match other {
            Some(pid) => format!("Ctrl-C in its terminal, or `kill {pid}`"),
            None => "Ctrl-C in its terminal".to_string(),
        };
        let next = self.offset + 100;
        let data = if std::env::var_os(DIR_VAR).is_some_and(|d| !d.is_empty()) {
            format!(", with {DIR_VAR} naming another data folder")
        } else {
            format!(" and keeps its data in .countersign-{next}")
        };
        anyhow::bail!(
            "another countersign-local seems to be running: {} ({whose}) is taken{by}. \
             Stop it ({stop}), or run this one beside it on other ports: \
             `{OFFSET_VAR}={next} cargo run -p countersign-local` moves every port up by {next}{data}",
            Self::addr(*port)
        )
    }

    /// Notes this process as the runner of this place (the file goes when `Claim` drops).
    pub fn claim(&self) -> anyhow::Result<Claim> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("create the data folder {}", self.dir.display()))?;
        let path = self.dir.join(PID_FILE);
        std::fs::write(&path, std::process::id().to_string())
            .with_context(|| format!("write {}", path.display()))?;
        Ok(Claim(path))
    }

    /// The process id in the pid file, if that process still runs.
    fn other_runner(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.join(PID_FILE))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }
}

/// This runner's pid file, removed when it stops.
pub struct Claim(PathBuf);

impl Drop for Claim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
