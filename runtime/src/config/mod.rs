//! A process's settings: where NATS and Redis are ([`Connections`], at the top level of each
//! service's file beside its own keys), and how every settings type is read, once for all:
//! defaults, then the TOML file, then environment variables named beside the fields they set
//! (the `layers` module), with the keys learnt from the types themselves (the `keys` module).

mod keys;
mod layers;

pub use countersign_runtime_derive::Settings;
pub use keys::{check_env_table, check_example, fields, keys};
pub use layers::{Env, EnvVar, Settings, config_path_from_args, load, parse, process_env};

use crate::secret::Secret;
use serde::Deserialize;
use std::path::PathBuf;

/// Connection settings every service needs.
#[derive(Clone, Debug, Deserialize, Settings)]
#[serde(default)]
pub struct Connections {
    /// NATS server URLs, comma-separated (the seeds of a cluster; the client learns the rest).
    /// Default `nats://127.0.0.1:4222`.
    #[env("NATS_URL")]
    pub nats_url: String,
    /// NATS user and password. Default none.
    #[env("NATS_USER")]
    pub nats_user: Option<String>,
    /// The NATS password. Never logged.
    #[env("NATS_PASSWORD")]
    pub nats_password: Option<Secret>,
    /// NATS token. Default none.
    #[env("NATS_TOKEN")]
    pub nats_token: Option<Secret>,
    /// An NKey seed (`SU…`). Default none.
    #[env("NATS_NKEY")]
    pub nats_nkey: Option<Secret>,
    /// A `.creds` file (JWT and NKey seed). Default none.
    #[env("NATS_CREDS")]
    pub nats_creds_file: Option<PathBuf>,
    /// TLS to NATS: a CA file to trust, and a client certificate and key. Setting any of
    /// them requires TLS. Default none.
    pub nats_tls_ca: Option<PathBuf>,
    /// A client certificate to present to NATS.
    pub nats_tls_cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub nats_tls_key: Option<PathBuf>,
    /// Replicas of every stream (1, or up to the cluster's size, usually 3); applied when a
    /// stream is created and reconciled at start when an existing one differs. Default 1.
    #[env("STREAM_REPLICAS")]
    pub stream_replicas: usize,
    /// How Redis is deployed: `standalone`, `sentinel` or `cluster`. Default standalone.
    #[env("REDIS_MODE")]
    pub redis_mode: RedisMode,
    /// Redis URLs, comma-separated (`rediss://` for TLS): the server (standalone), the
    /// Sentinels (sentinel) or seed nodes (cluster). Default `redis://127.0.0.1:6379`.
    #[env("REDIS_URL")]
    pub redis_url: String,
    /// The master's name the Sentinels monitor. Default `mymaster`.
    #[env("REDIS_MASTER_NAME")]
    pub redis_master_name: String,
    /// The ACL user and password of the data nodes (a URL's own user and password are
    /// used when these are unset; in sentinel mode the URLs' are the Sentinels'). Default none.
    #[env("REDIS_USERNAME")]
    pub redis_username: Option<String>,
    /// The Redis password. Never logged.
    #[env("REDIS_PASSWORD")]
    pub redis_password: Option<Secret>,
    /// TLS to Redis (with `rediss://` URLs): a CA file to trust instead of the system's,
    /// and a client certificate and key. Default none.
    pub redis_tls_ca: Option<PathBuf>,
    /// A client certificate to present to Redis.
    pub redis_tls_cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub redis_tls_key: Option<PathBuf>,
    /// Replicas that must hold every write before it counts as done (Redis `WAIT`), so a
    /// failover cannot lose an acknowledged decision or execution mark. Default 0 (a write
    /// counts when the master has it).
    #[env("REDIS_WAIT_REPLICAS")]
    pub redis_wait_replicas: u32,
    /// How long a write waits for those replicas before it fails. Default 1000.
    pub redis_wait_timeout_ms: u64,
    /// Prefix for subjects, streams and keys, so deployments can share servers. Default empty
    /// (the documented names as they are).
    #[env("COUNTERSIGN_NAMESPACE")]
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
    /// The checks of the connection settings the types cannot make.
    fn validate(&self) -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Debug, Deserialize, Settings)]
    #[serde(deny_unknown_fields)]
    struct Empty {}

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn connection_settings_sit_beside_a_services_keys_and_misspellings_are_named() {
        let (_, connections): (Empty, _) = parse(
            "nats_url = \"nats://n:1\"\nredis_url = \"redis://r\"\nnamespace = \"x\"",
            &no_env,
        )
        .unwrap();
        assert_eq!(
            (
                connections.nats_url.as_str(),
                connections.redis_url.as_str(),
                connections.namespace.as_str()
            ),
            ("nats://n:1", "redis://r", "x")
        );
        let err = parse::<Empty>("redis_ulr = \"redis://r\"", &no_env).unwrap_err();
        assert!(err.to_string().contains("redis_ulr"), "{err}");
    }

    #[test]
    fn variables_set_and_not_empty_override_the_file_read_as_their_fields_types() {
        let vars: HashMap<&str, &str> = [
            ("NATS_URL", "nats://env:1"),
            ("REDIS_URL", ""),
            ("REDIS_MODE", "sentinel"),
            ("STREAM_REPLICAS", "3"),
            ("REDIS_PASSWORD", "hunter2"),
            ("NATS_CREDS", "/etc/n.creds"),
        ]
        .into();
        let env = |name: &str| vars.get(name).map(std::string::ToString::to_string);
        let (_, connections): (Empty, _) = parse(
            "nats_url = \"nats://file:1\"\nredis_url = \"redis://file\"\nstream_replicas = 1",
            &env,
        )
        .unwrap();
        assert_eq!(connections.nats_url, "nats://env:1");
        assert_eq!(
            connections.redis_url, "redis://file",
            "an empty variable is unset"
        );
        assert_eq!(connections.redis_mode, RedisMode::Sentinel);
        assert_eq!(connections.stream_replicas, 3);
        assert_eq!(connections.redis_password.unwrap().expose(), "hunter2");
        assert_eq!(
            connections.nats_creds_file.as_deref(),
            Some(std::path::Path::new("/etc/n.creds"))
        );
    }

    #[test]
    fn a_bad_variable_is_named_and_checks_apply_to_both_layers() {
        let from = |name: &'static str, value: &'static str| {
            move |asked: &str| (asked == name).then(|| value.to_string())
        };
        for (name, value) in [
            ("REDIS_MODE", "clustered"),
            ("STREAM_REPLICAS", "three"),
            ("REDIS_WAIT_REPLICAS", "-1"),
        ] {
            let err = Connections::from_env(&from(name, value))
                .unwrap_err()
                .to_string();
            assert!(err.contains(name) && err.contains(value), "{err}");
        }
        let err = Connections::from_env(&from("STREAM_REPLICAS", "7")).unwrap_err();
        assert!(err.to_string().contains("stream_replicas"), "{err}");
        let err = parse::<Empty>("stream_replicas = \"3\"", &no_env).unwrap_err();
        assert!(err.to_string().contains("stream_replicas"), "{err}");
    }

    #[test]
    fn the_keys_are_the_types_own() {
        assert_eq!(fields::<Connections>().len(), 21);
        assert!(fields::<Connections>().contains(&"redis_wait_timeout_ms"));
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Outer {
            inner: Option<Vec<Inner>>,
            secret: Secret,
        }
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Inner {
            a: u32,
            b: RedisMode,
        }
        assert_eq!(
            keys::<Outer>().into_iter().collect::<Vec<_>>(),
            ["inner", "inner.a", "inner.b", "secret"]
        );
    }
}
