//! The deployment of `deploy/compose.yaml`, every part in its own container as on its own
//! host (three NATS nodes with streams at three replicas, a Redis master with two replicas
//! and three Sentinels, two gateways, three workers), driven through 300 refund runs while,
//! one after another: the leader of the RUNS stream (and of APPROVALS, if another node leads
//! it) is killed; a worker is stopped; a worker is cut off the network for 20 s; the Redis
//! master is killed and Sentinel promotes a replica. Every run completes, each refund is
//! applied once, each run's audit trail verifies and shows one request, decision, execution
//! and completion per call (no run was driven twice), and the test prints, for each fault,
//! how long until decisions were accepted and until the runs resumed.
//!
//! Its own nextest profile, as it needs the services' binaries and several minutes:
//!   cargo build -p approval-gateway -p agent-worker
//!   cargo nextest run --workspace --profile multihost

use countersign_fake_model::{FakeModel, refund_brain};
use countersign_local::demo_tools::DemoTools;
use countersign_tests::app::refunds_agent;
use countersign_tests::output_of;
use futures::future::join_all;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const RUNS_PER_PHASE: usize = 60;
const PROJECT: &str = "countersign-multihost";
/// The compose network's subnet is fixed (`deploy/compose.yaml`); the host is its gateway.
const HOST_ON_NETWORK: &str = "10.97.45.1";
const REQUESTER_KEY: &str = "multihost-requester-key";
const REVIEWER_KEY: &str = "multihost-reviewer-key";
/// Reads the trails, whose receipts only an admin key is shown.
const ADMIN_KEY: &str = "multihost-admin-key";
/// How long anything may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(180);

/// The compose project, torn down (volumes too) when dropped.
struct Cluster {
    repo: PathBuf,
    dir: PathBuf,
    env: Vec<(&'static str, String)>,
}

impl Cluster {
    /// `docker-compose` on the project's files, with its settings.
    fn command(&self) -> Command {
        let mut command = Command::new("docker-compose");
        command
            .args(["-p", PROJECT, "-f"])
            .arg(self.repo.join("deploy/compose.yaml"))
            .arg("-f")
            .arg(self.dir.join("override.yaml"))
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())));
        command
    }

    fn compose(&self, args: &[&str]) -> String {
        output_of(self.command().args(args))
    }

    fn container(&self, service: &str) -> String {
        self.compose(&["ps", "-q", service]).trim().to_string()
    }

    fn ip(&self, service: &str) -> String {
        container_ip(&self.container(service))
    }
}

/// A container's address on the compose network (the test's host reaches it directly).
fn container_ip(container: &str) -> String {
    docker(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        container,
    ])
    .trim()
    .to_string()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What the services said, to see why.
            let logs = Command::new("docker-compose")
                .args(["-p", PROJECT, "-f"])
                .arg(self.repo.join("deploy/compose.yaml"))
                .arg("-f")
                .arg(self.dir.join("override.yaml"))
                .args([
                    "logs",
                    "--tail",
                    "40",
                    "gateway-1",
                    "worker-1",
                    "worker-2",
                    "worker-3",
                ])
                .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
                .output();
            if let Ok(logs) = logs {
                eprintln!("{}", String::from_utf8_lossy(&logs.stdout));
            }
        }
        let _ = Command::new("docker-compose")
            .args(["-p", PROJECT, "-f"])
            .arg(self.repo.join("deploy/compose.yaml"))
            .arg("-f")
            .arg(self.dir.join("override.yaml"))
            .args(["down", "-v", "--timeout", "5"])
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn docker(args: &[&str]) -> String {
    output_of(Command::new("docker").args(args))
}

/// Where cargo put this test, whose folder also holds the services' binaries.
fn binaries_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    for bin in ["approval-gateway", "agent-worker"] {
        assert!(
            dir.join(bin).exists(),
            "{} is missing: run `cargo build -p approval-gateway -p agent-worker` first",
            dir.join(bin).display()
        );
    }
    dir
}

/// Polls `check` every 100 ms until it gives `Some`, or fails after [`PATIENCE`].
async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Driver {
    http: reqwest::Client,
    gateways: Vec<String>,
}

impl Driver {
    /// A gateway, taking turns.
    fn gateway(&self, i: usize) -> &str {
        &self.gateways[i % self.gateways.len()]
    }

    async fn start(&self, i: usize) -> String {
        until("a run to be accepted", || async {
            let r = self
                .http
                .post(format!("{}/v1/runs", self.gateway(i)))
                .bearer_auth(REQUESTER_KEY)
                .json(&json!({"agent": "refunds", "input": format!("Multihost refund {i}.")}))
                .send()
                .await
                .ok()?;
            if r.status() != 202 {
                return None;
            }
            let body: Value = r.json().await.ok()?;
            body["run_id"].as_str().map(String::from)
        })
        .await
    }

    async fn run(&self, i: usize, run_id: &str) -> Option<Value> {
        let r = self
            .http
            .get(format!("{}/v1/runs/{run_id}", self.gateway(i)))
            .bearer_auth(REVIEWER_KEY)
            .send()
            .await
            .ok()?;
        if r.status() != 200 {
            return None;
        }
        r.json().await.ok()
    }

    async fn wait_status(&self, i: usize, run_id: &str, status: &str) -> Value {
        until(&format!("run {run_id} to be {status}"), || async {
            let run = self.run(i, run_id).await?;
            (run["status"] == status).then_some(run)
        })
        .await
    }

    /// Approves the run's held refund until a gateway takes the decision; when that was.
    async fn approve(&self, i: usize, run_id: &str, digest: &Value) -> Instant {
        let decision =
            json!({"decisions": [{"call_id": "toolu_2", "digest": digest, "action": "approve"}]});
        let mut attempt = i;
        until(&format!("the decision on {run_id} to be accepted"), || {
            attempt += 1;
            let gateway = self.gateway(attempt).to_string();
            let decision = decision.clone();
            async move {
                let r = self
                    .http
                    .post(format!("{gateway}/v1/runs/{run_id}/decisions"))
                    .bearer_auth(REVIEWER_KEY)
                    .json(&decision)
                    .send()
                    .await
                    .ok()?;
                (r.status() == 200).then(Instant::now)
            }
        })
        .await
    }
}

/// A fault to inject. A killed NATS node is started again after its phase, so the next
/// fault still has a quorum; the other faults stay.
enum Fault {
    KillStreamLeader(&'static str),
    StopWorker(&'static str),
    CutWorker(&'static str),
    KillRedisMaster,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_runs_survive_killed_leaders_lost_workers_a_network_cut_and_a_redis_failover()
{
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let repo = repo.canonicalize().unwrap();
    let bins = binaries_dir();
    let images = [
        ("COUNTERSIGN_IMAGE", "countersign-multihost/services:test"),
        ("NATS_IMAGE", "countersign-multihost/nats:test"),
        ("REDIS_IMAGE", "countersign-multihost/redis:test"),
    ];
    let build = Command::new(repo.join("deploy/build-local-images.sh"))
        .arg(&bins)
        .envs(images)
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );

    // The model and the tools run here; the containers reach them through the network's
    // gateway, this host.
    let model = FakeModel::start_on(
        tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap(),
        refund_brain,
    );
    let tools =
        DemoTools::serve(tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap()).unwrap();
    let on_network = |url: &str| {
        let port = url.rsplit(':').next().unwrap();
        format!("http://{HOST_ON_NETWORK}:{port}")
    };
    let dir = std::env::temp_dir().join(format!(
        "countersign-multihost-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(dir.join("agents")).unwrap();
    std::fs::create_dir_all(dir.join("config")).unwrap();
    let refunds_url = format!("{}/refunds", on_network(&tools.base_url));
    // Idempotent, as the chaos tests have it: a call cut off mid-way is sent again under
    // its key, and the tools apply it once.
    let agent = refunds_agent(
        "anthropic",
        &on_network(&model.base_url),
        &on_network(&tools.base_url),
    )
    .replace(
        &format!("http = {{ url = \"{refunds_url}\" }}"),
        &format!("http = {{ url = \"{refunds_url}\" }}\nidempotent = true"),
    );
    std::fs::write(dir.join("agents/refunds.toml"), agent).unwrap();
    // The gateways' shared receipt key, readable by the images' user.
    let (_, pem) = countersign_receipt::Signer::generate("multihost").unwrap();
    std::fs::write(dir.join("receipt-key.pem"), pem).unwrap();

    // Short leases, so a worker cut off hands its runs over within seconds.
    std::fs::write(
        dir.join("config/worker.toml"),
        "lease_secs = 5\nack_wait_secs = 5\nshutdown_grace_secs = 10\n",
    )
    .unwrap();
    let mounts = format!(
        "[\"{}:/etc/countersign/agents:ro\", \"{}:/etc/countersign/config:ro\"]",
        dir.join("agents").display(),
        dir.join("config").display()
    );
    let mut services = String::new();
    for gateway in ["gateway-1", "gateway-2"] {
        services += &format!("  {gateway}:\n    volumes: {mounts}\n");
    }
    for worker in ["worker-1", "worker-2", "worker-3"] {
        services += &format!(
            "  {worker}:\n    volumes: {mounts}\n    environment:\n      COUNTERSIGN_CONFIG: /etc/countersign/config/worker.toml\n"
        );
    }
    std::fs::write(dir.join("override.yaml"), format!("services:\n{services}")).unwrap();
    let mut env: Vec<(&'static str, String)> =
        images.iter().map(|(k, v)| (*k, v.to_string())).collect();
    env.extend([
        (
            "COUNTERSIGN_API_KEYS",
            format!(
                "{REQUESTER_KEY}:requester:desk,{REVIEWER_KEY}:reviewer:rita,{ADMIN_KEY}:admin:ops"
            ),
        ),
        // The NATS users' passwords (deploy/nats-server.conf), new for each run; each starts
        // with a letter, as NATS reads them as configuration values.
        (
            "NATS_GATEWAY_PASSWORD",
            format!("pw{}", uuid::Uuid::new_v4().simple()),
        ),
        (
            "NATS_WORKER_PASSWORD",
            format!("pw{}", uuid::Uuid::new_v4().simple()),
        ),
        (
            "NATS_ADMIN_PASSWORD",
            format!("pw{}", uuid::Uuid::new_v4().simple()),
        ),
        (
            "COUNTERSIGN_RECEIPT_KEY",
            dir.join("receipt-key.pem").display().to_string(),
        ),
        ("GATEWAY_1_PUBLISH", "127.0.0.1:".to_string()),
        ("GATEWAY_2_PUBLISH", "127.0.0.1:".to_string()),
        ("NATS_MONITOR_PUBLISH", "127.0.0.1:".to_string()),
        ("RUST_LOG", "warn".to_string()),
    ]);
    let cluster = Cluster { repo, dir, env };
    // Whatever an earlier, interrupted run left.
    let _ = cluster
        .command()
        .args(["down", "-v", "--timeout", "1"])
        .output();
    let started = Instant::now();
    cluster.compose(&["up", "-d"]);

    let driver = Driver {
        http: reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap(),
        gateways: vec![
            format!("http://{}:8080", cluster.ip("gateway-1")),
            format!("http://{}:8080", cluster.ip("gateway-2")),
        ],
    };
    for service in ["gateway-1", "gateway-2", "worker-1", "worker-2", "worker-3"] {
        let port = if service.starts_with("gateway") {
            8080
        } else {
            9090
        };
        let url = format!("http://{}:{port}/readyz", cluster.ip(service));
        until(&format!("{service} to be ready"), || async {
            let r = driver.http.get(&url).send().await.ok()?;
            (r.status() == 200).then_some(())
        })
        .await;
    }
    println!(
        "cluster ready after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let mut faults = vec![Fault::KillStreamLeader("RUNS")];
    let leaders = stream_leaders(&driver, &cluster).await;
    if leaders["APPROVALS"] != leaders["RUNS"] {
        faults.push(Fault::KillStreamLeader("APPROVALS"));
    }
    faults.extend([
        Fault::StopWorker("worker-1"),
        Fault::CutWorker("worker-2"),
        Fault::KillRedisMaster,
    ]);
    let total = 300.max(faults.len() * RUNS_PER_PHASE);
    let per_phase = total / faults.len();
    let mut all_runs = Vec::new();
    for (phase, fault) in faults.iter().enumerate() {
        let first = phase * per_phase;
        let count = if phase + 1 == faults.len() {
            total - first
        } else {
            per_phase
        };
        let ids: Vec<String> = join_all((first..first + count).map(|i| driver.start(i))).await;
        let paused = join_all(
            ids.iter()
                .enumerate()
                .map(|(k, id)| driver.wait_status(k, id, "awaiting_approval")),
        )
        .await;
        let digests: Vec<Value> = paused
            .iter()
            .map(|r| r["pending"][0]["digest"].clone())
            .collect();

        let (label, restore) = inject(&cluster, &driver, fault).await;
        let injected = Instant::now();
        let accepted = join_all(
            ids.iter()
                .enumerate()
                .map(|(k, id)| driver.approve(k, id, &digests[k])),
        )
        .await;
        let first_accepted = accepted.iter().min().unwrap().duration_since(injected);
        let all_accepted = accepted.iter().max().unwrap().duration_since(injected);
        join_all(
            ids.iter()
                .enumerate()
                .map(|(k, id)| driver.wait_status(k, id, "completed")),
        )
        .await;
        let resumed = injected.elapsed();
        println!(
            "{label}: decisions accepted after {:.1} s (all {count} after {:.1} s); all {count} runs completed after {:.1} s",
            first_accepted.as_secs_f64(),
            all_accepted.as_secs_f64(),
            resumed.as_secs_f64()
        );
        if let Some(restore) = restore {
            restore.apply(&driver).await;
        }
        all_runs.extend(ids);
    }

    // Each refund applied once; each run driven once (one of each step in its trail).
    let refunds = tools.refunds();
    assert_eq!(refunds.len(), all_runs.len(), "refunds applied");
    let by_key = tools.received_by_key("/refunds");
    // Both gateways publish the one shared key, which every receipt below verifies with.
    let mut published = Vec::new();
    for i in 0..2 {
        let keys: countersign_receipt::KeySet = driver
            .http
            .get(format!("{}/.well-known/jwks.json", driver.gateway(i)))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        published.push(keys);
    }
    assert_eq!(published[0], published[1]);
    assert_eq!(published[0].keys.len(), 1);
    let keys = published.remove(0);
    for (i, id) in all_runs.iter().enumerate() {
        let key = format!("{id}:1:toolu_2");
        assert!(
            by_key.get(&key).copied().unwrap_or(0) >= 1,
            "run {id} was refunded"
        );
        let trail: Value = driver
            .http
            .get(format!("{}/v1/runs/{id}/audit", driver.gateway(i)))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(trail["verified"], true, "run {id}: {trail}");
        let kinds = countersign_tests::audit_kinds(&trail);
        for kind in ["requested", "decided", "completed"] {
            assert_eq!(
                kinds.iter().filter(|k| *k == kind).count(),
                1,
                "run {id}: {kinds:?}"
            );
        }
        // The order lookup (free, before the pause) and the approved refund, each once.
        let executed: Vec<&Value> = trail["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["entry"]["kind"] == "executed")
            .collect();
        let calls: Vec<&str> = executed
            .iter()
            .map(|e| e["entry"]["call_id"].as_str().unwrap())
            .collect();
        assert_eq!(calls, ["toolu_1", "toolu_2"], "run {id}: {kinds:?}");
        // Whichever gateway recorded the approval signed its receipt with the shared key.
        let executed = executed[1];
        let receipt = executed["entry"]["detail"]["receipt"].as_str().unwrap();
        let claims = countersign_receipt::signed_by(receipt, &keys).unwrap();
        assert_eq!(claims.run_id, *id);
    }
    println!(
        "{} runs completed, each refund applied once, in {:.1} s",
        all_runs.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Which NATS node leads each stream, from a node's monitoring endpoint.
async fn stream_leaders(
    driver: &Driver,
    cluster: &Cluster,
) -> std::collections::HashMap<String, String> {
    until("the streams' leaders", || async {
        for node in ["nats-1", "nats-2", "nats-3"] {
            let url = format!("http://{}:8222/jsz?streams=true", cluster.ip(node));
            let Ok(r) = driver.http.get(&url).send().await else {
                continue;
            };
            let Ok(jsz) = r.json::<Value>().await else {
                continue;
            };
            let leaders: std::collections::HashMap<String, String> = jsz["account_details"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|a| a["stream_detail"].as_array().cloned().unwrap_or_default())
                .filter_map(|s| {
                    Some((
                        s["name"].as_str()?.to_string(),
                        s["cluster"]["leader"].as_str()?.to_string(),
                    ))
                })
                .collect();
            if leaders.contains_key("RUNS") && leaders.contains_key("APPROVALS") {
                return Some(leaders);
            }
        }
        None
    })
    .await
}

/// What puts things back after a fault, before the next.
enum Restore {
    /// Start the killed NATS node again and wait until its JetStream is current.
    StartNats(String),
    /// The worker is reconnected 20 s after the cut, whatever the runs do meanwhile.
    Reconnect(tokio::task::JoinHandle<()>),
}

impl Restore {
    async fn apply(self, driver: &Driver) {
        match self {
            Restore::StartNats(container) => {
                docker(&["start", &container]);
                let url = format!("http://{}:8222/healthz", container_ip(&container));
                until("the restarted NATS node to be current", || async {
                    let r = driver.http.get(&url).send().await.ok()?;
                    (r.status() == 200).then_some(())
                })
                .await;
            }
            Restore::Reconnect(reconnect) => reconnect.await.unwrap(),
        }
    }
}

/// Injects the fault; its label, and what to do once the phase's runs are done.
async fn inject(cluster: &Cluster, driver: &Driver, fault: &Fault) -> (String, Option<Restore>) {
    match fault {
        Fault::KillStreamLeader(stream) => {
            let leader = stream_leaders(driver, cluster).await[*stream].clone();
            let container = cluster.container(&leader);
            docker(&["kill", &container]);
            let label = format!("SIGKILL {leader}, leader of {stream}");
            (label, Some(Restore::StartNats(container)))
        }
        Fault::StopWorker(worker) => {
            cluster.compose(&["stop", worker]);
            (format!("stop {worker}"), None)
        }
        Fault::CutWorker(worker) => {
            let container = cluster.container(worker);
            let network = docker(&[
                "inspect",
                "-f",
                "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}}{{end}}",
                &container,
            ])
            .trim()
            .to_string();
            docker(&["network", "disconnect", &network, &container]);
            let reconnect = tokio::spawn(async move {
                // The cut lasts 20 s, as a network partition would, not until a condition.
                tokio::time::sleep(Duration::from_secs(20)).await;
                docker(&["network", "connect", &network, &container]);
            });
            let label = format!("cut {worker} off the network for 20 s");
            (label, Some(Restore::Reconnect(reconnect)))
        }
        Fault::KillRedisMaster => {
            let sentinel = cluster.ip("sentinel-1");
            let mut conn = redis::Client::open(format!("redis://{sentinel}:26379"))
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let master: Vec<String> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg("countersign")
                .query_async(&mut conn)
                .await
                .unwrap();
            let service = ["redis-1", "redis-2", "redis-3"]
                .into_iter()
                .find(|s| cluster.ip(s) == master[0])
                .expect("the master is one of the Redis services");
            docker(&["kill", &cluster.container(service)]);
            (format!("SIGKILL the Redis master {service}"), None)
        }
    }
}
