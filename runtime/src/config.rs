//! Where NATS and Redis are, and the config-file plumbing both services share.

use crate::secret::Secret;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// Connection settings every service needs.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Connections {
    /// NATS server URLs, comma-separated (the seeds of a cluster; the client learns the rest).
    /// Env: `NATS_URL`. Default `nats://127.0.0.1:4222`.
    pub nats_url: String,
    /// NATS user and password. Env: `NATS_USER`, `NATS_PASSWORD`. Default none.
    pub nats_user: Option<String>,
    pub nats_password: Option<Secret>,
    /// NATS token. Env: `NATS_TOKEN`. Default none.
    pub nats_token: Option<Secret>,
    /// An NKey seed (`SU…`). Env: `NATS_NKEY`. Default none.
    pub nats_nkey: Option<Secret>,
    /// A `.creds` file (JWT and NKey seed). Env: `NATS_CREDS`. Default none.
    pub nats_creds_file: Option<PathBuf>,
    /// TLS to NATS: a CA file to trust, and a client certificate and key. Setting any of
    /// them requires TLS. Default none.
    pub nats_tls_ca: Option<PathBuf>,
    pub nats_tls_cert: Option<PathBuf>,
    pub nats_tls_key: Option<PathBuf>,
    /// Replicas of every stream (1, or up to the cluster's size, usually 3); applied when a
    /// stream is created and reconciled at start when an existing one differs.
    /// Env: `STREAM_REPLICAS`. Default 1.
    pub stream_replicas: usize,
    /// How Redis is deployed: `standalone`, `sentinel` or `cluster`. Env: `REDIS_MODE`.
    /// Default standalone.
    pub redis_mode: RedisMode,
    /// Redis URLs, comma-separated (`rediss://` for TLS): the server (standalone), the
    /// Sentinels (sentinel) or seed nodes (cluster). Env: `REDIS_URL`.
    /// Default `redis://127.0.0.1:6379`.
    pub redis_url: String,
    /// The master's name the Sentinels monitor. Env: `REDIS_MASTER_NAME`. Default `mymaster`.
    pub redis_master_name: String,
    /// The ACL user and password of the data nodes (a URL's own user and password are
    /// used when these are unset; in sentinel mode the URLs' are the Sentinels').
    /// Env: `REDIS_USERNAME`, `REDIS_PASSWORD`. Default none.
    pub redis_username: Option<String>,
    pub redis_password: Option<Secret>,
    /// TLS to Redis (with `rediss://` URLs): a CA file to trust instead of the system's,
    /// and a client certificate and key. Default none.
    pub redis_tls_ca: Option<PathBuf>,
    pub redis_tls_cert: Option<PathBuf>,
    pub redis_tls_key: Option<PathBuf>,
    /// Replicas that must hold every write before it counts as done (Redis `WAIT`), so a
    /// failover cannot lose an acknowledged decision or execution mark. Env:
    /// `REDIS_WAIT_REPLICAS`. Default 0 (a write counts when the master has it).
    pub redis_wait_replicas: u32,
    /// How long a write waits for those replicas before it fails. Default 1000.
    pub redis_wait_timeout_ms: u64,
    /// Prefix for subjects, streams and keys, so deployments can share servers.
    /// Env: `COUNTERSIGN_NAMESPACE`. Default empty (the documented names as they are).
    pub namespace: String,
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            nats_url: "nats://127.0.0.1:4222".into(),
            nats_user: None,
            nats_password: None,
            nats_token: None,
            nats_nkey: None,
            nats_creds_file: None,
            nats_tls_ca: None,
            nats_tls_cert: None,
            nats_tls_key: None,
            stream_replicas: 1,
            redis_mode: RedisMode::Standalone,
            redis_url: "redis://127.0.0.1:6379".into(),
            redis_master_name: "mymaster".into(),
            redis_username: None,
            redis_password: None,
            redis_tls_ca: None,
            redis_tls_cert: None,
            redis_tls_key: None,
            redis_wait_replicas: 0,
            redis_wait_timeout_ms: 1000,
            namespace: String::new(),
        }
    }
}

impl Connections {
    /// Its keys, which a service's config file has at the top level.
    pub const KEYS: [&str; 21] = [
        "nats_url",
        "nats_user",
        "nats_password",
        "nats_token",
        "nats_nkey",
        "nats_creds_file",
        "nats_tls_ca",
        "nats_tls_cert",
        "nats_tls_key",
        "stream_replicas",
        "redis_mode",
        "redis_url",
        "redis_master_name",
        "redis_username",
        "redis_password",
        "redis_tls_ca",
        "redis_tls_cert",
        "redis_tls_key",
        "redis_wait_replicas",
        "redis_wait_timeout_ms",
        "namespace",
    ];

    /// Applies the environment variables named above over the file's values.
    pub fn apply_env(&mut self) -> anyhow::Result<()> {
        override_from_env(&mut self.nats_url, "NATS_URL");
        override_from_env(&mut self.redis_url, "REDIS_URL");
        override_from_env(&mut self.redis_master_name, "REDIS_MASTER_NAME");
        override_from_env(&mut self.namespace, "COUNTERSIGN_NAMESPACE");
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if let Some(v) = var("NATS_USER") {
            self.nats_user = Some(v);
        }
        if let Some(v) = var("REDIS_USERNAME") {
            self.redis_username = Some(v);
        }
        if let Some(v) = var("REDIS_MODE") {
            self.redis_mode = RedisMode::parse(&v)?;
        }
        if let Some(v) = var("REDIS_WAIT_REPLICAS") {
            self.redis_wait_replicas = v
                .parse()
                .map_err(|_| anyhow::anyhow!("REDIS_WAIT_REPLICAS {v:?} is not a number"))?;
        }
        for (field, name) in [
            (&mut self.redis_password, "REDIS_PASSWORD"),
            (&mut self.nats_password, "NATS_PASSWORD"),
            (&mut self.nats_token, "NATS_TOKEN"),
            (&mut self.nats_nkey, "NATS_NKEY"),
        ] {
            if let Some(v) = var(name) {
                *field = Some(v.into());
            }
        }
        if let Some(v) = var("NATS_CREDS") {
            self.nats_creds_file = Some(v.into());
        }
        if let Some(v) = var("STREAM_REPLICAS") {
            self.stream_replicas = v
                .parse()
                .map_err(|_| anyhow::anyhow!("STREAM_REPLICAS {v:?} is not a number"))?;
        }
        anyhow::ensure!(
            (1..=5).contains(&self.stream_replicas),
            "stream_replicas must be 1 to 5"
        );
        Ok(())
    }
}

/// How Redis is deployed.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One server (perhaps with replicas nobody fails over to).
    #[default]
    Standalone,
    /// A master and replicas watched by Sentinels, which name the master after a failover.
    Sentinel,
    /// Redis Cluster: keys spread over masters by hash slot.
    Cluster,
}

impl RedisMode {
    fn parse(text: &str) -> anyhow::Result<Self> {
        match text {
            "standalone" => Ok(Self::Standalone),
            "sentinel" => Ok(Self::Sentinel),
            "cluster" => Ok(Self::Cluster),
            _ => anyhow::bail!("REDIS_MODE {text:?} is not standalone, sentinel or cluster"),
        }
    }
}

/// Replaces `field` with the variable's value when it is set and not empty.
pub fn override_from_env(field: &mut String, var: &str) {
    if let Ok(v) = std::env::var(var)
        && !v.is_empty()
    {
        *field = v;
    }
}

/// Reads a service's TOML config file over its defaults (no file: the defaults): the
/// connection settings ([`Connections`], at the top level beside the service's own keys) and
/// the rest.
pub fn load_toml<T: DeserializeOwned + Default>(
    path: Option<&Path>,
) -> anyhow::Result<(T, Connections)> {
    match path {
        None => Ok((T::default(), Connections::default())),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
            parse_toml(&text).map_err(|e| anyhow::anyhow!("invalid config {}: {e}", path.display()))
        }
    }
}

/// Parses a service's config, refusing keys it does not know (a misspelled key would
/// otherwise be silently ignored and its default used), naming each.
pub fn parse_toml<T: DeserializeOwned>(text: &str) -> anyhow::Result<(T, Connections)> {
    let mut table: toml::Table = text.parse()?;
    let mut connections = toml::Table::new();
    for key in Connections::KEYS {
        if let Some(value) = table.remove(key) {
            connections.insert(key.to_string(), value);
        }
    }
    let connections: Connections = connections.try_into()?;
    let mut unknown = Vec::new();
    let value = serde_ignored::deserialize(toml::Value::Table(table), |path| {
        unknown.push(path.to_string())
    })?;
    if !unknown.is_empty() {
        anyhow::bail!("unknown key {}", unknown.join(", "));
    }
    Ok((value, connections))
}

/// The config file named by `--config PATH` on the command line or `COUNTERSIGN_CONFIG`.
pub fn config_path_from_args() -> Option<std::path::PathBuf> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--config" {
            return args.next().map(Into::into);
        }
    }
    std::env::var_os("COUNTERSIGN_CONFIG").map(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Empty {}

    #[test]
    fn connection_settings_sit_beside_a_services_keys_and_misspellings_are_named() {
        let (_, connections): (Empty, _) =
            parse_toml("nats_url = \"nats://n:1\"\nredis_url = \"redis://r\"\nnamespace = \"x\"")
                .unwrap();
        assert_eq!(
            (
                connections.nats_url.as_str(),
                connections.redis_url.as_str(),
                connections.namespace.as_str()
            ),
            ("nats://n:1", "redis://r", "x")
        );
        let err = parse_toml::<Empty>("redis_ulr = \"redis://r\"").unwrap_err();
        assert!(err.to_string().contains("redis_ulr"), "{err}");
    }
}
