//! NATS (with JetStream) and Redis in containers, one pair per test.

use crate::images::{NATS, REDIS};
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

pub struct Infra {
    pub nats_url: String,
    pub redis_url: String,
    pub nats: ContainerAsync<GenericImage>,
    pub redis: ContainerAsync<GenericImage>,
}

impl Infra {
    pub async fn start() -> Self {
        NATS.ensure();
        REDIS.ensure();
        let nats = GenericImage::new(NATS.name, NATS.tag)
            .with_exposed_port(4222.tcp())
            .with_wait_for(WaitFor::message_on_stderr("Server is ready"))
            .with_cmd(["-js", "-sd", "/data"])
            .start();
        let redis = GenericImage::new(REDIS.name, REDIS.tag)
            .with_exposed_port(6379.tcp())
            .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
            .with_cmd(["--protected-mode", "no", "--appendonly", "yes"])
            .start();
        let (nats, redis) = tokio::join!(nats, redis);
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
}
