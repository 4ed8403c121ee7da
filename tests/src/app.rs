//! `TestApp`: one gateway and any number of workers, in-process, against real NATS and Redis,
//! with the demo tools service and a fake model. Each app has its own namespace.

use crate::infra::Infra;
use crate::wait_for;
use approval_gateway::config::{ApiKey, Person, Role};
use countersign_fake_model::{Brain, FakeModel};
use countersign_local::demo_tools::{Countersigned, DemoTools};
use countersign_model::agent::Provider;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::run::{Action, Decision, RunId};
use countersign_runtime::metrics::Metrics;
use countersign_runtime::names::{Names, Service};
use countersign_store::keys::Keys;
use countersign_store::{DecideOutcome, DecideRequest, Proposal, Store};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const ADMIN_KEY: &str = "test-admin-key-0123456789";
pub const REVIEWER_KEY: &str = "test-reviewer-key-0123456789";
pub const REQUESTER_KEY: &str = "test-requester-key-0123456789";
pub const READER_KEY: &str = "test-reader-key-0123456789";
/// A system's key that may decide on behalf of the configured people (the requester key may
/// start runs for them too).
pub const INTEGRATION_KEY: &str = "test-integration-key-0123456789";

/// The configured people and their roles. Slack ids are `U_<ID>`, emails `<id>@example.com`.
pub const PEOPLE: [(&str, &[&str]); 4] = [
    ("alice", &["finance"]),
    ("bob", &["finance"]),
    ("carol", &["support"]),
    ("rick", &["finance"]),
];

/// The configured people, as both services have them.
pub fn people() -> Vec<Person> {
    PEOPLE
        .iter()
        .map(|(id, roles)| Person {
            id: id.to_string(),
            roles: roles.iter().map(std::string::ToString::to_string).collect(),
            slack_user: Some(format!("U_{}", id.to_uppercase())),
            email: Some(format!("{id}@example.com")),
            // rick starts runs with a requester key and reviews as a person (finance).
            role: (*id == "rick").then_some(Role::Reviewer),
        })
        .collect()
}

/// The gateway's configuration of a test app: its API keys and people, on `infra`'s servers
/// in `namespace`, with the agents of `agents_dir`.
pub fn gateway_config(
    infra: &Infra,
    namespace: &str,
    agents_dir: &std::path::Path,
) -> approval_gateway::config::Config {
    let mut config = approval_gateway::config::Config {
        connections: infra.connections(namespace, Service::Gateway),
        agents_dir: agents_dir.to_path_buf(),
        ..Default::default()
    };
    config.api_keys = [
        (ADMIN_KEY, Role::Admin, "admin"),
        (REVIEWER_KEY, Role::Reviewer, "rita"),
        (REQUESTER_KEY, Role::Requester, "rick"),
        (READER_KEY, Role::Reader, "reed"),
        (INTEGRATION_KEY, Role::Reviewer, "ops-bot"),
    ]
    .into_iter()
    .map(|(key, role, principal)| ApiKey {
        key: key.into(),
        role,
        principal: principal.into(),
        speaks_for: if key == INTEGRATION_KEY || key == REQUESTER_KEY {
            PEOPLE.iter().map(|(id, _)| id.to_string()).collect()
        } else {
            Vec::new()
        },
    })
    .collect();
    config.people = people();
    config
}

/// A test app's worker configuration: short leases and ack waits, so redelivery tests are
/// quick.
pub fn worker_config(
    connections: countersign_runtime::config::Connections,
    agents_dir: &std::path::Path,
) -> agent_worker::config::Config {
    let mut config = agent_worker::config::Config {
        connections,
        agents_dir: agents_dir.to_path_buf(),
        lease_secs: 3,
        ack_wait_secs: 3,
        shutdown_grace_secs: 5,
        people: people(),
        ..Default::default()
    };
    config.validate().unwrap();
    config
}

/// A config file in `dir` for worker processes (`tests/src/bin/worker_process.rs`) on
/// `infra`'s servers in `namespace` (registered), logged in as the namespace's worker user,
/// loading the agents of `agents`, with short leases so a killed one's runs are taken over
/// within seconds, and `more` settings appended.
pub fn worker_process_config_file(
    infra: &Infra,
    namespace: &str,
    dir: &std::path::Path,
    agents: &std::path::Path,
    more: &str,
) -> PathBuf {
    let config = dir.join("worker.toml");
    let login = infra.connections(namespace, Service::Worker);
    std::fs::write(
        &config,
        format!(
            "nats_url = \"{}\"\nnats_user = \"{}\"\nnats_password = \"{}\"\n\
             redis_url = \"{}\"\nnamespace = \"{namespace}\"\nagents_dir = \"{}\"\n\
             lease_secs = 3\nack_wait_secs = 3\nshutdown_grace_secs = 2\n\
             health_listen = \"127.0.0.1:0\"\n{more}",
            infra.nats_url,
            login.nats_user.unwrap(),
            login.nats_password.unwrap().expose(),
            infra.redis_url,
            agents.display()
        ),
    )
    .unwrap();
    config
}

/// A name for a namespace of its own for one app's subjects, streams and keys; register it
/// on the app's servers ([`Infra::register_namespace`], or take one from
/// [`Infra::new_namespace`]) so its services have NATS users.
pub fn new_namespace() -> String {
    format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// How long a test waits for anything before it fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

struct Running {
    token: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
    /// Where its probes (`/livez`, `/readyz`) answer, for a worker.
    probes: Option<String>,
}

pub struct TestApp {
    pub infra: Infra,
    pub namespace: String,
    pub gateway_url: String,
    pub http: reqwest::Client,
    pub tools: DemoTools,
    pub model: FakeModel,
    agents_dir: PathBuf,
    gateway_config: approval_gateway::config::Config,
    gateway: Running,
    /// More gateways on the same servers and namespace.
    gateways: Vec<Running>,
    workers: Vec<Option<Running>>,
}

pub use countersign_local::demo_agent::{refunds_agent, refunds_mcp_agent};

/// The `kid` of a test app's receipt key.
pub const RECEIPT_KID: &str = "test-key-1";

/// How the app's demo refunds service checks receipts: against `gateway_url`, remembering
/// the receipts it ran in a file in `agents_dir`.
fn tools_countersigned(gateway_url: &str, agents_dir: &std::path::Path) -> Countersigned {
    Countersigned {
        jwks_url: format!("{gateway_url}/.well-known/jwks.json"),
        issuer: gateway_url.to_string(),
        jtis_file: agents_dir.join("receipts-run.jsonl"),
    }
}

/// How a test app is made: `TestApp::builder(brain)`, what the test needs changed, then
/// [`TestAppBuilder::start`]. Unless told otherwise the model speaks Anthropic's wire format,
/// one worker runs, the refund tool's approval table is the demo agent's, and the app has
/// servers and a namespace of its own.
pub struct TestAppBuilder<'a> {
    brain: Brain,
    provider: Provider,
    workers: usize,
    policy: String,
    mcp: bool,
    gateway: Vec<GatewayChange<'a>>,
    worker: Vec<WorkerChange<'a>>,
    infra: Option<Infra>,
    namespace: Option<String>,
    /// More agent files: their names and texts.
    agents: Vec<(String, String)>,
}

/// What a test changes in the gateway's configuration.
type GatewayChange<'a> = Box<dyn FnOnce(&mut approval_gateway::config::Config) + 'a>;
/// What a test changes in each worker's configuration.
type WorkerChange<'a> = Box<dyn Fn(&mut agent_worker::config::Config) + 'a>;

impl<'a> TestAppBuilder<'a> {
    /// The wire format the fake model speaks (and the agent's `provider`).
    pub fn provider(mut self, provider: Provider) -> Self {
        self.provider = provider;
        self
    }

    /// How many workers start with the app (more can be started later).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Lines added to the refund tool's approval table.
    pub fn policy(mut self, lines: &str) -> Self {
        self.policy.push_str(lines);
        self
    }

    /// The refund agent takes its tools from the demo service's MCP endpoint
    /// ([`refunds_mcp_agent`]) instead of its HTTP ones.
    pub fn mcp_tools(mut self) -> Self {
        self.mcp = true;
        self
    }

    /// Adjusts the gateway's configuration (also the base of [`TestApp::spawn_gateway`]).
    pub fn gateway(
        mut self,
        configure: impl FnOnce(&mut approval_gateway::config::Config) + 'a,
    ) -> Self {
        self.gateway.push(Box::new(configure));
        self
    }

    /// Adjusts the configuration of the workers that start with the app.
    pub fn worker(mut self, configure: impl Fn(&mut agent_worker::config::Config) + 'a) -> Self {
        self.worker.push(Box::new(configure));
        self
    }

    /// Another agent file beside the refunds agent, `file` in the agents folder.
    pub fn agent(mut self, file: &str, text: String) -> Self {
        self.agents.push((file.to_string(), text));
        self
    }

    /// On servers the caller started.
    pub fn on(mut self, infra: Infra) -> Self {
        self.infra = Some(infra);
        self
    }

    /// In a namespace the caller chose (from [`new_namespace`]); it is registered on the
    /// app's servers if it is not yet.
    pub fn namespace(mut self, namespace: String) -> Self {
        self.namespace = Some(namespace);
        self
    }

    /// Starts the fake model, the tools service, the gateway (waiting until it is ready) and
    /// the workers.
    pub async fn start(self) -> TestApp {
        crate::logs::init();
        let infra = match self.infra {
            Some(infra) => infra,
            None => Infra::start().await,
        };
        let namespace = match self.namespace {
            Some(namespace) => {
                infra.register_namespace(&namespace).await;
                namespace
            }
            None => infra.new_namespace().await,
        };
        let model = FakeModel::start(self.brain).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gateway_url = format!("http://{}", listener.local_addr().unwrap());
        let agents_dir = std::env::temp_dir().join(format!("countersign-{namespace}"));
        std::fs::create_dir_all(&agents_dir).unwrap();
        // The refunds service checks receipts as a tool author would, against this gateway.
        let tools = DemoTools::serve_countersigned(
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            tools_countersigned(&gateway_url, &agents_dir),
        )
        .unwrap();
        std::fs::write(
            agents_dir.join("refunds.toml"),
            if self.mcp {
                refunds_mcp_agent(self.provider.as_str(), &model.base_url, &tools.mcp_url())
            } else {
                refunds_agent(self.provider.as_str(), &model.base_url, &tools.base_url)
            } + &self.policy,
        )
        .unwrap();
        for (file, text) in &self.agents {
            std::fs::write(agents_dir.join(file), text).unwrap();
        }

        let mut config = gateway_config(&infra, &namespace, &agents_dir);
        // Receipts as a deployment signs them: a key file of its own, the gateway's URL as
        // the issuer.
        let (_, pem) = countersign_receipt::Signer::generate(RECEIPT_KID).unwrap();
        let key_file = agents_dir.join("receipt-key.pem");
        std::fs::write(&key_file, pem).unwrap();
        config.receipts.key_file = Some(key_file);
        config.receipts.kid = Some(RECEIPT_KID.into());
        config.receipts.issuer = Some(gateway_url.clone());
        for configure in self.gateway {
            configure(&mut config);
        }
        let token = CancellationToken::new();
        let task = tokio::spawn(approval_gateway::run(
            config.clone(),
            listener,
            token.clone(),
        ));
        let mut app = TestApp {
            infra,
            namespace,
            gateway_url,
            // Like any client of a server that closes idle kept-alive connections (after
            // header_read_timeout_ms, 5 s), the pool drops them sooner, so no request is sent
            // on a connection the gateway is closing at that moment.
            http: reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
            tools,
            model,
            agents_dir,
            gateway_config: config,
            gateway: Running {
                token,
                task,
                probes: None,
            },
            gateways: Vec::new(),
            workers: Vec::new(),
        };
        app.wait_ready().await;
        for _ in 0..self.workers {
            app.start_worker(|config| self.worker.iter().for_each(|configure| configure(config)));
        }
        app
    }
}

impl TestApp {
    /// An app as [`TestApp::builder`] makes it unless told otherwise.
    pub async fn spawn(brain: impl Into<Brain>) -> Self {
        Self::builder(brain).start().await
    }

    /// An app whose fake model answers each request with what `brain` makes of it.
    pub fn builder<'a>(brain: impl Into<Brain>) -> TestAppBuilder<'a> {
        TestAppBuilder {
            brain: brain.into(),
            provider: Provider::Anthropic,
            workers: 1,
            policy: String::new(),
            mcp: false,
            gateway: Vec::new(),
            worker: Vec::new(),
            infra: None,
            namespace: None,
            agents: Vec::new(),
        }
    }

    async fn wait_ready(&self) {
        wait_for("the gateway to be ready", PATIENCE, || async {
            assert!(!self.gateway.task.is_finished(), "the gateway stopped");
            let r = self
                .http
                .get(format!("{}/healthz", self.gateway_url))
                .send()
                .await;
            r.ok().filter(|r| r.status().is_success()).map(|_| ())
        })
        .await;
    }

    /// Starts another gateway like the first but for what `change` changes in its
    /// configuration (a restart with an edited file); returns its base URL once it is ready.
    pub async fn spawn_gateway(
        &mut self,
        change: impl FnOnce(&mut approval_gateway::config::Config),
    ) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let token = CancellationToken::new();
        let mut config = self.gateway_config.clone();
        change(&mut config);
        let task = tokio::spawn(approval_gateway::run(config, listener, token.clone()));
        wait_for("the second gateway to be ready", PATIENCE, || async {
            let r = self.http.get(format!("{url}/healthz")).send().await;
            r.ok().filter(|r| r.status().is_success()).map(|_| ())
        })
        .await;
        self.gateways.push(Running {
            token,
            task,
            probes: None,
        });
        url
    }

    /// Stops the gateway, waits until it has stopped, and starts it again with what `change`
    /// changes in its configuration (a restart with an edited file): no gateway that knew the
    /// old configuration is left, and requests go to the new one.
    pub async fn restart_gateway(
        &mut self,
        change: impl FnOnce(&mut approval_gateway::config::Config),
    ) {
        self.halt_gateway().await;
        self.gateway_url = self.spawn_gateway(change).await;
    }

    /// Stops the first gateway and waits until it has stopped (its consumers too): until
    /// another is spawned ([`TestApp::spawn_gateway`]), no gateway takes the approval events.
    pub async fn halt_gateway(&mut self) {
        self.gateway.token.cancel();
        (&mut self.gateway.task)
            .await
            .expect("the gateway's task")
            .expect("the gateway stopped cleanly");
    }

    /// The folder of the app's agent files (and its receipt key, `receipt-key.pem`).
    pub fn agents_dir(&self) -> &std::path::Path {
        &self.agents_dir
    }

    /// The digest of a refund call as anyone who knows the agent's file and the run id can
    /// work it out in advance.
    pub fn refund_digest(&self, run_id: &str, input: &Value) -> String {
        let text = std::fs::read_to_string(self.agents_dir.join("refunds.toml")).unwrap();
        let agent = countersign_model::agent::Agent::from_toml(&text, &self.agents_dir).unwrap();
        let tool = agent
            .def
            .tools
            .iter()
            .find(|t| t.name == "issue_refund")
            .unwrap();
        countersign_model::digest::call_digest(run_id, &tool.name, input, &tool.policy_version())
    }

    /// The connection settings the app's workers use (logged in as its worker user).
    pub fn connections(&self) -> countersign_runtime::config::Connections {
        self.connections_as(Service::Worker)
    }

    /// The connection settings `service` uses in this app.
    pub fn connections_as(&self, service: Service) -> countersign_runtime::config::Connections {
        self.infra.connections(&self.namespace, service)
    }

    /// Every message stored on `subject` in one of this app's streams (`APPROVALS`, …).
    pub async fn stream_messages(&self, stream: &str, subject: &str) -> Vec<Value> {
        use async_nats::jetstream::consumer::pull;
        use futures::StreamExt;
        let js = self.infra.jetstream().await;
        let stream = js
            .get_stream(format!("{}_{stream}", self.namespace))
            .await
            .unwrap();
        let consumer = stream
            .create_consumer(pull::Config {
                filter_subject: format!("{}.{subject}", self.namespace),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .unwrap();
        let mut out = Vec::new();
        while let Some(Ok(msg)) = batch.next().await {
            out.push(serde_json::from_slice(&msg.payload).unwrap());
        }
        out
    }

    /// Publishes `event` on `subject` (of this app's namespace) into JetStream as the app's
    /// worker user: a forged message as a compromised worker host could send it, for tests
    /// of what the services trust. A subject the shipped permissions refuse the worker fails
    /// the call (no ack comes).
    pub async fn publish_event(&self, subject: &str, event: &Value) {
        let js = async_nats::jetstream::new(
            self.infra
                .nats_client_as(&self.namespace, Service::Worker)
                .await,
        );
        let payload = serde_json::to_vec(event).unwrap();
        js.publish(format!("{}.{subject}", self.namespace), payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// Waits until the gateways have handled every approval event published so far: each
    /// fanned out into deliveries, and each delivery sent. It only reads the consumers'
    /// state, as `admin`.
    pub async fn wait_deliveries_settled(&self) {
        let js = self.infra.jetstream().await;
        let names = Names::new(&self.namespace).unwrap();
        let mut approvals = js.get_stream(names.approvals_stream()).await.unwrap();
        let last = approvals.info().await.unwrap().state.last_sequence;
        wait_for(
            "the gateways to handle every approval event",
            PATIENCE,
            || async {
                let mut fan_out = js
                .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                    names.fan_out_consumer(),
                    names.approvals_stream(),
                )
                .await
                .ok()?;
                let fanned = fan_out.info().await.ok()?;
                let mut sender = js
                .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                    names.deliveries_consumer(),
                    names.deliveries_stream(),
                )
                .await
                .ok()?;
                let sent = sender.info().await.ok()?;
                (fanned.ack_floor.stream_sequence >= last
                    && fanned.num_ack_pending == 0
                    && sent.num_pending == 0
                    && sent.num_ack_pending == 0)
                    .then_some(())
            },
        )
        .await;
    }

    pub fn worker_config(&self) -> agent_worker::config::Config {
        worker_config(self.connections(), &self.agents_dir)
    }

    /// Leaves what a worker leaves when it dies between marking `call_id` of the run
    /// started and recording its result.
    pub async fn mark_started(&self, run_id: &str, call_id: &str) {
        let mut conn = self.infra.redis().await;
        let _: i64 = redis::cmd("HSET")
            .arg(format!("cs:{}:exec:{{{run_id}}}", self.namespace))
            .arg(call_id)
            .arg("started")
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    /// Changes the terms the decision script checks a held refund against, as if the call had
    /// been held again with other input since a reviewer was shown it: the digest they were
    /// shown no longer matches, and a decision quoting it is refused (`stale_digest`).
    pub async fn change_held_call(&self, run_id: &str, call_id: &str) {
        let id = RunId::parse(run_id).unwrap();
        let key = Keys::of(&Names::new(&self.namespace).unwrap()).calls_key(&id);
        let mut conn = self.infra.redis().await;
        let terms: String = redis::cmd("HGET")
            .arg(&key)
            .arg(call_id)
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut terms: Value = serde_json::from_str(&terms).unwrap();
        let other = json!({"order_id": "A-1001", "amount": 999, "reason": "changed"});
        terms["digest"] = self.refund_digest(run_id, &other).into();
        let _: i64 = redis::cmd("HSET")
            .arg(&key)
            .arg(call_id)
            .arg(terms.to_string())
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    /// Checks what a completed refund run whose refund (`toolu_2`) was started before a crash
    /// told: the model, that the outcome is unknown; a person, by the `run.attention` that
    /// `attention` receives, naming the call. That event, for more checks.
    pub async fn assert_refund_reported_unknown(
        &self,
        attention: &mut async_nats::Subscriber,
    ) -> Value {
        let results = countersign_fake_model::last_results(&self.model.requests()[1]);
        let told = results[1]["content"].as_str().unwrap();
        assert!(
            told.contains("outcome of this issue_refund call is unknown"),
            "{told}"
        );
        let event = tokio::time::timeout(PATIENCE, futures::StreamExt::next(attention))
            .await
            .unwrap()
            .unwrap();
        let event: Value = serde_json::from_slice(&event.payload).unwrap();
        assert_eq!(event["call_id"], "toolu_2");
        event
    }

    /// Rewrites the refund agent the next workers load (the gateway keeps what it loaded).
    pub fn rewrite_agent(&self, edit: impl FnOnce(String) -> String) {
        let path = self.agents_dir.join("refunds.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, edit(text)).unwrap();
    }

    /// Starts another worker (without the builder's `worker` adjustments), its probes on a
    /// free port; returns its index.
    pub fn spawn_worker(&mut self) -> usize {
        self.start_worker(|_| {})
    }

    /// Starts a worker with its config adjusted by `configure`; returns its index.
    fn start_worker(&mut self, configure: impl FnOnce(&mut agent_worker::config::Config)) -> usize {
        let mut config = self.worker_config();
        configure(&mut config);
        let token = CancellationToken::new();
        let probes = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probes.set_nonblocking(true).unwrap();
        let probes = tokio::net::TcpListener::from_std(probes).unwrap();
        let url = format!("http://{}", probes.local_addr().unwrap());
        let task = tokio::spawn(agent_worker::run(config, probes, token.clone()));
        self.workers.push(Some(Running {
            token,
            task,
            probes: Some(url),
        }));
        self.workers.len() - 1
    }

    /// The base URL of a running worker's probes.
    pub fn worker_probes_url(&self, index: usize) -> &str {
        let worker = self.workers[index].as_ref().expect("worker stopped");
        worker.probes.as_deref().expect("workers have probes")
    }

    /// Tells the gateway to stop, the way SIGTERM does, without waiting for it.
    pub fn stop_gateway(&self) {
        self.gateway.token.cancel();
    }

    /// Stops a worker the way SIGTERM does and waits until it has.
    pub async fn stop_worker(&mut self, index: usize) {
        let worker = self.workers[index].take().expect("worker already stopped");
        worker.token.cancel();
        worker.task.await.unwrap().unwrap();
    }

    /// Ends a worker as a crash would: its task is dropped where it stands, with no graceful
    /// shutdown (its token also ends the tasks it spawned, which a dead process would not
    /// have either).
    pub async fn kill_worker(&mut self, index: usize) {
        let worker = self.workers[index].take().expect("worker already stopped");
        worker.task.abort();
        worker.token.cancel();
        assert!(worker.task.await.unwrap_err().is_cancelled());
    }

    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.gateway_url));
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let response = req.send().await.expect("gateway reachable");
        let status = response.status();
        let text = response.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::GET, path, Some(ADMIN_KEY), None)
            .await
    }

    pub async fn start_run(&self, input: &str) -> String {
        let (status, body) = self
            .request(
                reqwest::Method::POST,
                "/v1/runs",
                Some(REQUESTER_KEY),
                Some(json!({"agent": "refunds", "input": input})),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body["run_id"].as_str().unwrap().to_string()
    }

    pub async fn decide(&self, run_id: &str, decisions: Value) -> (StatusCode, Value) {
        self.request(
            reqwest::Method::POST,
            &format!("/v1/runs/{run_id}/decisions"),
            Some(REVIEWER_KEY),
            Some(json!({ "decisions": decisions })),
        )
        .await
    }

    /// `person`'s decision on one call, made through the integration key that speaks for the
    /// configured people.
    pub async fn decide_as(
        &self,
        person: &str,
        run_id: &str,
        decision: Value,
    ) -> (StatusCode, Value) {
        self.request(
            reqwest::Method::POST,
            &format!("/v1/runs/{run_id}/decisions"),
            Some(INTEGRATION_KEY),
            Some(json!({"decided_by": person, "decisions": [decision]})),
        )
        .await
    }

    /// Approves one call as the reviewer, quoting the digest it was shown.
    pub async fn approve(
        &self,
        run_id: &str,
        call_id: &str,
        digest: &Value,
    ) -> (StatusCode, Value) {
        self.decide(
            run_id,
            json!([{"call_id": call_id, "digest": digest, "action": "approve"}]),
        )
        .await
    }

    /// Starts a run per input and waits until each has paused; their ids and the digests of
    /// their held refunds.
    pub async fn paused_refunds(&self, inputs: &[String]) -> Vec<(String, Value)> {
        let runs = futures::future::join_all(inputs.iter().map(|i| self.start_run(i))).await;
        let paused = futures::future::join_all(
            runs.iter()
                .map(|id| self.wait_status(id, "awaiting_approval")),
        )
        .await;
        runs.into_iter()
            .zip(paused.iter().map(|r| r["pending"][0]["digest"].clone()))
            .collect()
    }

    /// One refund from start to completion, approved by the reviewer; the run's id.
    pub async fn refund_cycle(&self) -> String {
        let run = self.start_run("Refund A-1001 please.").await;
        let paused = self.wait_status(&run, "awaiting_approval").await;
        let (status, body) = self
            .approve(&run, "toolu_2", &paused["pending"][0]["digest"])
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        self.wait_status(&run, "completed").await;
        run
    }

    /// Approves one call, asking again until the gateway answers 200 (it answers 503 while
    /// a server it needs is away; a repeat of a decision that was recorded is answered 200).
    pub async fn approve_until_accepted(&self, run_id: &str, call_id: &str, digest: &Value) {
        wait_for(
            &format!("the decision on {run_id} to be accepted"),
            PATIENCE,
            || async {
                let (status, _) = self.approve(run_id, call_id, digest).await;
                (status == StatusCode::OK).then_some(())
            },
        )
        .await;
    }

    /// Records rita's approval of one call straight through the decision script, as a gateway
    /// that died right after it would leave it: stored, and never published by anyone but the
    /// outbox sweepers.
    pub async fn approve_without_announcing(&self, run_id: &str, call_id: &str, digest: &Value) {
        self.record_approval(run_id, call_id, digest, true).await;
    }

    /// Writes an approval by rita of `call_id` straight into Redis through the decision
    /// script, announcing nothing: with its receipt signed by the gateway's key (`signed`),
    /// as the gateway records one, or with none, as someone with Redis access could.
    pub async fn record_approval(&self, run_id: &str, call_id: &str, digest: &Value, signed: bool) {
        let names = Names::new(&self.namespace).unwrap();
        let store = Store::connect(&self.connections(), names, Metrics::default())
            .await
            .unwrap();
        let run_id = RunId::parse(run_id).unwrap();
        let receipt = match signed {
            true => Some(self.sign_receipt(&store, &run_id, call_id).await),
            false => None,
        };
        let decision = Decision {
            call_id: call_id.into(),
            digest: digest.as_str().unwrap().into(),
            action: Action::Approve,
            input: None,
            note: None,
            reason: None,
            decided_by: "rita".into(),
            door: "api".into(),
            decided_at: countersign_model::now_ms(),
            fingerprint: Decision::fingerprint_of(Action::Approve, None, None, None),
            expired: false,
            superseded: false,
            receipt,
            grant: None,
            under_grant: None,
            delegation: None,
        };
        let mut entry = AuditEntry::new(&run_id, AuditKind::Decided);
        entry.actor = Some("rita".into());
        entry.call_id = Some(call_id.into());
        let request = DecideRequest {
            principal: "rita",
            door: "api",
            by: countersign_store::DecisionSource::Person,
            link: None,
            role_decides: true,
            receipts: signed,
            grant: None,
            delegation: None,
            proposals: vec![Proposal {
                decision,
                checked_digest: None,
                entry,
                receipt_for: if signed { "rita".into() } else { String::new() },
            }],
        };
        let outcome = store
            .clone()
            .gateway()
            .decide(&run_id, &request)
            .await
            .unwrap();
        assert!(
            matches!(outcome, DecideOutcome::Decided { .. }),
            "{outcome:?}"
        );
    }

    /// A receipt for rita's approval of the held `call_id`, signed with the gateway's key.
    async fn sign_receipt(&self, store: &Store, run_id: &RunId, call_id: &str) -> String {
        let run = store.load(run_id).await.unwrap().unwrap();
        let call = run.held_calls().find(|c| c.call_id == call_id).unwrap();
        let mut claims = self.receipt_claims(run_id.as_str(), &call.input, 3600);
        claims.call_id = call_id.into();
        claims.aud = call.tool.clone();
        claims.tool = call.tool.clone();
        claims.policy_version = call.policy_version.clone();
        self.receipt_signer().sign(&claims)
    }

    /// The demo refunds service as it is after a restart: a new process (on another port)
    /// with the same jti file, and nothing else of the one before.
    pub async fn tools_restarted(&self) -> DemoTools {
        DemoTools::serve_countersigned(
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            tools_countersigned(&self.gateway_url, &self.agents_dir),
        )
        .unwrap()
    }

    /// The key the app's gateway signs receipts with.
    pub fn receipt_signer(&self) -> countersign_receipt::Signer {
        let key_file = self.gateway_config.receipts.key_file.as_ref().unwrap();
        let pem = std::fs::read_to_string(key_file).unwrap();
        countersign_receipt::Signer::from_pem(RECEIPT_KID, &pem).unwrap()
    }

    /// The claims of rita's approval of the demo refund `toolu_2` of `run_id` with `input`,
    /// as this app's gateway signs them, expiring `exp_secs` from now.
    pub fn receipt_claims(
        &self,
        run_id: &str,
        input: &Value,
        exp_secs: i64,
    ) -> countersign_receipt::Claims {
        let iat = countersign_model::now_ms() / 1000;
        countersign_receipt::Claims {
            iss: self.gateway_url.clone(),
            aud: "issue_refund".into(),
            iat,
            exp: iat + exp_secs,
            jti: uuid::Uuid::new_v4().to_string(),
            run_id: run_id.into(),
            turn: 1,
            call_id: "toolu_2".into(),
            tool: "issue_refund".into(),
            input_digest: countersign_receipt::input_digest(input),
            action: "approve".into(),
            decided_by: vec!["rita".into()],
            policy_version: "p".into(),
            grant: None,
            risk: None,
            stages: Vec::new(),
            windows: Vec::new(),
        }
    }

    /// Waits until the workers have taken and acknowledged every `approval.decided` message.
    pub async fn decisions_drained(&self) {
        let js = self.infra.jetstream().await;
        wait_for("the decisions to be acked", PATIENCE, || async {
            let mut consumer: async_nats::jetstream::consumer::PullConsumer = js
                .get_consumer_from_stream(
                    format!("{}_workers-decided", self.namespace),
                    format!("{}_APPROVALS", self.namespace),
                )
                .await
                .ok()?;
            let info = consumer.info().await.ok()?;
            (info.num_ack_pending == 0 && info.num_pending == 0).then_some(())
        })
        .await;
    }

    /// Follows the run's `run.attention` events as they are published.
    pub async fn attention_events(&self, run_id: &str) -> async_nats::Subscriber {
        let nats = self.infra.nats_client().await;
        nats.subscribe(format!("{}.run.attention.{run_id}", self.namespace))
            .await
            .unwrap()
    }

    /// The gateway's `/metrics`.
    pub async fn gateway_metrics(&self) -> String {
        self.text_of(&format!("{}/metrics", self.gateway_url)).await
    }

    /// One series (`name{labels}`) summed over the `/metrics` of the first `workers` workers:
    /// whichever of them did the work.
    pub async fn workers_metric(&self, workers: usize, series: &str) -> f64 {
        let mut sum = 0.0;
        for worker in 0..workers {
            let url = format!("{}/metrics", self.worker_probes_url(worker));
            sum += crate::metric_value(&self.text_of(&url).await, series).unwrap_or(0.0);
        }
        sum
    }

    async fn text_of(&self, url: &str) -> String {
        let response = self.http.get(url).send().await.unwrap();
        response.text().await.unwrap()
    }

    /// The run's audit entries, oldest first, once its chain is verified.
    pub async fn audit_entries(&self, run_id: &str) -> Vec<Value> {
        let (_, trail) = self.get(&format!("/v1/runs/{run_id}/audit")).await;
        assert_eq!(trail["verified"], true, "{trail}");
        trail["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["entry"].clone())
            .collect()
    }

    /// The run's status as the API shows it ("" when it cannot be read).
    pub async fn get_run_status(&self, run_id: &str) -> String {
        let (_, run) = self.get(&format!("/v1/runs/{run_id}")).await;
        run["status"].as_str().unwrap_or_default().to_string()
    }

    /// Waits until the run has `status`, and returns it as the API shows it.
    pub async fn wait_status(&self, run_id: &str, status: &str) -> Value {
        wait_for(
            &format!("run {run_id} to be {status}"),
            PATIENCE,
            || async {
                let (code, run) = self.get(&format!("/v1/runs/{run_id}")).await;
                (code == StatusCode::OK && run["status"] == status).then_some(run)
            },
        )
        .await
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.gateway.token.cancel();
        for gateway in &self.gateways {
            gateway.token.cancel();
        }
        for worker in self.workers.iter().flatten() {
            worker.token.cancel();
        }
        let _ = std::fs::remove_dir_all(&self.agents_dir);
    }
}

/// Starts a gateway (no agents) on `infra` while a server it needs is down, then runs
/// `bring_up` (which starts that server), and waits until the gateway is ready: it must wait
/// for the server, not give up.
pub async fn gateway_waits_for(
    what: &str,
    connections: countersign_runtime::config::Connections,
    bring_up: impl std::future::Future<Output = ()>,
) {
    let agents = std::env::temp_dir().join(format!("cs-wait-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&agents).unwrap();
    let config = approval_gateway::config::Config {
        connections,
        agents_dir: agents.clone(),
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/readyz", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let gateway = tokio::spawn(approval_gateway::run(config, listener, shutdown.clone()));

    bring_up.await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    wait_for(
        &format!("the gateway to be ready once {what} is"),
        PATIENCE,
        || async {
            assert!(
                !gateway.is_finished(),
                "the gateway gave up while {what} was away"
            );
            let r = http.get(&url).send().await.ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
    shutdown.cancel();
    gateway.await.unwrap().unwrap();
    std::fs::remove_dir_all(&agents).unwrap();
}
