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

/// Reads a TOML config file over the type's defaults; no file means the defaults.
pub fn load_toml<T: DeserializeOwned + Default>(path: Option<&Path>) -> anyhow::Result<T> {
    match path {
        None => Ok(T::default()),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
            toml::from_str(&text)
                .map_err(|e| anyhow::anyhow!("invalid config {}: {e}", path.display()))
        }
    }
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
