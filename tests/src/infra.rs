//! NATS (with JetStream) and Redis in containers, one set per test: one Redis server here,
//! or a Sentinel or Cluster deployment (see `redis_deployments`).

use crate::images::{NATS, REDIS};
use countersign_runtime::config::{Connections, RedisMode};
use std::time::Duration;
use testcontainers::core::{IntoContainerPort, WaitFor};
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
    /// free can be taken (by another test's container) before Docker binds it: then other
    /// ports are tried.
    pub async fn start_restartable() -> Self {
        let mut attempts = 0;
        loop {
            match Self::start_on(Some((free_port(), free_port()))).await {
                Ok(infra) => return infra,
                Err(e) if attempts < 5 && e.contains("port is already allocated") => attempts += 1,
                Err(e) => panic!("start NATS and Redis: {e}"),
            }
        }
    }

    /// Servers with NATS started from the configuration file `conf` (users, permissions).
    pub async fn start_with_nats_config(conf: &str) -> Self {
        let nats = nats_image()
            .with_copy_to("/data/nats.conf", conf.as_bytes().to_vec())
            .with_cmd(["-c", "/data/nats.conf", "-js", "-sd", "/data"]);
        Self::start_with(nats, None)
            .await
            .expect("start NATS and Redis")
    }

    async fn start_on(ports: Option<(u16, u16)>) -> Result<Self, String> {
        Self::start_with(nats_image(), ports).await
    }

    async fn start_with(
        nats: ContainerRequest<GenericImage>,
        ports: Option<(u16, u16)>,
    ) -> Result<Self, String> {
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
        })
    }

    /// The connection settings for services on these servers, in `namespace`.
    pub fn config(&self, namespace: &str) -> Connections {
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
        crate::wait_for("NATS to answer again", Duration::from_secs(60), || async {
            async_nats::connect(&self.nats_url).await.ok().map(|_| ())
        })
        .await;
    }

    /// Stops and starts NATS; returns once it accepts connections again.
    pub async fn restart_nats(&self) {
        self.stop_nats().await;
        self.start_nats().await;
    }
}

/// NATS with JetStream on file storage.
pub(crate) fn nats_image() -> ContainerRequest<GenericImage> {
    NATS.ensure();
    GenericImage::new(NATS.name, NATS.tag)
        .with_exposed_port(4222.tcp())
        .with_wait_for(WaitFor::message_on_stderr("Server is ready"))
        .with_cmd(["-js", "-sd", "/data"])
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
