//! The local runner (`cargo run -p countersign-local`) as a person runs it: started again and
//! again on a fresh data folder, it prints its banner only once a run can be started and
//! taken; a child server that dies, or a worker that fails, is reported at once and stops it
//! with a failure; a second runner on the same ports says another one runs and how to stop it
//! or move; the demo agent on MCP tools pauses and completes once approved, and an MCP client
//! reaches the demo tools through the gateway; the agent files it serves are the ones its
//! banner names, and an edit to them is loaded while it runs and kept when it starts again.
//! Its output, not a terminal, carries no colour codes.

use countersign_runtime::names::Names;
use countersign_tests::wait_for;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};

const STARTS: usize = 50;
/// How long a start may take to print its banner before the test fails.
const BANNER_WITHIN: Duration = Duration::from_secs(30);
const REQUESTER_KEY: &str = "local-requester-key-0000";
/// The key the runner prints for deciding.
const DEMO_KEY: &str = "local-demo-key-0000";
const BANNER: &str = "countersign is running";

/// A runner started on its own ports and data folder.
pub(super) struct Runner {
    child: Child,
    offset: u16,
    pub(super) gateway: String,
    stderr: Option<ChildStderr>,
    /// Everything it printed on stdout, up to the end of its banner's first paragraph.
    stdout: String,
    /// What it printed on stdout after that (its logs), as it prints it.
    after_banner: std::sync::Arc<std::sync::Mutex<String>>,
}

/// Ports offsets whose five ports (see `countersign_local::place`) are free now, so this test
/// stays clear of other tests and of a runner someone has open.
pub(super) fn free_offset() -> u16 {
    loop {
        let offset = 1000 + (uuid::Uuid::new_v4().as_u128() % 150) as u16 * 100;
        let free = [8080, 9090, 9100, 14222, 16379]
            .iter()
            .all(|port| std::net::TcpListener::bind(("127.0.0.1", port + offset)).is_ok());
        if free {
            return offset;
        }
    }
}

pub(super) fn fresh_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("countersign-local-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn runner_command(dir: &Path, offset: u16) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_local_runner"));
    command
        .env("COUNTERSIGN_LOCAL_DIR", dir)
        .env("COUNTERSIGN_LOCAL_PORT_OFFSET", offset.to_string())
        .env("RUST_LOG", "warn")
        .env_remove("NATS_URL")
        .env_remove("REDIS_URL")
        .env_remove("NO_COLOR")
        .env_remove("COUNTERSIGN_DEMO_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Starts a runner and waits for its banner; returns it and how long the banner took.
pub(super) async fn start(dir: &Path, offset: u16) -> (Runner, Duration) {
    start_command(runner_command(dir, offset), offset).await
}

/// [`start`] with `command`, a [`runner_command`] of `offset` the test changed.
async fn start_command(mut command: Command, offset: u16) -> (Runner, Duration) {
    let started = Instant::now();
    let mut child = command.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stdout = String::new();
    let banner = tokio::time::timeout(BANNER_WITHIN, async {
        let mut seen = false;
        while let Some(line) = lines.next_line().await.unwrap() {
            stdout.push_str(&line);
            stdout.push('\n');
            if line.contains(BANNER) {
                seen = true;
            } else if seen && line.is_empty() {
                // The banner's paragraph ends here.
                return true;
            }
        }
        false
    })
    .await;
    let took = started.elapsed();
    let stderr = child.stderr.take();
    let mut runner = Runner {
        child,
        offset,
        gateway: format!("http://127.0.0.1:{}", 8080 + offset),
        stderr,
        stdout,
        after_banner: Default::default(),
    };
    if banner != Ok(true) {
        let _ = runner.child.start_kill();
        let (_, stderr) = runner.ended().await;
        panic!(
            "no banner within {BANNER_WITHIN:?} ({banner:?}); stdout:\n{}\nstderr:\n{stderr}",
            runner.stdout
        );
    }
    // The rest of stdout is drained so the runner never blocks on a full pipe.
    let after_banner = runner.after_banner.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let mut kept = after_banner.lock().unwrap();
            kept.push_str(&line);
            kept.push('\n');
        }
    });
    (runner, took)
}

impl Runner {
    /// Waits for the runner to exit; its status and everything it wrote on stderr.
    async fn ended(&mut self) -> (ExitStatus, String) {
        let mut stderr = String::new();
        if let Some(mut pipe) = self.stderr.take() {
            pipe.read_to_string(&mut stderr).await.unwrap();
        }
        (self.child.wait().await.unwrap(), stderr)
    }

    /// Stops the runner as Ctrl-C does and checks that it stopped cleanly.
    pub(super) async fn stop(mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id().unwrap() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
        let (status, stderr) = tokio::time::timeout(Duration::from_secs(30), self.ended())
            .await
            .expect("the runner stops within 30 s of Ctrl-C");
        assert!(status.success(), "{status}; stderr:\n{stderr}");
        assert_no_colour(&stderr);
    }

    /// Starts a refund run of `agent` as the support desk and waits until the worker has
    /// paused it; its id.
    async fn run_a_refund(&self, agent: &str) -> String {
        countersign_tests::start_until_paused(
            &reqwest::Client::new(),
            &self.gateway,
            REQUESTER_KEY,
            agent,
            "a run started right after the banner",
            Duration::from_secs(20),
        )
        .await
    }

    /// The runner's child process named `name` (`nats-server`, `redis-server`).
    fn child_server(&self, name: &str) -> i32 {
        let runner = self.child.id().unwrap().to_string();
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .find(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // "pid (comm) state ppid …"
                let Some((comm, rest)) = stat.split_once(") ") else {
                    return false;
                };
                comm.ends_with(&format!("({name}"))
                    && rest.split(' ').nth(1) == Some(runner.as_str())
            })
            .unwrap_or_else(|| panic!("the runner has no {name} child"))
    }
}

fn assert_no_colour(output: &str) {
    assert!(
        !output.contains('\u{1b}'),
        "colour codes in output that is not a terminal:\n{output}"
    );
}

#[tokio::test]
async fn the_local_runner_started_again_and_again_on_a_fresh_folder_takes_a_run_right_after_its_banner()
 {
    let mut slowest = Duration::ZERO;
    for start_number in 0..STARTS {
        let dir = fresh_dir();
        let (runner, took) = start(&dir, free_offset()).await;
        slowest = slowest.max(took);
        assert_no_colour(&runner.stdout);
        runner.run_a_refund("refunds").await;
        runner.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("start {start_number}: banner after {took:?}");
    }
    println!(
        "{STARTS} starts of the local runner on a fresh folder: each took a run; slowest banner after {slowest:?}"
    );
}

#[tokio::test]
async fn the_demo_agent_on_mcp_tools_pauses_and_completes_once_approved() {
    let dir = fresh_dir();
    let offset = free_offset();
    // With the logging a newcomer gets: no RUST_LOG.
    let mut command = runner_command(&dir, offset);
    command.env_remove("RUST_LOG");
    let (runner, _) = start_command(command, offset).await;
    let run_id = runner.run_a_refund("refunds-mcp").await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/runs/{run_id}", runner.gateway);
    let read = || async {
        let run: serde_json::Value = http
            .get(&url)
            .bearer_auth(REQUESTER_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        run
    };
    let paused = read().await;
    assert_eq!(paused["pending"][0]["tool"], "issue_refund");
    let decided = http
        .post(format!("{url}/decisions"))
        .bearer_auth(DEMO_KEY)
        .json(&serde_json::json!({"decisions": [{
            "call_id": paused["pending"][0]["call_id"],
            "digest": paused["pending"][0]["digest"],
            "action": "approve",
        }]}))
        .send()
        .await
        .unwrap();
    assert_eq!(decided.status(), 200, "{}", decided.text().await.unwrap());
    let done = wait_for(
        "the MCP run to complete",
        Duration::from_secs(20),
        || async {
            let run = read().await;
            (run["status"] == "completed").then_some(run)
        },
    )
    .await;
    assert!(
        done["answer"].as_str().unwrap().contains("A-1001"),
        "{done}"
    );

    // An MCP client the runner does not run reaches the same tools through the gateway.
    let config = StreamableHttpClientTransportConfig::with_uri(format!(
        "{}/mcp/refunds-proxy",
        runner.gateway
    ))
    .auth_header(REQUESTER_KEY);
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 2, "{tools:?}");
    let lookup: CallToolRequestParams = serde_json::from_value(serde_json::json!({
        "name": "get_order", "arguments": {"order_id": "A-1001"},
    }))
    .unwrap();
    let answer = client.call_tool(lookup).await.unwrap();
    assert_ne!(answer.is_error, Some(true), "{answer:?}");
    assert!(format!("{answer:?}").contains("delivered"), "{answer:?}");
    client.cancel().await.unwrap();
    // The MCP SDK's own `info` lines (each session, with dumps of its messages) are not
    // among the runner's logs.
    let logs = wait_for(
        "the runner's info lines",
        Duration::from_secs(20),
        || async {
            let logs = runner.after_banner.lock().unwrap().clone();
            logs.contains("paused for approval").then_some(logs)
        },
    )
    .await;
    assert!(!logs.lines().any(|line| line.contains(" rmcp::")), "{logs}");
    runner.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_child_server_that_dies_is_reported_at_once_and_stops_the_runner_with_a_failure() {
    let dir = fresh_dir();
    let (mut runner, _) = start(&dir, free_offset()).await;
    let nats = rustix::process::Pid::from_raw(runner.child_server("nats-server")).unwrap();
    let killed = Instant::now();
    rustix::process::kill_process(nats, rustix::process::Signal::KILL).unwrap();
    let (status, stderr) = tokio::time::timeout(Duration::from_secs(5), runner.ended())
        .await
        .expect("the runner exits");
    let took = killed.elapsed();
    println!("the runner exited {took:?} after its nats-server was killed");
    assert!(!status.success(), "{status}; stderr:\n{stderr}");
    assert!(
        stderr.contains("the nats-server stopped: it exited (signal: 9")
            && stderr.contains("stopping the rest"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(1), "{took:?}; stderr:\n{stderr}");
    // Redis went with it.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", 16379 + runner.offset)).is_err(),
        "redis-server still answers"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_second_runner_on_the_same_ports_says_one_runs_and_how_to_stop_it_or_move() {
    let dir = fresh_dir();
    let offset = free_offset();
    let (first, _) = start(&dir, offset).await;
    let first_pid = first.child.id().unwrap();

    let second = runner_command(&dir, offset).output();
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second runner gives up at once")
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    for said in [
        "another countersign-local seems to be running",
        &format!("kill {first_pid}"),
        "COUNTERSIGN_LOCAL_PORT_OFFSET=",
    ] {
        assert!(stderr.contains(said), "{said:?} missing from:\n{stderr}");
    }
    // The first runner goes on as it was.
    first.run_a_refund("refunds").await;
    first.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_worker_that_fails_inside_the_runner_is_reported_and_the_runner_exits_within_a_second() {
    let dir = fresh_dir();
    let offset = free_offset();
    let (first, _) = start(&dir, offset).await;
    // In the runner's NATS, a push consumer takes the name of the workers' pull consumer.
    // As the runner's NATS admin, whose password it wrote beside the server's data.
    let nats = format!("127.0.0.1:{}", 14222 + offset);
    let conf = std::fs::read_to_string(dir.join("nats/nats-server.conf")).unwrap();
    let password = conf
        .lines()
        .find_map(|l| l.strip_prefix("NATS_ADMIN_PASSWORD: \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("the admin's password in the runner's NATS configuration");
    let client =
        async_nats::ConnectOptions::with_user_and_password("admin".into(), password.into())
            .connect(nats)
            .await
            .unwrap();
    let js = async_nats::jetstream::new(client);
    let names = Names::new("").unwrap();
    let runs = js.get_stream(names.runs_stream()).await.unwrap();
    runs.delete_consumer(&names.start_consumer()).await.unwrap();
    runs.create_consumer(async_nats::jetstream::consumer::push::Config {
        durable_name: Some(names.start_consumer()),
        deliver_subject: "elsewhere".into(),
        filter_subject: names.runs_start(),
        ..Default::default()
    })
    .await
    .unwrap();
    first.stop().await;

    // Started again on that data, its worker cannot pull and stops with an error.
    let mut second = runner_command(&dir, offset).spawn().unwrap();
    let mut stderr = BufReader::new(second.stderr.take().unwrap()).lines();
    let mut said = String::new();
    let mut reported = None;
    tokio::time::timeout(BANNER_WITHIN, async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("the worker stopped") {
                reported = Some(Instant::now());
            }
            said.push_str(&line);
            said.push('\n');
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the runner still runs; it said:\n{said}"));
    let status = second.wait().await.unwrap();
    let reported = reported.unwrap_or_else(|| panic!("no report of the worker in:\n{said}"));
    let exited_after = reported.elapsed();
    println!("the runner exited {exited_after:?} after reporting its worker stopped");
    assert!(!status.success(), "{said}");
    assert!(said.contains(&names.start_consumer()), "{said}");
    assert!(exited_after < Duration::from_secs(1), "{exited_after:?}");
    let mut stdout = String::new();
    second
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .await
        .unwrap();
    assert!(
        !stdout.contains(BANNER),
        "a banner with no worker:\n{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs one refund of the demo agent as the support desk, the model asking $129; the status
/// the run first settles in, `awaiting_approval` or `completed`.
async fn settled_refund(runner: &Runner) -> String {
    let http = reqwest::Client::new();
    let started = http
        .post(format!("{}/v1/runs", runner.gateway))
        .bearer_auth(REQUESTER_KEY)
        .json(&serde_json::json!({"agent": "refunds", "input": "Refund order A-1001."}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let run: serde_json::Value = started.json().await.unwrap();
    let url = format!(
        "{}/v1/runs/{}",
        runner.gateway,
        run["run_id"].as_str().unwrap()
    );
    wait_for(
        "the run to pause or end",
        Duration::from_secs(20),
        || async {
            let run: serde_json::Value = http
                .get(&url)
                .bearer_auth(REQUESTER_KEY)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let status = run["status"].as_str()?.to_string();
            ["awaiting_approval", "completed"]
                .contains(&status.as_str())
                .then_some(status)
        },
    )
    .await
}

/// The banner says where to decide and which agent files to edit; a policy edited there is
/// in force while the runner runs, and still after it starts again on the same data folder
/// (the runner's own copy of the agents is written from them, never the other way round).
#[tokio::test]
async fn the_agent_files_the_banner_names_are_the_ones_served_and_edits_to_them_last() {
    let dir = fresh_dir();
    let agents = dir.join("my-agents");
    std::fs::create_dir_all(&agents).unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, agents.join(path.file_name().unwrap())).unwrap();
    }
    let offset = free_offset();
    let serving = || {
        let mut command = runner_command(&dir, offset);
        command.env("COUNTERSIGN_LOCAL_AGENTS", &agents);
        command
    };
    let (runner, _) = start_command(serving(), offset).await;
    let inbox = format!(
        "Inbox: http://127.0.0.1:{}/inbox (sign in with the key {DEMO_KEY})",
        8080 + offset
    );
    assert!(runner.stdout.contains(&inbox), "{}", runner.stdout);
    let named = format!(
        "Agents: {} (edit these files",
        agents.canonicalize().unwrap().display()
    );
    assert!(runner.stdout.contains(&named), "{}", runner.stdout);
    assert_eq!(settled_refund(&runner).await, "awaiting_approval");

    // Refunds up to $500 no longer need a person: the demo's $129 runs at once, once loaded.
    let file = agents.join("refunds.toml");
    let policy = std::fs::read_to_string(&file).unwrap();
    assert!(policy.contains("input.amount > 20.0"), "{policy}");
    std::fs::write(
        &file,
        policy.replace("input.amount > 20.0", "input.amount > 500.0"),
    )
    .unwrap();
    wait_for(
        "the edited policy to be in force",
        Duration::from_secs(30),
        || async { (settled_refund(&runner).await == "completed").then_some(()) },
    )
    .await;
    runner.stop().await;

    let (runner, _) = start_command(serving(), offset).await;
    assert_eq!(
        settled_refund(&runner).await,
        "completed",
        "the edit was lost at the restart"
    );
    runner.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
