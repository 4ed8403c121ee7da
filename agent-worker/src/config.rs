//! Worker configuration: defaults, then a TOML file (`--config` or `COUNTERSIGN_CONFIG`),
//! then the environment variables named beside the fields (`#[env]`), then `validate()`.

use countersign_runtime::config::{Connections, Settings, config_path_from_args, process_env};
use countersign_runtime::secret::Secret;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// The worker's whole configuration, as loaded and validated.
#[derive(Clone, Debug, Deserialize, Settings)]
#[serde(default)]
pub struct Config {
    /// Where NATS and Redis are (`nats_url`, `redis_url`, `namespace` at the top level).
    #[serde(skip)]
    pub connections: Connections,
    /// Folder of agent definitions. Default `agents`.
    #[env("COUNTERSIGN_AGENTS_DIR")]
    pub agents_dir: PathBuf,
    /// Milliseconds between looks at the agents' folder for a changed file, which is then
    /// loaded without a restart. Default 2000.
    #[env("COUNTERSIGN_AGENTS_RELOAD_MS")]
    pub agents_reload_ms: u64,
    /// This worker's name in leases and logs. Default: host name and a random suffix, so a
    /// restarted worker never mistakes an old lease for its own.
    #[env("WORKER_ID")]
    pub worker_id: String,
    /// Runs driven at once by this worker. Default 16.
    pub concurrency: usize,
    /// Seconds a claimed run stays ours without a renewal; renewed every third of it.
    /// Default 30.
    pub lease_secs: u64,
    /// Seconds JetStream waits for an ack before redelivering; progress acks extend it.
    /// Default 30.
    pub ack_wait_secs: u64,
    /// Deliveries of one job before a run that keeps hitting retryable errors fails.
    /// Default 5.
    pub max_attempts: u64,
    /// Seconds finished runs are kept in Redis, their audit trail included (the `AUDIT` stream
    /// keeps it longer). Default 604800 (7 days).
    pub retention_secs: u64,
    /// Seconds a held call waits for a person when its tool's policy sets no `timeout`.
    /// Default 86400 (a day).
    pub default_approval_timeout_secs: u64,
    /// Milliseconds between sweeps for passed deadlines. Default 250.
    pub sweep_interval_ms: u64,
    /// Seconds in-flight runs get to finish on shutdown before they are handed back.
    /// Default 20.
    pub shutdown_grace_secs: u64,
    /// The people who review, as the gateway has them (the same `[[people]]` table, so both
    /// services can read one file): a held call's `role:NAME` approvers are resolved to the
    /// people holding the role when it is held. Default none.
    pub people: Vec<countersign_model::people::Person>,
    /// Address of the small HTTP server answering `/livez`, `/readyz` and `/metrics`.
    /// Default `127.0.0.1:9090`; port 0 picks a free one.
    #[env("WORKER_HEALTH_LISTEN")]
    pub health_listen: String,
    /// A separate address for `GET /metrics`, which `health_listen` then does not serve.
    /// Default none: `/metrics` is on `health_listen`.
    #[env("WORKER_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// A bearer token `GET /metrics` requires (at least 16 characters). Default none:
    /// whoever reaches the address may read it.
    #[env("WORKER_METRICS_TOKEN", keep_empty)]
    pub metrics_token: Option<Secret>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            connections: Connections::default(),
            agents_dir: "agents".into(),
            agents_reload_ms: 2000,
            worker_id: String::new(),
            concurrency: 16,
            lease_secs: 30,
            ack_wait_secs: 30,
            max_attempts: 5,
            retention_secs: 7 * 24 * 3600,
            shutdown_grace_secs: 20,
            default_approval_timeout_secs: 24 * 3600,
            sweep_interval_ms: 250,
            people: Vec::new(),
            health_listen: "127.0.0.1:9090".into(),
            metrics_listen: None,
            metrics_token: None,
        }
    }
}

impl Config {
    /// The configuration of this process: defaults, the TOML file (`--config` or
    /// `COUNTERSIGN_CONFIG`), the environment, then checked by `validate`.
    pub fn load() -> anyhow::Result<Self> {
        let (mut config, connections): (Config, _) =
            countersign_runtime::config::load(config_path_from_args().as_deref(), &process_env)?;
        config.connections = connections;
        config.validate()?;
        Ok(config)
    }

    /// Refuses a configuration the worker cannot run with, saying what is wrong; names the
    /// worker (`HOSTNAME` and a random suffix) when `worker_id` is empty.
    pub fn validate(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.concurrency > 0, "concurrency must be at least 1");
        anyhow::ensure!(self.lease_secs >= 3, "lease_secs must be at least 3");
        anyhow::ensure!(self.ack_wait_secs >= 3, "ack_wait_secs must be at least 3");
        anyhow::ensure!(self.max_attempts >= 1, "max_attempts must be at least 1");
        countersign_runtime::metrics_http::check_token(self.metrics_token.as_ref())?;
        if self.worker_id.is_empty() {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into());
            self.worker_id = format!("{host}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        }
        Ok(())
    }

    /// How long a claimed run stays this worker's without a renewal (`lease_secs`).
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_runtime::config::{check_env_table, check_example, parse};

    #[test]
    fn the_reference_configuration_loads_and_a_misspelled_key_is_named() {
        let (mut config, connections): (Config, _) =
            parse(include_str!("../config.example.toml"), &|_| None).unwrap();
        config.connections = connections;
        config.validate().unwrap();
        assert_eq!(config.people[0].roles, ["finance"]);
        let err = parse::<Config>("concurency = 4", &|_| None).unwrap_err();
        assert!(err.to_string().contains("concurency"), "{err}");
    }

    #[test]
    fn the_reference_configuration_documents_every_key_and_the_page_every_variable() {
        check_example::<Config>(include_str!("../config.example.toml"))
            .unwrap_or_else(|faults| panic!("config.example.toml:\n{faults}"));
        check_env_table::<Config>(include_str!("../../docs/configuration.md"), "worker")
            .unwrap_or_else(|faults| panic!("docs/configuration.md:\n{faults}"));
    }

    #[test]
    fn variables_override_the_file() {
        let env = |name: &str| match name {
            "WORKER_ID" => Some("w-env".to_string()),
            "WORKER_HEALTH_LISTEN" => Some(String::new()),
            "REDIS_MODE" => Some("cluster".to_string()),
            _ => None,
        };
        let (config, connections): (Config, _) = parse(
            "worker_id = \"w-file\"\nhealth_listen = \"0.0.0.0:1\"\n",
            &env,
        )
        .unwrap();
        assert_eq!(config.worker_id, "w-env");
        assert_eq!(
            config.health_listen, "0.0.0.0:1",
            "an empty variable is unset"
        );
        assert_eq!(
            connections.redis_mode,
            countersign_runtime::config::RedisMode::Cluster
        );
    }
}
