//! Where NATS and Redis are, and the config-file plumbing both services share.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::path::Path;

/// Connection settings every service needs.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct InfraConfig {
    /// NATS server URL. Env: `NATS_URL`. Default `nats://127.0.0.1:4222`.
    pub nats_url: String,
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
            redis_url: "redis://127.0.0.1:6379".into(),
            namespace: String::new(),
        }
    }
}

impl InfraConfig {
    /// Its keys, which a service's config file has at the top level.
    pub const KEYS: [&str; 3] = ["nats_url", "redis_url", "namespace"];

    /// Applies `NATS_URL`, `REDIS_URL` and `COUNTERSIGN_NAMESPACE` over the file's values.
    pub fn apply_env(&mut self) {
        override_from_env(&mut self.nats_url, "NATS_URL");
        override_from_env(&mut self.redis_url, "REDIS_URL");
        override_from_env(&mut self.namespace, "COUNTERSIGN_NAMESPACE");
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
