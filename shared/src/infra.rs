//! Where NATS and Redis are, and the config-file plumbing both services share.

use crate::secret::Secret;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// Connection settings every service needs.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct InfraConfig {
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
    /// Redis URL. Env: `REDIS_URL`. Default `redis://127.0.0.1:6379`.
    pub redis_url: String,
    /// Prefix for subjects, streams and keys, so deployments can share servers.
    /// Env: `COUNTERSIGN_NAMESPACE`. Default empty (the documented names as they are).
    pub namespace: String,
}

impl Default for InfraConfig {
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
            redis_url: "redis://127.0.0.1:6379".into(),
            namespace: String::new(),
        }
    }
}

impl InfraConfig {
    /// Its keys, which a service's config file has at the top level.
    pub const KEYS: [&str; 12] = [
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
        "redis_url",
        "namespace",
    ];

    /// Applies the environment variables named above over the file's values.
    pub fn apply_env(&mut self) -> anyhow::Result<()> {
        override_from_env(&mut self.nats_url, "NATS_URL");
        override_from_env(&mut self.redis_url, "REDIS_URL");
        override_from_env(&mut self.namespace, "COUNTERSIGN_NAMESPACE");
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if let Some(v) = var("NATS_USER") {
            self.nats_user = Some(v);
        }
        for (field, name) in [
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

/// Replaces `field` with the variable's value when it is set and not empty.
pub fn override_from_env(field: &mut String, var: &str) {
    if let Ok(v) = std::env::var(var)
        && !v.is_empty()
    {
        *field = v;
    }
}

/// Reads a service's TOML config file over its defaults (no file: the defaults): the
/// connection settings ([`InfraConfig`], at the top level beside the service's own keys) and
/// the rest.
pub fn load_toml<T: DeserializeOwned + Default>(
    path: Option<&Path>,
) -> anyhow::Result<(T, InfraConfig)> {
    match path {
        None => Ok((T::default(), InfraConfig::default())),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
            parse_toml(&text).map_err(|e| anyhow::anyhow!("invalid config {}: {e}", path.display()))
        }
    }
}

/// Parses a service's config, refusing keys it does not know (a misspelled key would
/// otherwise be silently ignored and its default used), naming each.
pub fn parse_toml<T: DeserializeOwned>(text: &str) -> anyhow::Result<(T, InfraConfig)> {
    let mut table: toml::Table = text.parse()?;
    let mut infra = toml::Table::new();
    for key in InfraConfig::KEYS {
        if let Some(value) = table.remove(key) {
            infra.insert(key.to_string(), value);
        }
    }
    let infra: InfraConfig = infra.try_into()?;
    let mut unknown = Vec::new();
    let value = serde_ignored::deserialize(toml::Value::Table(table), |path| {
        unknown.push(path.to_string())
    })?;
    if !unknown.is_empty() {
        anyhow::bail!("unknown key {}", unknown.join(", "));
    }
    Ok((value, infra))
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
        let (_, infra): (Empty, _) =
            parse_toml("nats_url = \"nats://n:1\"\nredis_url = \"redis://r\"\nnamespace = \"x\"")
                .unwrap();
        assert_eq!(
            (
                infra.nats_url.as_str(),
                infra.redis_url.as_str(),
                infra.namespace.as_str()
            ),
            ("nats://n:1", "redis://r", "x")
        );
        let err = parse_toml::<Empty>("redis_ulr = \"redis://r\"").unwrap_err();
        assert!(err.to_string().contains("redis_ulr"), "{err}");
    }
}
