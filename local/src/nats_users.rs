//! NATS with a user per service, for the NATS server the local runner starts: the shipped
//! `deploy/nats-server.conf` (its users `gateway`, `worker` and `admin` and what each may
//! publish), with fresh random passwords defined ahead of it and, under a namespace, its
//! subjects and stream names prefixed the way the services name them. The permissions are
//! written once, in the shipped file; this only renders it.

use countersign_runtime::config::Connections;
use countersign_runtime::names::Service;
use countersign_runtime::secret::Secret;
use std::path::{Path, PathBuf};

/// The shipped permissions file, as deployments use it.
pub const SHIPPED: &str = include_str!("../../deploy/nats-server.conf");

/// The passwords of one start's NATS users.
pub struct NatsUsers {
    /// The gateway's NATS password.
    pub gateway: Secret,
    /// The worker's NATS password.
    pub worker: Secret,
    /// The `admin` user's NATS password.
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
        self.passwords() + &in_namespace(SHIPPED, namespace)
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

impl NatsUsers {
    /// The name of `service`'s user in a configuration from
    /// [`NatsUsers::config_for_namespaces`]: `<namespace>-gateway`, `<namespace>-worker`
    /// (plain `gateway` and `worker` for the empty namespace).
    pub fn user_in(service: Service, namespace: &str) -> String {
        let user = match service {
            Service::Gateway => "gateway",
            Service::Worker => "worker",
        };
        match namespace {
            "" => user.to_string(),
            namespace => format!("{namespace}-{user}"),
        }
    }

    /// Has `service` log in as its user in `connections.namespace`, in a configuration from
    /// [`NatsUsers::config_for_namespaces`].
    pub fn log_in_as(&self, service: Service, connections: &mut Connections) {
        connections.nats_user = Some(Self::user_in(service, &connections.namespace));
        connections.nats_password = Some(self.password(service).clone());
    }

    /// The password of `service`'s users.
    pub fn password(&self, service: Service) -> &Secret {
        match service {
            Service::Gateway => &self.gateway,
            Service::Worker => &self.worker,
        }
    }

    /// One server's configuration for several deployments sharing it, each in its own
    /// namespace (the tests run so): the shipped permissions rendered for each namespace, and
    /// in the shipped `authorization` block each service's user once per namespace
    /// ([`NatsUsers::user_in`]) with that namespace's permissions; `admin` once.
    pub fn config_for_namespaces(&self, namespaces: &[String]) -> String {
        let (permissions, authorization) = SHIPPED
            .split_once("\nauthorization {")
            .expect("the shipped file ends with its authorization block");
        let variables = ["SERVICE_DENY", "GATEWAY_PERMISSIONS", "WORKER_PERMISSIONS"];
        // nats-server refuses a variable nothing reads: without a namespace only admin's.
        let mut text = match namespaces.is_empty() {
            true => format!("NATS_ADMIN_PASSWORD: \"{}\"\n", self.admin.expose()),
            false => self.passwords(),
        };
        let mut users = String::new();
        for (i, namespace) in namespaces.iter().enumerate() {
            let mut rendered = in_namespace(permissions, namespace);
            for variable in variables {
                rendered = rendered.replace(variable, &format!("{variable}_{i}"));
            }
            text += &rendered;
            text.push('\n');
            for line in authorization.lines() {
                let Some(service) = [Service::Gateway, Service::Worker]
                    .into_iter()
                    .find(|s| line.contains(&format!("{{ user: {}, ", Self::user_in(*s, ""))))
                else {
                    continue;
                };
                let mut line = line.replace(
                    &format!("user: {},", Self::user_in(service, "")),
                    &format!("user: \"{}\",", Self::user_in(service, namespace)),
                );
                for variable in variables {
                    line = line.replace(&format!("${variable}"), &format!("${variable}_{i}"));
                }
                users += &line;
                users.push('\n');
            }
        }
        let admin = authorization
            .lines()
            .filter(|l| l.contains("user: admin,"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!admin.is_empty(), "the shipped file has an admin user");
        text + &format!("authorization {{\n  users = [\n{users}{admin}\n  ]\n}}\n")
    }

    /// The passwords as the variables the shipped file reads.
    fn passwords(&self) -> String {
        let mut text = String::new();
        for (name, password) in [
            ("NATS_GATEWAY_PASSWORD", &self.gateway),
            ("NATS_WORKER_PASSWORD", &self.worker),
            ("NATS_ADMIN_PASSWORD", &self.admin),
        ] {
            text += &format!("{name}: \"{}\"\n", password.expose());
        }
        text
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
    fn several_namespaces_each_get_their_users_with_their_own_permissions() {
        let users = NatsUsers::random();
        let conf = users.config_for_namespaces(&["t1".into(), "t2".into()]);
        for wanted in [
            "\"t1.approval.decided.*\"",
            "\"t2.approval.decided.*\"",
            "\"$JS.ACK.t2_RUNS.>\"",
            "GATEWAY_PERMISSIONS_1 = {",
            "{ user: \"t1-gateway\", password: $NATS_GATEWAY_PASSWORD, permissions: $GATEWAY_PERMISSIONS_0 }",
            "{ user: \"t2-worker\", password: $NATS_WORKER_PASSWORD, permissions: $WORKER_PERMISSIONS_1 }",
            "deny = $SERVICE_DENY_1",
            "{ user: admin, password: $NATS_ADMIN_PASSWORD }",
        ] {
            assert!(conf.contains(wanted), "{wanted} missing from\n{conf}");
        }
        assert_eq!(conf.matches("user: admin").count(), 1);
        assert_eq!(conf.matches("authorization {").count(), 1);
        let none = users.config_for_namespaces(&[]);
        assert!(none.contains("user: admin"), "{none}");
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
