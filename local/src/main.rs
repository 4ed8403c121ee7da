//! `cargo run -p countersign-local`: the whole system on one machine. Starts NATS and Redis
//! as child processes unless `NATS_URL`/`REDIS_URL` point at running ones, the demo tools
//! service, a gateway and a worker with the example refund agent, and once the gateway and
//! the worker are ready prints the command lines (`countersign`) that take a run through
//! pause, approval and completion. Should any part stop, it says which and why and stops
//! the rest (see `countersign_local::supervise`); where it listens and keeps its data is
//! `countersign_local::place`.

use anyhow::{Context, bail};
use countersign_local::demo_tools::{Countersigned, DemoTools};
use countersign_local::nats_users::NatsUsers;
use countersign_local::place::{EXAMPLE_TOOLS, Place};
use countersign_local::ready::wait_ready;
use countersign_local::supervise::{Parts, Stopped};
use countersign_runtime::config::Connections;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// After a part stopped, how long the others get to stop before the runner exits.
const AFTER_FAILURE: Duration = Duration::from_millis(500);

#[tokio::main]
pub(crate) async fn main() -> ExitCode {
    let _telemetry = countersign_runtime::telemetry::init("countersign-local");
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("countersign-local: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Starts every part, says so once the gateway and the worker are ready, and runs until
/// Ctrl-C or until a part stops (see `countersign_local::supervise`).
async fn run() -> anyhow::Result<ExitCode> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let place = Place::from_env(&root)?;
    let mut connections = Connections::from_env(&countersign_runtime::config::process_env)?;
    check_ports(&place)?;
    let _claim = place.claim()?;

    let shutdown = CancellationToken::new();
    tokio::spawn(countersign_runtime::shutdown::on_signal(shutdown.clone()));
    let mut parts = Parts::new(shutdown.clone());
    let nats_users = start_servers(&place, &mut connections, &mut parts)?;
    let servers = async {
        wait_port(&connections.nats_url).await?;
        wait_port(&connections.redis_url).await
    };
    match parts.race(servers).await {
        Ok(answered) => answered?,
        Err(stopped) => return Ok(failed(parts, stopped).await),
    }

    let agents_dir = place.dir.join("agents");
    let (examples, provider) = agents_folder(&root, &place, &agents_dir, &mut parts, &shutdown)?;
    let gateway_addr = Place::addr(place.gateway);
    let gateway_url = format!("http://{gateway_addr}");
    start_demo_tools(&place, &gateway_url, &mut parts, &shutdown).await?;

    let (mut gateway, mut worker, requester_key, key) = configs(connections, agents_dir)?;
    gateway.receipts.key_file = Some(receipt_key(&place.dir)?);
    gateway.receipts.issuer = Some(gateway_url);
    if let Some(users) = &nats_users {
        users.log_in_gateway(&mut gateway.connections);
        users.log_in_worker(&mut worker.connections);
    }
    worker.health_listen = Place::addr(place.worker);
    let grace = Duration::from_secs(worker.shutdown_grace_secs) + Duration::from_secs(15);
    let listener = tokio::net::TcpListener::bind(&gateway_addr)
        .await
        .with_context(|| format!("bind the gateway on {gateway_addr}"))?;
    parts.service(
        "gateway",
        approval_gateway::run(gateway, listener, shutdown.clone()),
    );
    let health = tokio::net::TcpListener::bind(&worker.health_listen)
        .await
        .with_context(|| format!("bind the worker's probes on {}", worker.health_listen))?;
    let worker_ready = format!("http://{}/readyz", worker.health_listen);
    parts.service(
        "worker",
        agent_worker::run(worker, health, shutdown.clone()),
    );

    let probes = [
        ("gateway", format!("http://{gateway_addr}/readyz")),
        ("worker", worker_ready),
    ];
    // Ctrl-C before both are ready stops the wait too.
    let ready = async {
        tokio::select! {
            _ = wait_ready(&probes) => true,
            _ = shutdown.cancelled() => false,
        }
    };
    let watched = match parts.race(ready).await {
        Ok(true) => {
            print_demo(&gateway_addr, &requester_key, &key, provider, &examples);
            parts.watch().await
        }
        Ok(false) => Ok(()),
        Err(stopped) => Err(stopped),
    };
    if let Err(stopped) = watched {
        return Ok(failed(parts, stopped).await);
    }
    // Ctrl-C: everything stops in order.
    Ok(stop_all(parts, grace).await)
}

/// Refuses to start when a port this runner needs is taken (NATS's and Redis's only when
/// it starts them).
fn check_ports(place: &Place) -> anyhow::Result<()> {
    let mut ports = vec![
        (place.gateway, "the gateway"),
        (place.worker, "the worker's probes"),
        (place.tools, "the demo tools"),
    ];
    if std::env::var("NATS_URL").is_err() {
        ports.push((place.nats, "NATS"));
    }
    if std::env::var("REDIS_URL").is_err() {
        ports.push((place.redis, "Redis"));
    }
    place.check_free(&ports)
}

/// Writes the example agents into the data folder, pointed at the demo tools, and follows
/// the examples as they change; gives back the examples' folder and the model provider.
fn agents_folder(
    root: &Path,
    place: &Place,
    agents_dir: &Path,
    parts: &mut Parts,
    shutdown: &CancellationToken,
) -> anyhow::Result<(PathBuf, &'static str)> {
    let examples = std::env::var_os("COUNTERSIGN_LOCAL_AGENTS")
        .map_or_else(|| root.join("examples/agents"), PathBuf::from);
    let tools_addr = Place::addr(place.tools);
    let provider = write_agents(&examples, agents_dir, &tools_addr)?;
    parts.service(
        "agents' folder",
        follow_examples(
            examples.clone(),
            agents_dir.to_path_buf(),
            tools_addr,
            shutdown.clone(),
        ),
    );
    Ok((examples, provider))
}

/// Starts the demo tools, whose refunds service checks receipts against the gateway at
/// `gateway_url`.
async fn start_demo_tools(
    place: &Place,
    gateway_url: &str,
    parts: &mut Parts,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let tools = tokio::net::TcpListener::bind(Place::addr(place.tools))
        .await
        .with_context(|| format!("bind the demo tools on {}", Place::addr(place.tools)))?;
    // The refunds service checks refunds' receipts against this gateway, as a tool would.
    // The receipts it ran are kept in the data folder, so they stay spent across restarts.
    let countersigned = Countersigned {
        jwks_url: format!("{gateway_url}/.well-known/jwks.json"),
        issuer: gateway_url.to_string(),
        jtis_file: place.dir.join("receipts-run.jsonl"),
    };
    let (_, tools) = DemoTools::serve_watched(tools, Some(countersigned))?;
    let stop_tools = shutdown.clone();
    parts.service("demo tools", async move {
        tokio::select! {
            served = tools => Ok(served??),
            _ = stop_tools.cancelled() => Ok(()),
        }
    });
    Ok(())
}

/// Stops every part in order after Ctrl-C; a part that fails on the way is said.
async fn stop_all(parts: Parts, grace: Duration) -> ExitCode {
    let failures = parts.stop(grace).await;
    for stopped in &failures {
        eprintln!("countersign-local: {stopped}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Says at once which part stopped and why, stops the rest, and fails.
async fn failed(parts: Parts, stopped: Stopped) -> ExitCode {
    eprintln!("countersign-local: {stopped}");
    eprintln!("countersign-local: stopping the rest");
    for also in parts.stop(AFTER_FAILURE).await {
        eprintln!("countersign-local: meanwhile {also}");
    }
    ExitCode::FAILURE
}

/// NATS and Redis as child processes, each unless `NATS_URL` / `REDIS_URL` names a server
/// already running; `connections` is pointed at them. Each writes its output to a log in the data
/// folder, whose end is shown should it stop. NATS runs with the shipped permissions file and
/// fresh passwords for its users, returned for the services to log in with.
fn start_servers(
    place: &Place,
    connections: &mut Connections,
    parts: &mut Parts,
) -> anyhow::Result<Option<NatsUsers>> {
    let state = &place.dir;
    let mut nats_users = None;
    if std::env::var("NATS_URL").is_err() {
        let dir = state.join("nats");
        std::fs::create_dir_all(&dir)?;
        let users = NatsUsers::random();
        let conf = users.write_config(&dir, &connections.namespace)?;
        let conf = conf.to_string_lossy().to_string();
        let port = place.nats.to_string();
        let sd = dir.to_string_lossy().to_string();
        let log = state.join("nats-server.log");
        let child = spawn_server(
            "nats-server",
            &[
                "-c",
                &conf,
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &port,
                "-sd",
                &sd,
            ],
            &log,
        )?;
        parts.server("nats-server", child, log);
        connections.nats_url = format!("nats://127.0.0.1:{}", place.nats);
        nats_users = Some(users);
    }
    if std::env::var("REDIS_URL").is_err() {
        let dir = state.join("redis");
        std::fs::create_dir_all(&dir)?;
        let port = place.redis.to_string();
        let args = [
            "--bind",
            "127.0.0.1",
            "--port",
            &port,
            "--appendonly",
            "yes",
            "--dir",
        ];
        let dir = dir.to_string_lossy().to_string();
        let mut args = args.to_vec();
        args.push(&dir);
        let log = state.join("redis-server.log");
        let child = spawn_server("redis-server", &args, &log)?;
        parts.server("redis-server", child, log);
        connections.redis_url = format!("redis://127.0.0.1:{}", place.redis);
    }
    Ok(nats_users)
}

/// The gateway's and the worker's configuration, and the requester's and your keys.
/// The gateway's receipt signing key, made on the first start and kept in the data folder, so
/// receipts signed before a restart still verify after it.
fn receipt_key(dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("receipt-key.pem");
    if !path.exists() {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // The kid given here is not kept: the gateway names the key by its thumbprint.
        let (_, pem) = countersign_receipt::Signer::generate("local")?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut file| file.write_all(pem.as_bytes()))
            .with_context(|| format!("write {}", path.display()))?;
        tracing::info!(path = %path.display(), "made a receipt signing key");
    }
    Ok(path)
}

fn configs(
    connections: Connections,
    agents_dir: PathBuf,
) -> anyhow::Result<(
    approval_gateway::config::Config,
    agent_worker::config::Config,
    String,
    String,
)> {
    // Two people: the support desk asks for refunds and you approve them (nobody approves
    // their own request).
    let requester_key = "local-requester-key-0000".to_string();
    let key =
        std::env::var("COUNTERSIGN_DEMO_KEY").unwrap_or_else(|_| "local-demo-key-0000".into());
    let gateway = approval_gateway::config::Config {
        connections: connections.clone(),
        agents_dir: agents_dir.clone(),
        api_keys: vec![
            approval_gateway::config::ApiKey {
                key: key.clone().into(),
                role: approval_gateway::config::Role::Admin,
                principal: "you".into(),
                speaks_for: Vec::new(),
            },
            approval_gateway::config::ApiKey {
                key: requester_key.clone().into(),
                role: approval_gateway::config::Role::Requester,
                principal: "support-desk".into(),
                speaks_for: Vec::new(),
            },
        ],
        ..Default::default()
    };
    gateway.validate()?;
    let mut worker = agent_worker::config::Config {
        connections,
        agents_dir,
        ..Default::default()
    };
    worker.validate()?;

    Ok((gateway, worker, requester_key, key))
}

/// Starts a server binary, its output going to `log`, installing it with apt-get first when it
/// is missing and we are root.
fn spawn_server(binary: &str, args: &[&str], log: &Path) -> anyhow::Result<Child> {
    let path = find_binary(binary).or_else(|| {
        install_packages().ok()?;
        find_binary(binary)
    });
    let Some(path) = path else {
        bail!(
            "{binary} is not installed. Install it with `sudo apt-get install nats-server redis-server`, \
             or set NATS_URL and REDIS_URL to servers you run (NATS with JetStream on)."
        );
    };
    let output =
        std::fs::File::create(log).with_context(|| format!("create the log {}", log.display()))?;
    Command::new(path)
        .args(args)
        .stdout(output.try_clone()?)
        .stderr(output)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {binary}"))
}

fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/usr/bin", "/usr/local/bin"])
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}

fn install_packages() -> anyhow::Result<()> {
    let uid = std::process::Command::new("id").arg("-u").output()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        bail!("not root");
    }
    eprintln!("installing nats-server and redis-server with apt-get…");
    let ok = std::process::Command::new("sh")
        .args(["-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server redis-server"])
        .status()?
        .success();
    anyhow::ensure!(ok, "apt-get install failed");
    Ok(())
}

async fn wait_port(url: &str) -> anyhow::Result<()> {
    let addr = url.split("://").nth(1).unwrap_or(url).trim_end_matches('/');
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("nothing answers at {url}")
}

/// Copies the example agents, their tools at `tools`, switching the model to a real provider
/// when its key is set.
/// Writes the agents the runner serves into `out`, from the agent files in `examples` with
/// the demo tools' address and the model put in; files no longer in `examples` are removed.
/// The model used: `scripted`, `anthropic` or `openai`.
fn write_agents(examples: &Path, out: &Path, tools: &str) -> anyhow::Result<&'static str> {
    std::fs::create_dir_all(out)?;
    for entry in std::fs::read_dir(out)? {
        let path = entry?.path();
        let gone = path
            .file_name()
            .is_some_and(|name| !examples.join(name).exists());
        if gone && path.extension().is_some_and(|x| x == "toml") {
            std::fs::remove_file(&path)?;
        }
    }
    let provider = if std::env::var("ANTHROPIC_API_KEY").is_ok_and(|k| !k.is_empty()) {
        ("anthropic", "claude-sonnet-4-5")
    } else if std::env::var("OPENAI_API_KEY").is_ok_and(|k| !k.is_empty()) {
        ("openai", "gpt-4.1")
    } else {
        ("scripted", "")
    };
    for entry in std::fs::read_dir(examples)? {
        let path = entry?.path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path)?.replace(EXAMPLE_TOOLS, tools);
        let text = if provider.0 != "scripted"
            && !name.ends_with(countersign_model::agent::SCRIPT_SUFFIX)
        {
            let mut agent: toml::Table = toml::from_str(&text)?;
            // Only the scripted agents take the real model; an MCP proxy agent has none.
            if let Some(model) = agent
                .get_mut("model")
                .and_then(|m| m.as_table_mut())
                .filter(|m| m.get("provider").and_then(|p| p.as_str()) == Some("scripted"))
            {
                model.insert("provider".into(), provider.0.into());
                model.insert("name".into(), provider.1.into());
                model.remove("script");
            }
            toml::to_string(&agent)?
        } else {
            text
        };
        let generated = format!(
            "# Written by the local runner from {}: edit that file, not this copy.\n{text}",
            path.display()
        );
        std::fs::write(out.join(name), generated)?;
    }
    Ok(provider.0)
}

/// The agent files the runner serves are written from `examples` (the folder a user edits):
/// it is watched, and at each change the copy in `out` is written again, which the gateway and
/// the worker then reload as they reload any agents' folder. Until `stop`.
async fn follow_examples(
    examples: PathBuf,
    out: PathBuf,
    tools: String,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut seen = countersign_runtime::agents::fingerprint(&examples);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let now = countersign_runtime::agents::fingerprint(&examples);
        if now == seen {
            continue;
        }
        seen = now;
        // A half-saved or broken file is the services' to refuse, as for any agents' folder;
        // one that cannot be copied at all is said here, and the copy stays as it was.
        if let Err(e) = write_agents(&examples, &out, &tools) {
            eprintln!(
                "countersign-local: could not copy {}: {e:#}",
                examples.display()
            );
        }
    }
}

fn print_demo(gateway: &str, requester_key: &str, key: &str, provider: &str, agents: &Path) {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let agents = agents
        .canonicalize()
        .unwrap_or_else(|_| agents.to_path_buf());
    let agents = agents.display();
    let cli = repository.join("cli");
    let cli = cli.display();
    println!(
        r#"
countersign is running: gateway http://{gateway}, model: {provider}. Ctrl-C stops it.
Inbox: http://{gateway}/inbox (sign in with the key {key})
Agents: {agents} (edit these files: each change is loaded within a second)

# Try it in another terminal (README.md, "Run it", says what each step shows). Install the
# command line and point it at this gateway with your key:
cargo install --path {cli}     # or run it as `cargo run -q -p countersign-cli --`
export COUNTERSIGN_URL=http://{gateway} COUNTERSIGN_API_KEY={key}

# The support desk starts a run of the refund agent with its own key (nobody may approve
# their own request); it pauses before the refund:
RUN=$(COUNTERSIGN_API_KEY={requester_key} countersign runs start refunds \
  --input 'Order A-1001 arrived broken. Please refund it.')
countersign pending
countersign show $RUN

# Approve it (the listing quotes the digest you were shown, as the `decide:` line `show`
# printed does), follow the run to its end and check its audit trail:
countersign pending --where 'input.order_id == "A-1001"' --json | countersign approve --from -
countersign watch --run $RUN
countersign audit $RUN --verify
"#
    );
}
