//! `cargo run -p countersign-local`: the whole system on one machine. Starts NATS and Redis
//! as child processes unless `NATS_URL`/`REDIS_URL` point at running ones, the demo tools
//! service, a gateway and a worker with the example refund agent, and prints the command
//! lines (`countersign`) that take a run through pause, approval and completion.

use anyhow::{Context, bail};
use countersign_local::demo_tools::DemoTools;
use countersign_shared::infra::InfraConfig;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// Where the child servers keep their data, and the generated agents folder.
const STATE_DIR: &str = ".countersign";
const NATS_PORT: u16 = 14222;
const REDIS_PORT: u16 = 16379;
const GATEWAY: &str = "127.0.0.1:8080";
/// The demo tools' address, as the example agent's tool URLs say.
const TOOLS: &str = "127.0.0.1:9100";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = countersign_shared::telemetry::init("countersign-local");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let state = root.join(STATE_DIR);
    let mut infra = InfraConfig::default();
    infra.apply_env()?;
    let children = start_servers(&state, &mut infra)?;
    wait_port(&infra.nats_url).await?;
    wait_port(&infra.redis_url).await?;

    let agents_dir = state.join("agents");
    let provider = write_agents(&root.join("examples/agents"), &agents_dir)?;
    DemoTools::serve(
        tokio::net::TcpListener::bind(TOOLS)
            .await
            .context("bind the demo tools on 127.0.0.1:9100")?,
    )?;

    let (gateway, worker, requester_key, key) = configs(infra, agents_dir)?;

    let shutdown = CancellationToken::new();
    tokio::spawn(countersign_shared::shutdown::on_signal(shutdown.clone()));
    let listener = tokio::net::TcpListener::bind(GATEWAY)
        .await
        .context("bind the gateway on 127.0.0.1:8080")?;
    let gateway = tokio::spawn(approval_gateway::run(gateway, listener, shutdown.clone()));
    let health = tokio::net::TcpListener::bind(&worker.health_listen)
        .await
        .with_context(|| format!("bind the worker's probes on {}", worker.health_listen))?;
    let worker = tokio::spawn(agent_worker::run(worker, health, shutdown.clone()));
    print_demo(&requester_key, &key, provider);
    let (g, w) = tokio::join!(gateway, worker);
    g??;
    w??;
    drop(children);
    Ok(())
}

/// NATS and Redis as child processes, each unless `NATS_URL` / `REDIS_URL` names a server
/// already running; `infra` is pointed at them.
fn start_servers(state: &std::path::Path, infra: &mut InfraConfig) -> anyhow::Result<Vec<Child>> {
    let mut children = Vec::new();
    if std::env::var("NATS_URL").is_err() {
        let dir = state.join("nats");
        std::fs::create_dir_all(&dir)?;
        let port = NATS_PORT.to_string();
        let sd = dir.to_string_lossy().to_string();
        children.push(spawn_server(
            "nats-server",
            &["-js", "-a", "127.0.0.1", "-p", &port, "-sd", &sd],
        )?);
        infra.nats_url = format!("nats://127.0.0.1:{NATS_PORT}");
    }
    if std::env::var("REDIS_URL").is_err() {
        let dir = state.join("redis");
        std::fs::create_dir_all(&dir)?;
        let port = REDIS_PORT.to_string();
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
        children.push(spawn_server("redis-server", &args)?);
        infra.redis_url = format!("redis://127.0.0.1:{REDIS_PORT}");
    }
    Ok(children)
}

/// The gateway's and the worker's configuration, and the requester's and your keys.
fn configs(
    infra: InfraConfig,
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
        infra: infra.clone(),
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
        infra,
        agents_dir,
        ..Default::default()
    };
    worker.validate()?;

    Ok((gateway, worker, requester_key, key))
}

/// Starts a server binary, installing it with apt-get first when it is missing and we are root.
fn spawn_server(binary: &str, args: &[&str]) -> anyhow::Result<Child> {
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
    Command::new(path)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
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

/// Copies the example agents, switching the model to a real provider when its key is set.
fn write_agents(examples: &Path, out: &Path) -> anyhow::Result<&'static str> {
    std::fs::create_dir_all(out)?;
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
        let text = std::fs::read_to_string(&path)?;
        let text = if provider.0 != "scripted"
            && !name.ends_with(countersign_shared::agent::SCRIPT_SUFFIX)
        {
            let mut agent: toml::Table = toml::from_str(&text)?;
            if let Some(model) = agent.get_mut("model").and_then(|m| m.as_table_mut()) {
                model.insert("provider".into(), provider.0.into());
                model.insert("name".into(), provider.1.into());
                model.remove("script");
            }
            toml::to_string(&agent)?
        } else {
            text
        };
        std::fs::write(out.join(name), text)?;
    }
    Ok(provider.0)
}

fn print_demo(requester_key: &str, key: &str, provider: &str) {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let cli = repository.join("cli");
    let cli = cli.display();
    println!(
        r#"
countersign is running: gateway http://{GATEWAY}, model: {provider}. Ctrl-C stops it.

# In another terminal: install the command line once (or run it as
# `cargo run -q -p countersign-cli --`) and point it at this gateway with your key:
cargo install --path {cli}
export COUNTERSIGN_URL=http://{GATEWAY} COUNTERSIGN_API_KEY={key}

# 1. The support desk starts a run of the refund agent (it prints the run's id):
RUN=$(COUNTERSIGN_API_KEY={requester_key} countersign runs start refunds \
  --input 'Order A-1001 arrived broken. Please refund it.')

# 2. It pauses before the refund. See what waits, then the request as a reviewer sees it:
#    what the agent said, the call's summary, reason, exact input and digest:
countersign pending
countersign show $RUN

# 3. Approve the refund: run the `decide:` line `show` printed under the call, which quotes
#    the call's id and the digest you were shown; a call that changed since is refused,
#    never approved unseen.

# 4. Follow the run to its end, and check its audit trail's hash chain:
countersign watch --run $RUN
countersign audit $RUN --verify
"#
    );
}
