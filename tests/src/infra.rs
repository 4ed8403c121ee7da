//! NATS (with JetStream) and Redis in containers, one set per test: one Redis server here,
//! or a Sentinel or Cluster deployment (see `redis_deployments`).
//!
//! NATS runs with the shipped users and permissions (`deploy/nats-server.conf`), rendered for
//! every namespace the test registers ([`Infra::new_namespace`]; the server reloads its
//! configuration on each). Services log in as their users ([`Infra::connections`]); the
//! test's own clients as `admin` ([`Infra::nats_client`]). A permissions violation any
//! service logs fails the test when its `Infra` is dropped.

use crate::images::{NATS, REDIS};
use countersign_local::nats_users::NatsUsers;
use countersign_runtime::config::{Connections, RedisMode};
use countersign_runtime::names::Service;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use testcontainers::core::{IntoContainerPort, Mount, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ContainerRequest, GenericImage, ImageExt};

pub struct Infra {
    pub nats_url: String,
    /// What the services are given as `redis_url`: the server, the Sentinels or the seeds.
    pub redis_url: String,
    pub redis_mode: RedisMode,
    pub redis_master_name: String,
    pub redis_wait_replicas: u32,
    /// The ACL user the services log in as, when the server requires one.
    pub redis_user: Option<(String, String)>,
    /// The certificates of a Redis that requires TLS: its CA and the services' client
    /// certificate.
    pub redis_tls: Option<crate::pki::TestPki>,
    pub nats: ContainerAsync<GenericImage>,
    /// The one server, or a Sentinel deployment's first master, or a Cluster's first node.
    pub redis: ContainerAsync<GenericImage>,
    /// The rest of a Sentinel or Cluster deployment.
    pub redis_others: Vec<ContainerAsync<GenericImage>>,
    /// NATS's users and the namespaces its configuration has.
    pub nats_auth: NatsAuth,
}

/// The NATS users of a test's server and the namespaces its configuration is rendered for,
/// in a folder of the host mounted into the container (`/conf/nats.conf`).
pub struct NatsAuth {
    pub users: NatsUsers,
    dir: PathBuf,
    namespaces: Mutex<Vec<String>>,
    /// The violations logged before this server started, or before the test last took them
    /// ([`crate::logs`]).
    violations_mark: std::sync::atomic::AtomicUsize,
}

impl NatsAuth {
    /// Fresh passwords, and a configuration with no namespace yet (only `admin`).
    pub fn new() -> Self {
        crate::logs::init();
        let dir = std::env::temp_dir().join(format!("cs-nats-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let auth = Self {
            users: NatsUsers::random(),
            dir,
            namespaces: Mutex::new(Vec::new()),
            violations_mark: crate::logs::violations_logged().into(),
        };
        auth.write(&[]);
        auth
    }

    /// Writes the configuration. JetStream is set in the file, not on the command line:
    /// nats-server 2.9 shuts JetStream down when it reloads a file without it, whatever its
    /// command line said.
    fn write(&self, namespaces: &[String]) {
        let conf = "jetstream { store_dir: \"/data\" }\n".to_string()
            + &self.users.config_for_namespaces(namespaces);
        std::fs::write(self.dir.join("nats.conf"), conf).unwrap();
    }

    /// Adds `namespace` to the configuration file; false if it was there already.
    fn add(&self, namespace: &str) -> bool {
        let mut namespaces = self.namespaces.lock().unwrap();
        if namespaces.iter().any(|n| n == namespace) {
            return false;
        }
        namespaces.push(namespace.to_string());
        self.write(&namespaces);
        true
    }

    /// Takes `namespace` out of the configuration file; false if it was not there.
    fn remove(&self, namespace: &str) -> bool {
        let mut namespaces = self.namespaces.lock().unwrap();
        let before = namespaces.len();
        namespaces.retain(|n| n != namespace);
        self.write(&namespaces);
        namespaces.len() < before
    }

    fn has(&self, namespace: &str) -> bool {
        self.namespaces
            .lock()
            .unwrap()
            .iter()
            .any(|n| n == namespace)
    }

    /// The folder mounted at `/conf`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The permissions violations services logged since this server started or the last
    /// call, which are then not held against the test: for a test that provokes one.
    pub fn take_violations(&self) -> Vec<String> {
        let now = crate::logs::violations_logged();
        let mark = self
            .violations_mark
            .swap(now, std::sync::atomic::Ordering::SeqCst);
        crate::logs::violations_since(mark)[..now - mark].to_vec()
    }

    /// Fails the test if a service logged a permissions violation since this server started.
    fn check(&self) {
        let mark = self
            .violations_mark
            .load(std::sync::atomic::Ordering::SeqCst);
        let violations = crate::logs::violations_since(mark);
        assert!(
            violations.is_empty(),
            "NATS refused what a service did with the shipped permissions:\n{}",
            violations.join("\n")
        );
    }
}

impl Default for NatsAuth {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NatsAuth {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        if !std::thread::panicking() {
            self.check();
        }
    }
}

/// Whether Docker could not start a container because its host port was taken meanwhile.
fn taken(error: &str) -> bool {
    error.contains("port is already allocated") || error.contains("address already in use")
}

/// A free port on the loopback, for a container that must keep its address across restarts
/// or a listener a service binds itself.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Infra {
    /// Servers on ports Docker picks.
    pub async fn start() -> Self {
        Self::start_on(None).await.expect("start NATS and Redis")
    }

    /// Servers on fixed host ports, so a restarted one is found where it was. A port found
    /// free can be taken before Docker binds it, by another test's container ("already
    /// allocated") or by a process's listener ("already in use"): then other ports are tried.
    pub async fn start_restartable() -> Self {
        let mut attempts = 0;
        loop {
            match Self::start_on(Some((free_port(), free_port()))).await {
                Ok(infra) => return infra,
                Err(e) if attempts < 5 && taken(&e) => attempts += 1,
                Err(e) => panic!("start NATS and Redis: {e}"),
            }
        }
    }

    async fn start_on(ports: Option<(u16, u16)>) -> Result<Self, String> {
        let nats_auth = NatsAuth::new();
        let nats = nats_image(&nats_auth);
        let redis = redis_image(&[]);
        let (nats, redis) = match ports {
            None => tokio::join!(nats.start(), redis.start()),
            Some((n, r)) => tokio::join!(
                nats.with_mapped_port(n, 4222.tcp()).start(),
                redis.with_mapped_port(r, 6379.tcp()).start()
            ),
        };
        let (nats, redis) = (
            nats.map_err(|e| format!("nats: {e}"))?,
            redis.map_err(|e| format!("redis: {e}"))?,
        );
        let nats_port = nats.get_host_port_ipv4(4222).await.unwrap();
        let redis_port = redis.get_host_port_ipv4(6379).await.unwrap();
        Ok(Self {
            nats_url: format!("nats://127.0.0.1:{nats_port}"),
            redis_url: format!("redis://127.0.0.1:{redis_port}"),
            redis_mode: RedisMode::Standalone,
            redis_master_name: String::new(),
            redis_wait_replicas: 0,
            redis_user: None,
            redis_tls: None,
            nats,
            redis,
            redis_others: Vec::new(),
            nats_auth,
        })
    }

    /// A namespace of its own for one app's subjects, streams and keys, with NATS users for
    /// its services.
    pub async fn new_namespace(&self) -> String {
        let namespace = crate::app::new_namespace();
        self.register_namespace(&namespace).await;
        namespace
    }

    /// Gives `namespace` (a name from [`crate::app::new_namespace`] or any other) NATS users
    /// for its services, if it has none yet: the server's configuration is rendered again and
    /// reloaded, and this returns once the namespace's users can log in (or at once, with the
    /// server stopped: it reads the configuration when it starts).
    pub async fn register_namespace(&self, namespace: &str) {
        if !self.nats_auth.add(namespace) {
            return;
        }
        let reloaded = std::process::Command::new("docker")
            .args(["kill", "--signal", "HUP", self.nats.id()])
            .output()
            .expect("run docker");
        if !reloaded.status.success() {
            return; // not running: the configuration is read when it starts
        }
        let (user, password) = self.nats_login(namespace, Service::Worker);
        crate::wait_for(
            &format!("NATS to let namespace {namespace}'s users in"),
            Duration::from_secs(60),
            || async {
                async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
                    .connection_timeout(Duration::from_secs(2))
                    .connect(&self.nats_url)
                    .await
                    .ok()
                    .map(|_| ())
            },
        )
        .await;
    }

    /// Takes `namespace`'s users out of NATS's configuration (a test that goes through many
    /// namespaces, once one is done with), without waiting for the server to reload.
    pub fn forget_namespace(&self, namespace: &str) {
        if self.nats_auth.remove(namespace) {
            let _ = std::process::Command::new("docker")
                .args(["kill", "--signal", "HUP", self.nats.id()])
                .output();
        }
    }

    /// The user and password `service` logs in with in `namespace`.
    pub fn nats_login(&self, namespace: &str, service: Service) -> (String, String) {
        (
            NatsUsers::user_in(service, namespace),
            self.nats_auth.users.password(service).expose().to_string(),
        )
    }

    /// A client logged in as `admin`, who may do anything: the test's own look at the streams
    /// and what it publishes in no service's name.
    pub async fn nats_client(&self) -> async_nats::Client {
        async_nats::ConnectOptions::with_user_and_password(
            "admin".into(),
            self.nats_auth.users.admin.expose().into(),
        )
        .connect(&self.nats_url)
        .await
        .expect("connect to NATS as admin")
    }

    /// JetStream through [`Infra::nats_client`].
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(self.nats_client().await)
    }

    /// A client logged in as `service`'s user in `namespace`: what that service, or someone
    /// holding its credentials, may do.
    pub async fn nats_client_as(&self, namespace: &str, service: Service) -> async_nats::Client {
        let (user, password) = self.nats_login(namespace, service);
        async_nats::ConnectOptions::with_user_and_password(user, password)
            .connect(&self.nats_url)
            .await
            .expect("connect to NATS as a service's user")
    }

    /// The connection settings for `service` on these servers, in `namespace` (registered
    /// with [`Infra::new_namespace`] or [`Infra::register_namespace`]), logged in as its
    /// NATS user.
    pub fn connections(&self, namespace: &str, service: Service) -> Connections {
        assert!(
            self.nats_auth.has(namespace),
            "namespace {namespace:?} has no NATS users: make it with infra.new_namespace()"
        );
        let mut connections = self.connections_without_login(namespace);
        self.nats_auth.users.log_in_as(service, &mut connections);
        connections
    }

    /// The connection settings in `namespace` with no NATS user: for a server started
    /// otherwise, which the test names with `nats_url`.
    pub fn connections_without_login(&self, namespace: &str) -> Connections {
        Connections {
            nats_url: self.nats_url.clone(),
            redis_mode: self.redis_mode,
            redis_url: self.redis_url.clone(),
            redis_master_name: self.redis_master_name.clone(),
            redis_wait_replicas: self.redis_wait_replicas,
            redis_username: self.redis_user.as_ref().map(|(user, _)| user.clone()),
            redis_password: self.redis_user.as_ref().map(|(_, pw)| pw.as_str().into()),
            redis_tls_ca: self.redis_tls.as_ref().map(|pki| pki.path("ca.pem")),
            redis_tls_cert: self.redis_tls.as_ref().map(|pki| pki.path("client.pem")),
            redis_tls_key: self.redis_tls.as_ref().map(|pki| pki.path("client.key")),
            namespace: namespace.to_string(),
            ..Default::default()
        }
    }

    /// A connection to the test's Redis, to look at or tamper with what the services stored.
    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.redis_url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Stops Redis as an operator would (SIGTERM, so the append-only file is flushed) and
    /// starts it again; returns once it answers PING.
    pub async fn restart_redis(&self) {
        self.stop_redis().await;
        self.start_redis().await;
    }

    /// Stops Redis (SIGTERM) and leaves it stopped until [`Infra::start_redis`].
    pub async fn stop_redis(&self) {
        self.redis.stop().await.unwrap();
    }

    /// Starts a stopped Redis again; returns once it answers PING.
    pub async fn start_redis(&self) {
        self.redis.start().await.unwrap();
        let client = redis::Client::open(self.redis_url.as_str()).unwrap();
        crate::wait_for("Redis to answer again", Duration::from_secs(60), || async {
            let mut conn = client.get_multiplexed_async_connection().await.ok()?;
            let pong: Option<String> = redis::cmd("PING").query_async(&mut conn).await.ok();
            pong.map(|_| ())
        })
        .await;
    }

    /// Stops NATS and leaves it stopped until [`Infra::start_nats`].
    pub async fn stop_nats(&self) {
        self.nats.stop().await.unwrap();
    }

    /// Starts a stopped NATS again; returns once it accepts connections.
    pub async fn start_nats(&self) {
        self.nats.start().await.unwrap();
        let admin = self.nats_auth.users.admin.expose().to_string();
        crate::wait_for("NATS to answer again", Duration::from_secs(60), || async {
            async_nats::ConnectOptions::with_user_and_password("admin".into(), admin.clone())
                .connect(&self.nats_url)
                .await
                .ok()
                .map(|_| ())
        })
        .await;
    }

    /// Stops and starts NATS; returns once it accepts connections again.
    pub async fn restart_nats(&self) {
        self.stop_nats().await;
        self.start_nats().await;
    }
}

/// NATS with JetStream on file storage, with the configuration `auth` writes.
pub(crate) fn nats_image(auth: &NatsAuth) -> ContainerRequest<GenericImage> {
    NATS.ensure();
    GenericImage::new(NATS.name, NATS.tag)
        .with_exposed_port(4222.tcp())
        .with_wait_for(WaitFor::message_on_stderr("Server is ready"))
        .with_mount(Mount::bind_mount(auth.dir().display().to_string(), "/conf"))
        .with_cmd(["-c", "/conf/nats.conf"])
}

/// A Redis server with an append-only file, and `args` added to its command line.
pub(crate) fn redis_image(args: &[&str]) -> ContainerRequest<GenericImage> {
    REDIS.ensure();
    let mut cmd = vec!["--protected-mode", "no", "--appendonly", "yes"];
    cmd.extend_from_slice(args);
    GenericImage::new(REDIS.name, REDIS.tag)
        .with_exposed_port(6379.tcp())
        .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
        .with_cmd(cmd)
}
