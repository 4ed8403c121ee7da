//! NATS with a user per service, for the NATS server the local runner starts: the shipped
//! `deploy/nats-server.conf` (its users `gateway`, `worker` and `admin` and what each may
//! publish), with fresh random passwords defined ahead of it and, under a namespace, its
//! subjects and stream names prefixed the way the services name them. The permissions are
//! written once, in the shipped file; this only renders it.

use countersign_runtime::config::Connections;
use countersign_runtime::secret::Secret;
use std::path::{Path, PathBuf};

/// The shipped permissions file, as deployments use it.
pub const SHIPPED: &str = include_str!("../../deploy/nats-server.conf");

/// The passwords of one start's NATS users.
pub struct NatsUsers {
    pub gateway: Secret,
    pub worker: Secret,
    pub admin: Secret,
}

impl NatsUsers {
    /// Fresh random passwords (122 random bits each).
    pub fn random() -> Self {
        let password = || Secret::from(uuid::Uuid::new_v4().simple().to_string());
        Self {
            gateway: password(),
            worker: password(),
            admin: password(),
        }
    }

    /// Has a gateway log in as user `gateway`.
    pub fn log_in_gateway(&self, connections: &mut Connections) {
        connections.nats_user = Some("gateway".into());
        connections.nats_password = Some(self.gateway.clone());
    }

    /// Has a worker log in as user `worker`.
    pub fn log_in_worker(&self, connections: &mut Connections) {
        connections.nats_user = Some("worker".into());
        connections.nats_password = Some(self.worker.clone());
    }

    /// The server's configuration for services in `namespace`: the passwords as the
    /// variables the shipped file reads, then the shipped file.
    pub fn config(&self, namespace: &str) -> String {
        let mut text = String::new();
        for (name, password) in [
            ("NATS_GATEWAY_PASSWORD", &self.gateway),
            ("NATS_WORKER_PASSWORD", &self.worker),
            ("NATS_ADMIN_PASSWORD", &self.admin),
        ] {
            text += &format!("{name}: \"{}\"\n", password.expose());
        }
        text + &in_namespace(SHIPPED, namespace)
    }

    /// Writes [`NatsUsers::config`] to `dir` (readable by its owner only); its path.
    pub fn write_config(&self, dir: &Path, namespace: &str) -> std::io::Result<PathBuf> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join("nats-server.conf");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        file.write_all(self.config(namespace).as_bytes())?;
        Ok(path)
    }
}

/// The permissions' subjects as the services in `namespace` use them: `runs.start` becomes
/// `ns.runs.start`, `$JS.ACK.RUNS.>` becomes `$JS.ACK.ns_RUNS.>`; JetStream's API and
/// `_INBOX` stay as they are. Only the entries of permission lists (lines holding one quoted
/// string) are touched.
fn in_namespace(conf: &str, namespace: &str) -> String {
    if namespace.is_empty() {
        return conf.to_string();
    }
    let mut out = String::with_capacity(conf.len());
    for line in conf.lines() {
        let trimmed = line.trim();
        let entry = trimmed
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .filter(|t| !t.contains('"'));
        let rendered = match entry {
            Some(subject) if subject.starts_with("$JS.ACK.") => {
                let stream = &subject["$JS.ACK.".len()..];
                line.replace(subject, &format!("$JS.ACK.{namespace}_{stream}"))
            }
            Some(subject) if subject.starts_with('$') || subject.starts_with("_INBOX") => {
                line.to_string()
            }
            Some(subject) => line.replace(subject, &format!("{namespace}.{subject}")),
            None => line.to_string(),
        };
        out += &rendered;
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_prefixes_subjects_and_stream_names_and_nothing_else() {
        let conf = in_namespace(SHIPPED, "prod");
        for wanted in [
            "\"prod.runs.start\"",
            "\"prod.approval.decided.*\"",
            "\"prod.run.>\"",
            "\"$JS.ACK.prod_RUNS.>\"",
            "\"$JS.API.>\"",
            "\"$JS.API.STREAM.DELETE.>\"",
            "allow = [\"_INBOX.>\"]",
        ] {
            assert!(conf.contains(wanted), "{wanted} missing from\n{conf}");
        }
        assert!(!conf.contains("\"runs.start\""));
        assert_eq!(in_namespace(SHIPPED, ""), SHIPPED);
    }

    #[test]
    fn each_start_has_its_own_passwords_defined_before_the_shipped_file() {
        let (a, b) = (NatsUsers::random(), NatsUsers::random());
        assert_ne!(a.gateway.expose(), b.gateway.expose());
        let conf = a.config("");
        let defined = conf.find("NATS_WORKER_PASSWORD:").unwrap();
        assert!(defined < conf.find("$NATS_WORKER_PASSWORD").unwrap());
        assert!(conf.contains(a.worker.expose()));
    }
}
