//! The connection to Redis in the shape the deployment has, through the redis crate's own
//! support for each: one server (a `ConnectionManager`, which reconnects), a master found
//! through Sentinel (asked again whenever the master stops answering or turns out to be a
//! replica, as after a failover), or a Cluster (which follows `MOVED` and `ASK` and learns
//! the new slot owners after a failover). Every command the store sends goes through
//! [`Connection`], which also makes writes wait for replicas when the deployment asks for it.

use countersign_runtime::config::{Connections, RedisMode};
use countersign_runtime::metrics::Metrics;
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisError, RedisFuture, RedisResult, ServerErrorKind, TlsCertificates, TlsMode, Value,
};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// How long connecting and each reply may take: short, so that a request meets its 503
/// within about a second while Redis is away, and whoever called retries later. A reply to
/// `WAIT` may take its own timeout longer.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Commands that change nothing, so never wait for replicas. Everything else the store
/// sends (its scripts, `SET`, `HSET`, `ZADD`, ...) writes.
const READS: [&[u8]; 12] = [
    b"PING", b"TIME", b"GET", b"HGET", b"HGETALL", b"HMGET", b"HLEN", b"LRANGE", b"ZRANGE",
    b"ZSCORE", b"SCRIPT", b"WAIT",
];

#[derive(Clone)]
pub(crate) struct Connection {
    route: Route,
    metrics: Metrics,
    /// Replicas every write must reach (`WAIT`), and for how long to wait for them.
    wait: Option<(u32, u64)>,
}

#[derive(Clone)]
enum Route {
    Single(ConnectionManager),
    Sentinel(Arc<SentinelMaster>),
    Cluster(ClusterConnection),
}

impl Connection {
    pub(crate) async fn open(connections: &Connections, metrics: Metrics) -> RedisResult<Self> {
        let urls: Vec<&str> = connections
            .redis_url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        countersign_runtime::tls::install_crypto_provider();
        let wait = (connections.redis_wait_replicas > 0).then_some((
            connections.redis_wait_replicas,
            connections.redis_wait_timeout_ms,
        ));
        let response_timeout =
            RESPONSE_TIMEOUT + Duration::from_millis(wait.map_or(0, |(_, ms)| ms));
        let route = match connections.redis_mode {
            RedisMode::Standalone => standalone(connections, &urls, response_timeout).await?,
            RedisMode::Sentinel => sentinel(connections, &urls, response_timeout).await?,
            RedisMode::Cluster => cluster(connections, urls, response_timeout).await?,
        };
        Ok(Self {
            route,
            metrics,
            wait,
        })
    }

    /// Whether the keys live on several servers (Redis Cluster), so one script may take only
    /// the keys of one slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.route, Route::Cluster(_))
    }

    /// After a write, waits until the replicas asked for hold it (and everything this
    /// connection wrote before it); fewer within the timeout is an error, as the write could
    /// still be lost in a failover.
    async fn replicated(&mut self, cmd: &Cmd) -> RedisResult<()> {
        let Some((replicas, timeout_ms)) = self.wait else {
            return Ok(());
        };
        let name = match cmd.args_iter().next() {
            Some(redis::Arg::Simple(name)) => name.to_ascii_uppercase(),
            _ => return Ok(()),
        };
        if READS.contains(&name.as_slice()) {
            return Ok(());
        }
        let acked: i64 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(timeout_ms)
            .query_async(&mut self.route)
            .await?;
        if acked < i64::from(replicas) {
            return Err(RedisError::from((
                ErrorKind::Client,
                "write not replicated",
                format!("{acked} of {replicas} replicas acknowledged it within {timeout_ms} ms"),
            )));
        }
        Ok(())
    }
}

/// Connects to one Redis server through a connection manager that reconnects.
async fn standalone(
    connections: &Connections,
    urls: &[&str],
    response_timeout: Duration,
) -> RedisResult<Route> {
    let [url] = urls else {
        return Err(config_error(
            "standalone Redis takes one URL; set redis_mode for a cluster or Sentinels",
        ));
    };
    let info = url.into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &connections.redis_username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &connections.redis_password {
        settings = settings.set_password(password.expose());
    }
    let info = info.set_redis_settings(settings);
    let client = match certificates(connections)? {
        Some(certs) => redis::Client::build_with_tls(info, certs)?,
        None => redis::Client::open(info)?,
    };
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(response_timeout))
        // One quick retry of a lost connection, not the default six with growing
        // pauses (about 9 s): each later command tries to reconnect again.
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(100))
        .set_max_delay(Duration::from_millis(100));
    Ok(Route::Single(
        client.get_connection_manager_with_config(config).await?,
    ))
}

/// Connects to the master the Sentinels name, with the Sentinels' and the master's own
/// credentials and TLS.
async fn sentinel(
    connections: &Connections,
    urls: &[&str],
    response_timeout: Duration,
) -> RedisResult<Route> {
    let infos = urls
        .iter()
        .map(|u| u.into_connection_info())
        .collect::<RedisResult<Vec<_>>>()?;
    let mut builder = SentinelClientBuilder::new(
        infos.iter().map(|i| i.addr().clone()),
        &connections.redis_master_name,
        SentinelServerType::Master,
    )?;
    // The Sentinels' own user and password are the URLs'.
    let sentinel_auth = infos[0].redis_settings();
    if let Some(user) = sentinel_auth.username() {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = sentinel_auth.password() {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(user) = &connections.redis_username {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = &connections.redis_password {
        builder = builder.set_client_to_redis_password(password.expose());
    }
    if urls.iter().any(|u| u.starts_with("rediss://")) {
        builder = builder
            .set_client_to_sentinel_tls_mode(TlsMode::Secure)
            .set_client_to_redis_tls_mode(TlsMode::Secure);
    }
    if let Some(certs) = certificates(connections)? {
        builder = builder
            .set_client_to_sentinel_certificates(certs.clone())
            .set_client_to_redis_certificates(certs);
    }
    Ok(Route::Sentinel(Arc::new(
        SentinelMaster::connect(builder.build()?, response_timeout).await?,
    )))
}

/// Connects to a Redis cluster through the seed URLs.
async fn cluster(
    connections: &Connections,
    urls: Vec<&str>,
    response_timeout: Duration,
) -> RedisResult<Route> {
    let mut builder = ClusterClientBuilder::new(urls)
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(response_timeout)
        .retries(2)
        .min_retry_wait(50)
        .max_retry_wait(200);
    if let Some(user) = &connections.redis_username {
        builder = builder.username(user);
    }
    if let Some(password) = &connections.redis_password {
        builder = builder.password(password.expose());
    }
    if let Some(certs) = certificates(connections)? {
        builder = builder.certs(certs);
    }
    Ok(Route::Cluster(
        builder.build()?.get_async_connection().await?,
    ))
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let started = Instant::now();
            let value = self.route.req_packed_command(cmd).await;
            if let Some(redis::Arg::Simple(name)) = cmd.args_iter().next() {
                self.metrics
                    .redis_command(&String::from_utf8_lossy(name), started.elapsed());
            }
            let value = value?;
            self.replicated(cmd).await?;
            Ok(value)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // The store's pipelines read (a run with its decisions) or drop delivered outbox
        // entries: losing that in a failover only means publishing them again under the same
        // message ids, so they do not wait for replicas.
        Box::pin(async move {
            let started = Instant::now();
            let values = self
                .route
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.metrics.redis_command("PIPELINE", started.elapsed());
            values
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl ConnectionLike for Route {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Route::Single(conn) => conn.req_packed_command(cmd),
            Route::Cluster(conn) => conn.req_packed_command(cmd),
            Route::Sentinel(master) => Box::pin(async move {
                let (generation, mut conn) = master.current();
                let reply = conn.req_packed_command(cmd).await;
                master.after(generation, reply).await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Route::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Route::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            Route::Sentinel(master) => Box::pin(async move {
                let (generation, mut conn) = master.current();
                let reply = conn.req_packed_commands(pipeline, offset, count).await;
                master.after(generation, reply).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// The master the Sentinels name, and the connection to it. When the master stops answering
/// or answers as a replica, the next command's failure makes one caller ask the Sentinels
/// again; that command fails (its caller retries, as after any outage) and later ones go to
/// the master they name.
struct SentinelMaster {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
    /// The connection and its generation, bumped at each reconnection so that a burst of
    /// failures on one connection reconnects once.
    current: RwLock<(u64, MultiplexedConnection)>,
}

impl SentinelMaster {
    async fn connect(
        mut sentinels: SentinelClient,
        response_timeout: Duration,
    ) -> RedisResult<Self> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(response_timeout));
        let conn = sentinels.get_async_connection_with_config(&config).await?;
        Ok(Self {
            sentinels: tokio::sync::Mutex::new(sentinels),
            config,
            current: RwLock::new((0, conn)),
        })
    }

    fn current(&self) -> (u64, MultiplexedConnection) {
        self.current.read().expect("lock poisoned").clone()
    }

    /// Passes a reply on, first finding the master again if the reply says it is gone.
    async fn after<T>(&self, generation: u64, reply: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &reply
            && master_lost(e)
        {
            let mut sentinels = self.sentinels.lock().await;
            if self.current().0 == generation {
                match sentinels
                    .get_async_connection_with_config(&self.config)
                    .await
                {
                    Ok(conn) => {
                        tracing::warn!(error = %e, "Redis master lost; reconnected to the master the Sentinels name");
                        *self.current.write().expect("lock poisoned") = (generation + 1, conn);
                    }
                    Err(why) => {
                        tracing::warn!(error = %e, %why, "Redis master lost; no master found yet");
                    }
                }
            }
        }
        reply
    }
}

/// A failure that means the connection no longer leads to the master.
fn master_lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

/// The CA and client certificate the configuration names, read from their files.
fn certificates(connections: &Connections) -> RedisResult<Option<TlsCertificates>> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            RedisError::from((
                ErrorKind::InvalidClientConfig,
                "cannot read a Redis TLS file",
                format!("{}: {e}", path.display()),
            ))
        })
    };
    let root_cert = connections.redis_tls_ca.as_deref().map(read).transpose()?;
    let client_tls = match (&connections.redis_tls_cert, &connections.redis_tls_key) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read(cert)?,
            client_key: read(key)?,
        }),
        (None, None) => None,
        _ => return Err(config_error("redis_tls_cert and redis_tls_key go together")),
    };
    Ok(
        (root_cert.is_some() || client_tls.is_some()).then_some(TlsCertificates {
            client_tls,
            root_cert,
        }),
    )
}

fn config_error(why: &'static str) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, why))
}
