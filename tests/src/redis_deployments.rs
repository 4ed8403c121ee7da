//! Redis deployed as operators deploy it beyond one server, each server in its own container:
//! a master with two replicas watched by three Sentinels, or a Cluster of three masters with
//! a replica each. The servers know each other, and tell clients, by their addresses on
//! Docker's bridge network, which the tests reach directly (as the services on other hosts
//! would reach them on theirs); so no port is mapped.

use crate::images::REDIS;
use crate::infra::{Infra, NatsAuth, nats_image, redis_image};
use crate::wait_for;
use countersign_runtime::config::RedisMode;
use std::time::Duration;
use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

/// The name the Sentinels know the master by.
pub const MASTER_NAME: &str = "countersign";
/// A master sends its data to a new replica at once, instead of waiting 5 s for more
/// replicas to share the transfer.
const SYNC_AT_ONCE: &[&str] = &["--repl-diskless-sync-delay", "0"];
/// How long to wait for a deployment to form.
const FORMING: Duration = Duration::from_secs(60);

impl Infra {
    /// NATS, and Redis as a master, two replicas and three Sentinels (quorum 2, a master is
    /// down after 1 s). Writes wait for one replica (`redis_wait_replicas = 1`), so a
    /// failover loses no acknowledged write, and with two replicas the promoted master still
    /// has one to wait for.
    pub async fn start_sentinel() -> Self {
        let nats_auth = NatsAuth::new();
        let nats = nats_image(&nats_auth).start().await.expect("start nats");
        let master = redis_image(SYNC_AT_ONCE)
            .start()
            .await
            .expect("start redis");
        let master_ip = bridge_ip(&master).await;
        let replica = || redis_image(&["--replicaof", &master_ip, "6379"]).start();
        let (a, b) = tokio::join!(replica(), replica());
        let replicas = [a.expect("start a replica"), b.expect("start a replica")];
        for replica in &replicas {
            synced(&bridge_ip(replica).await).await;
        }
        let config = format!(
            "port 26379\nprotected-mode no\n\
             sentinel monitor {MASTER_NAME} {master_ip} 6379 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 10000\n"
        );
        let sentinel = || {
            REDIS.ensure();
            GenericImage::new(REDIS.name, REDIS.tag)
                .with_wait_for(WaitFor::message_on_stdout("+monitor master"))
                .with_cmd(["/data/sentinel.conf", "--sentinel"])
                .with_copy_to("/data/sentinel.conf", config.clone().into_bytes())
                .start()
        };
        let (a, b, c) = tokio::join!(sentinel(), sentinel(), sentinel());
        let sentinels = [
            a.expect("start a sentinel"),
            b.expect("start a sentinel"),
            c.expect("start a sentinel"),
        ];
        let mut urls = Vec::new();
        for sentinel in &sentinels {
            let ip = bridge_ip(sentinel).await;
            // Each Sentinel learns of the others and of the replicas through the master.
            wait_for("the Sentinels to know each other", FORMING, || async {
                let quorum: String = query(
                    &ip,
                    26379,
                    redis::cmd("SENTINEL").arg("CKQUORUM").arg(MASTER_NAME),
                )
                .await?;
                let replicas: Vec<redis::Value> = query(
                    &ip,
                    26379,
                    redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME),
                )
                .await?;
                (quorum.starts_with("OK 3 usable") && replicas.len() == 2).then_some(())
            })
            .await;
            urls.push(format!("redis://{ip}:26379"));
        }
        let mut others: Vec<_> = replicas.into_iter().collect();
        others.extend(sentinels);
        Self::on_deployment(
            nats_auth,
            nats,
            RedisMode::Sentinel,
            urls.join(","),
            1,
            master,
            others,
        )
        .await
    }

    /// NATS, and a Redis Cluster of six nodes: three masters holding the slots, each with a
    /// replica promoted 2 s after its master stops answering. Made as operators make one,
    /// with `redis-cli --cluster create`.
    pub async fn start_cluster() -> Self {
        let nats_auth = NatsAuth::new();
        let nats = nats_image(&nats_auth).start().await.expect("start nats");
        let node =
            || redis_image(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]).start();
        let started = futures::future::join_all((0..6).map(|_| node())).await;
        let mut nodes: Vec<_> = started
            .into_iter()
            .map(|n| n.expect("start a cluster node"))
            .collect();
        let mut addresses = Vec::new();
        for node in &nodes {
            addresses.push(format!("{}:6379", bridge_ip(node).await));
        }
        crate::output_of(
            std::process::Command::new("redis-cli")
                .args(["--cluster", "create"])
                .args(&addresses)
                .args(["--cluster-replicas", "1", "--cluster-yes"]),
        );
        for address in &addresses {
            let (ip, _) = address.split_once(':').unwrap();
            wait_for("every node to see the cluster ok", FORMING, || async {
                let state: String = query(ip, 6379, redis::cmd("CLUSTER").arg("INFO")).await?;
                state.contains("cluster_state:ok").then_some(())
            })
            .await;
            let role = info(ip, 6379, "replication").await.unwrap_or_default();
            if role.contains("role:slave") {
                synced(ip).await;
            }
        }
        let seeds: Vec<String> = addresses.iter().map(|a| format!("redis://{a}")).collect();
        let first = nodes.remove(0);
        Self::on_deployment(
            nats_auth,
            nats,
            RedisMode::Cluster,
            seeds.join(","),
            0,
            first,
            nodes,
        )
        .await
    }

    /// NATS, and one Redis server whose default user is off: only `user` with `password`
    /// (an ACL user with every permission) may log in.
    pub async fn start_with_acl_user(user: &str, password: &str) -> Self {
        let rule = format!(">{password}");
        let redis = redis_image(&[
            "--user", "default", "off", "--user", user, "on", &rule, "~*", "&*", "+@all",
        ])
        .start();
        let nats_auth = NatsAuth::new();
        let (nats, redis) = tokio::join!(nats_image(&nats_auth).start(), redis);
        let redis = redis.expect("start redis");
        let port = redis.get_host_port_ipv4(6379).await.unwrap();
        let mut infra = Self::on_deployment(
            nats_auth,
            nats.expect("start nats"),
            RedisMode::Standalone,
            format!("redis://127.0.0.1:{port}"),
            0,
            redis,
            Vec::new(),
        )
        .await;
        infra.redis_user = Some((user.to_string(), password.to_string()));
        infra
    }

    /// NATS, and one Redis server that speaks only TLS and requires a client certificate
    /// signed by its CA.
    pub async fn start_with_redis_tls() -> Self {
        let pki = crate::pki::TestPki::generate();
        let mut redis = redis_image(&[
            "--port",
            "0",
            "--tls-port",
            "6379",
            "--tls-cert-file",
            "/data/server.pem",
            "--tls-key-file",
            "/data/server.key",
            "--tls-ca-cert-file",
            "/data/ca.pem",
            "--tls-auth-clients",
            "yes",
        ]);
        for file in ["server.pem", "server.key", "ca.pem"] {
            redis = redis.with_copy_to(format!("/data/{file}"), pki.read(file));
        }
        let nats_auth = NatsAuth::new();
        let (nats, redis) = tokio::join!(nats_image(&nats_auth).start(), redis.start());
        let redis = redis.expect("start redis");
        let port = redis.get_host_port_ipv4(6379).await.unwrap();
        let mut infra = Self::on_deployment(
            nats_auth,
            nats.expect("start nats"),
            RedisMode::Standalone,
            format!("rediss://127.0.0.1:{port}"),
            0,
            redis,
            Vec::new(),
        )
        .await;
        infra.redis_tls = Some(pki);
        infra
    }

    async fn on_deployment(
        nats_auth: NatsAuth,
        nats: ContainerAsync<GenericImage>,
        mode: RedisMode,
        redis_url: String,
        wait_replicas: u32,
        redis: ContainerAsync<GenericImage>,
        others: Vec<ContainerAsync<GenericImage>>,
    ) -> Self {
        let nats_port = nats.get_host_port_ipv4(4222).await.unwrap();
        Self {
            nats_url: format!("nats://127.0.0.1:{nats_port}"),
            redis_url,
            redis_mode: mode,
            redis_master_name: MASTER_NAME.to_string(),
            redis_wait_replicas: wait_replicas,
            redis_user: None,
            redis_tls: None,
            nats,
            redis,
            redis_others: others,
            nats_auth,
        }
    }

    /// Every Redis container of the deployment with its bridge address.
    pub async fn redis_nodes(&self) -> Vec<(String, &ContainerAsync<GenericImage>)> {
        let mut nodes = Vec::new();
        for node in std::iter::once(&self.redis).chain(&self.redis_others) {
            nodes.push((bridge_ip(node).await, node));
        }
        nodes
    }
}

/// Waits until the replica at `ip` has its master's data and follows it: a replica that
/// never synced is not promoted.
async fn synced(ip: &str) {
    wait_for("a replica to sync", FORMING, || async {
        let info = info(ip, 6379, "replication").await?;
        (info.contains("master_link_status:up") && info.contains("master_sync_in_progress:0"))
            .then_some(())
    })
    .await;
}

/// Kills a container at once (SIGKILL), as a host that dies.
pub async fn kill(container: &ContainerAsync<GenericImage>) {
    crate::output_of(std::process::Command::new("docker").args(["kill", container.id()]));
}

/// The container's address on Docker's network.
pub async fn bridge_ip(container: &ContainerAsync<GenericImage>) -> String {
    let ip = crate::output_of(std::process::Command::new("docker").args([
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        container.id(),
    ]));
    let ip = ip.trim().to_string();
    assert!(
        !ip.is_empty(),
        "no address for container {}",
        container.id()
    );
    ip
}

/// One command to one server; `None` while it does not answer.
pub async fn query<T: redis::FromRedisValue>(ip: &str, port: u16, cmd: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://{ip}:{port}")).ok()?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_secs(1)));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .ok()?;
    cmd.query_async(&mut conn).await.ok()
}

/// A section of a server's `INFO`.
pub async fn info(ip: &str, port: u16, section: &str) -> Option<String> {
    query(ip, port, redis::cmd("INFO").arg(section)).await
}
