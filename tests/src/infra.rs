//! NATS (with JetStream) and Redis in containers, one pair per test.

use crate::images::{NATS, REDIS};
use std::time::Duration;
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

pub struct Infra {
    pub nats_url: String,
    pub redis_url: String,
    pub nats: ContainerAsync<GenericImage>,
    pub redis: ContainerAsync<GenericImage>,
}

/// A free port on the loopback, for a container that must keep its address across restarts.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Infra {
    /// Servers on ports Docker picks.
    pub async fn start() -> Self {
        Self::start_on(None).await
    }

    /// Servers on fixed host ports, so a restarted one is found where it was.
    pub async fn start_restartable() -> Self {
        Self::start_on(Some((free_port(), free_port()))).await
    }

    async fn start_on(ports: Option<(u16, u16)>) -> Self {
        NATS.ensure();
        REDIS.ensure();
        let nats = GenericImage::new(NATS.name, NATS.tag)
            .with_exposed_port(4222.tcp())
            .with_wait_for(WaitFor::message_on_stderr("Server is ready"))
            .with_cmd(["-js", "-sd", "/data"]);
        let redis = GenericImage::new(REDIS.name, REDIS.tag)
            .with_exposed_port(6379.tcp())
            .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
            .with_cmd(["--protected-mode", "no", "--appendonly", "yes"]);
        let (nats, redis) = match ports {
            None => tokio::join!(nats.start(), redis.start()),
            Some((n, r)) => tokio::join!(
                nats.with_mapped_port(n, 4222.tcp()).start(),
                redis.with_mapped_port(r, 6379.tcp()).start()
            ),
        };
        let (nats, redis) = (nats.expect("start nats"), redis.expect("start redis"));
        let nats_port = nats.get_host_port_ipv4(4222).await.unwrap();
        let redis_port = redis.get_host_port_ipv4(6379).await.unwrap();
        Self {
            nats_url: format!("nats://127.0.0.1:{nats_port}"),
            redis_url: format!("redis://127.0.0.1:{redis_port}"),
            nats,
            redis,
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
