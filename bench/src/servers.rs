//! The processes under test: `nats-server -js` and `redis-server --appendonly yes` (unless
//! URLs of running ones are given), and the release binaries of the gateway and the workers,
//! each configured through a TOML file named by `COUNTERSIGN_CONFIG`. Every child writes its
//! log to a file in the work dir; each is stopped with SIGTERM (then SIGKILL after a few
//! seconds) when it is dropped.

use anyhow::{Context, bail};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const REQUESTER_KEY: &str = "bench-requester-key-0000";
pub const REVIEWER_KEY: &str = "bench-reviewer-key-00000";
const REQUESTER: &str = "bench-desk";
const REVIEWER: &str = "bench-reviewer";
pub const AGENT: &str = "refunds";

/// A child process that is stopped when dropped.
pub struct Proc {
    pub name: String,
    pub pid: u32,
    child: Child,
}

impl Proc {
    fn spawn(name: &str, command: &mut Command, log: &Path) -> anyhow::Result<Self> {
        let out = File::create(log).with_context(|| format!("create {}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("start {name} ({command:?})"))?;
        Ok(Self {
            name: name.to_string(),
            pid: child.id(),
            child,
        })
    }

    /// An error naming the process if it has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited ({status}); see its log", self.name);
        }
        Ok(())
    }

    /// Stops the process (SIGTERM, then SIGKILL after 5 s) and waits for it.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // SIGTERM through kill(1): the workspace forbids unsafe code, so no libc call.
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where a server program is: on the `PATH`, else in `/usr/sbin` (where Debian puts
/// `nats-server`, outside the `PATH` of users other than root).
pub fn program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// A loopback port nobody listens on now. (Another process could take it before the child
/// binds it; on a benchmark machine that does not happen in practice.)
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// NATS and Redis: started here, or given.
pub struct Infra {
    pub nats_url: String,
    pub redis_url: String,
    /// Started here (so their CPU and memory can be read); `None` when given by URL.
    pub nats: Option<Proc>,
    pub redis: Option<Proc>,
}

impl Infra {
    /// Starts whichever of the two servers has no URL in the options, with data under `dir`.
    pub async fn start(
        nats_url: Option<&str>,
        redis_url: Option<&str>,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let (nats_url, nats) = match nats_url {
            Some(url) => (url.to_string(), None),
            None => {
                let data = dir.join("nats-data");
                std::fs::create_dir_all(&data)?;
                let port = free_port()?;
                let proc = Proc::spawn(
                    "nats-server",
                    Command::new(program("nats-server")).args([
                        "-js",
                        "-a",
                        "127.0.0.1",
                        "-p",
                        &port.to_string(),
                        "-sd",
                        &data.to_string_lossy(),
                    ]),
                    &dir.join("nats-server.log"),
                )?;
                (format!("nats://127.0.0.1:{port}"), Some(proc))
            }
        };
        let (redis_url, redis) = match redis_url {
            Some(url) => (url.to_string(), None),
            None => {
                let data = dir.join("redis-data");
                std::fs::create_dir_all(&data)?;
                let port = free_port()?;
                // The append-only file is the durability the README asks for. RDB snapshots
                // are off so that no background save forks in the middle of a measurement.
                let proc = Proc::spawn(
                    "redis-server",
                    Command::new(program("redis-server")).args([
                        "--port",
                        &port.to_string(),
                        "--bind",
                        "127.0.0.1",
                        "--dir",
                        &data.to_string_lossy(),
                        "--appendonly",
                        "yes",
                        "--save",
                        "",
                    ]),
                    &dir.join("redis-server.log"),
                )?;
                (format!("redis://127.0.0.1:{port}"), Some(proc))
            }
        };
        let mut infra = Self {
            nats_url,
            redis_url,
            nats,
            redis,
        };
        for url in [infra.nats_url.clone(), infra.redis_url.clone()] {
            wait_for_port(&url, &mut infra).await?;
        }
        Ok(infra)
    }

    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for proc in [&mut self.nats, &mut self.redis].into_iter().flatten() {
            proc.check_alive()?;
        }
        Ok(())
    }
}

/// Waits until something accepts connections at the host and port of `url`.
async fn wait_for_port(url: &str, infra: &mut Infra) -> anyhow::Result<()> {
    let addr = url
        .split("://")
        .nth(1)
        .unwrap_or(url)
        .rsplit('@')
        .next()
        .unwrap_or(url)
        .split(',')
        .next()
        .unwrap_or(url)
        .trim_end_matches('/')
        .to_string();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if tokio::net::TcpStream::connect(&addr).await.is_ok() {
            return Ok(());
        }
        infra.check_alive()?;
        if Instant::now() > until {
            bail!("nothing listens at {addr} after 20 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent of the scenario: `get_order` runs at once, `issue_refund` over 20 waits for a
/// person (the tests' agent, pointed at the fakes).
pub fn write_agent(dir: &Path, model_url: &str, tools_url: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let agent = countersign_local::demo_agent::refunds_agent("anthropic", model_url, tools_url);
    std::fs::write(dir.join(format!("{AGENT}.toml")), agent)?;
    Ok(())
}

/// What both services' config files share.
pub struct Shared<'a> {
    pub nats_url: &'a str,
    pub redis_url: &'a str,
    pub namespace: &'a str,
    pub agents_dir: &'a Path,
    pub log_level: &'a str,
    /// Where the services export their spans (OTLP/HTTP), if they do.
    pub otlp: Option<&'a str>,
}

impl Shared<'_> {
    fn toml(&self) -> String {
        format!(
            "nats_url = {:?}\nredis_url = {:?}\nnamespace = {:?}\nagents_dir = {:?}\n",
            self.nats_url,
            self.redis_url,
            self.namespace,
            self.agents_dir.to_string_lossy(),
        )
    }
}

const PEOPLE: &str = r#"
[[people]]
id = "bench-reviewer"
roles = ["finance"]
"#;

/// The gateway and the workers, as separate processes.
pub struct System {
    pub gateway: Proc,
    pub gateway_url: String,
    pub workers: Vec<Proc>,
    worker_probes: Vec<String>,
}

impl System {
    pub async fn start(
        bin_dir: &Path,
        dir: &Path,
        shared: &Shared<'_>,
        workers: usize,
        worker_concurrency: Option<usize>,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let gateway_url = format!("http://127.0.0.1:{port}");
        let config = dir.join("gateway.toml");
        // Approved calls get receipts, as in any deployment.
        let key_file = dir.join("receipt-key.pem");
        let (_, pem) = countersign_receipt::Signer::generate("bench")?;
        std::fs::write(&key_file, pem)?;
        std::fs::write(
            &config,
            format!(
                "{}listen = \"127.0.0.1:{port}\"\n\n\
                 [[api_keys]]\nkey = \"{REQUESTER_KEY}\"\nrole = \"requester\"\nprincipal = \"{REQUESTER}\"\n\n\
                 [[api_keys]]\nkey = \"{REVIEWER_KEY}\"\nrole = \"reviewer\"\nprincipal = \"{REVIEWER}\"\n{PEOPLE}\n\
                 [receipts]\nkey_file = {:?}\n",
                shared.toml(),
                key_file.display().to_string()
            ),
        )?;
        let gateway = Proc::spawn(
            "approval-gateway",
            &mut service(bin_dir, "approval-gateway", &config, shared)?,
            &dir.join("gateway.log"),
        )?;
        let mut system = Self {
            gateway,
            gateway_url,
            workers: Vec::new(),
            worker_probes: Vec::new(),
        };
        system
            .wait_ready(&format!("{}/readyz", system.gateway_url))
            .await?;
        for n in 1..=workers {
            let port = free_port()?;
            let config = dir.join(format!("worker-{n}.toml"));
            let concurrency = worker_concurrency
                .map(|c| format!("concurrency = {c}\n"))
                .unwrap_or_default();
            std::fs::write(
                &config,
                format!(
                    "{}worker_id = \"bench-worker-{n}\"\nhealth_listen = \"127.0.0.1:{port}\"\n{concurrency}{PEOPLE}",
                    shared.toml()
                ),
            )?;
            let name = format!("agent-worker-{n}");
            system.workers.push(Proc::spawn(
                &name,
                &mut service(bin_dir, "agent-worker", &config, shared)?,
                &dir.join(format!("{name}.log")),
            )?);
            system
                .worker_probes
                .push(format!("http://127.0.0.1:{port}/readyz"));
        }
        for probe in system.worker_probes.clone() {
            system.wait_ready(&probe).await?;
        }
        Ok(system)
    }

    async fn wait_ready(&mut self, url: &str) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(answer) = http.get(url).send().await
                && answer.status().is_success()
            {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() > until {
                bail!("{url} is not ready after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        self.gateway.check_alive()?;
        for worker in &mut self.workers {
            worker.check_alive()?;
        }
        Ok(())
    }
}

fn service(
    bin_dir: &Path,
    binary: &str,
    config: &Path,
    shared: &Shared<'_>,
) -> anyhow::Result<Command> {
    let path = bin_dir.join(binary);
    if !path.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release -p approval-gateway -p agent-worker` or pass --bin-dir",
            path.display()
        );
    }
    let mut command = Command::new(path);
    command
        .env("COUNTERSIGN_CONFIG", config)
        .env("RUST_LOG", shared.log_level)
        // Whatever the caller's shell has must not reconfigure the services.
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("NATS_URL")
        .env_remove("REDIS_URL")
        .env_remove("COUNTERSIGN_NAMESPACE")
        .env_remove("COUNTERSIGN_API_KEYS")
        .env_remove("COUNTERSIGN_LISTEN")
        .env_remove("COUNTERSIGN_AGENTS_DIR")
        .env_remove("WORKER_HEALTH_LISTEN")
        .env_remove("WORKER_ID")
        .env_remove("LOG_FORMAT")
        .env_remove("ANTHROPIC_BASE_URL");
    match shared.otlp {
        Some(url) => command.env("OTEL_EXPORTER_OTLP_ENDPOINT", url),
        None => command.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT"),
    };
    Ok(command)
}

/// The arguments of a benchmark binary run as `[N] [--bin-dir DIR]`: how many times to
/// measure (`default` when not given), and where the service binaries are ([`bin_dir`]).
pub fn count_and_bin_dir(default: usize) -> anyhow::Result<(usize, PathBuf)> {
    let mut args = std::env::args().skip(1);
    let mut count = default;
    let mut given = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bin-dir" => given = args.next().map(PathBuf::from),
            n => count = n.parse()?,
        }
    }
    Ok((count, bin_dir(given.as_deref())?))
}

/// Where the service binaries are: `--bin-dir`, else next to this executable.
pub fn bin_dir(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = given {
        return Ok(dir.to_path_buf());
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("this executable has no folder")?;
    // A debug build of the bench still drives the release services.
    if dir.file_name().is_some_and(|name| name == "release") {
        Ok(dir.to_path_buf())
    } else {
        Ok(dir.parent().unwrap_or(dir).join("release"))
    }
}

/// Under `cargo run`, builds the services' release binaries into this executable's target
/// folder first, so the figures are never those of stale binaries.
pub fn build_services(bin_dir: &Path) -> anyhow::Result<()> {
    // Only under cargo. The cargo on the PATH (rustup's, which reads the workspace's
    // rust-toolchain.toml) is the one the person typed; `CARGO` may name another toolchain's,
    // whose builds would not reuse this one's.
    if std::env::var_os("CARGO").is_none() {
        return Ok(());
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the bench crate has no workspace")?;
    let Some(target_dir) = bin_dir.parent() else {
        return Ok(());
    };
    eprintln!(
        "building the services' release binaries into {}",
        bin_dir.display()
    );
    let mut command = Command::new("cargo");
    // `cargo run` gives this process the package's variables (CARGO_PKG_NAME, …). ring's
    // build script declares `rerun-if-env-changed` for some of those names, so a nested build
    // that saw them could rebuild it and all that depends on it.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&&*name)
        {
            command.env_remove(&*name);
        }
    }
    let status = command
        .current_dir(workspace)
        .args([
            "build",
            "--release",
            "-p",
            "approval-gateway",
            "-p",
            "agent-worker",
        ])
        .arg("--target-dir")
        .arg(target_dir)
        .status()
        .context("run cargo build")?;
    if !status.success() {
        bail!("cargo build of the services failed ({status})");
    }
    Ok(())
}

/// `perf record` of one process, with call graphs unwound from DWARF (the release binaries
/// keep no frame pointers), until stopped; perf writes its data on SIGTERM.
pub fn perf_record(pid: u32, out: &Path, log: &Path) -> anyhow::Result<Proc> {
    Proc::spawn(
        "perf",
        Command::new("perf")
            .args(["record", "-F", "999", "--call-graph", "dwarf,16384", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(out),
        log,
    )
}
