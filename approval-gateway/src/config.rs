//! Gateway configuration: defaults, then a TOML file (`--config` or `COUNTERSIGN_CONFIG`),
//! then the environment variables named beside the fields (`#[env]`), then `validate()`.

use countersign_model::agent::Catalog;
use countersign_model::approval::Channel;
pub use countersign_model::authority::Role;
pub use countersign_model::people::Person;
use countersign_runtime::config::{Connections, Settings, config_path_from_args, process_env};
use countersign_runtime::redact::redacted_url;
use countersign_runtime::secret::Secret;
use countersign_runtime::signing::WebhookSecret;
use serde::Deserialize;
use std::fmt;
use std::path::PathBuf;

/// The gateway's whole configuration, as loaded and validated.
#[derive(Clone, Debug, Deserialize, Settings)]
#[serde(default)]
pub struct Config {
    /// Where NATS and Redis are (`nats_url`, `redis_url`, `namespace` at the top level).
    #[serde(skip)]
    pub connections: Connections,
    /// Address to listen on. Default `127.0.0.1:8080`.
    #[env("COUNTERSIGN_LISTEN")]
    pub listen: String,
    /// A separate address for `GET /metrics`, which `listen` then does not serve. Default
    /// none: `/metrics` is on `listen`.
    #[env("COUNTERSIGN_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// A bearer token `GET /metrics` requires (at least 16 characters). Default none:
    /// whoever reaches the address may read it.
    #[env("COUNTERSIGN_METRICS_TOKEN", keep_empty)]
    pub metrics_token: Option<Secret>,
    /// Folder of agent definitions (the same the workers load). Default `agents`.
    #[env("COUNTERSIGN_AGENTS_DIR")]
    pub agents_dir: PathBuf,
    /// Milliseconds between looks at the agents' folder for a changed file, which is then
    /// loaded without a restart. Default 2000.
    #[env("COUNTERSIGN_AGENTS_RELOAD_MS")]
    pub agents_reload_ms: u64,
    /// Who may call the API. Default none (every request is refused).
    #[env("COUNTERSIGN_API_KEYS", with = api_keys_from_env)]
    pub api_keys: Vec<ApiKey>,
    /// The people who may review, each configured once: a principal id, roles, and how to
    /// reach them in Slack and by email.
    pub people: Vec<Person>,
    /// Slack, for `slack:#channel` channels. Absent: Slack is off.
    pub slack: Option<SlackConfig>,
    /// Email approvals, for `email:ADDRESS` and `email:approvers` channels. Absent: email
    /// is off.
    pub email: Option<EmailConfig>,
    /// The reviewers' web inbox: sessions and sign-in links.
    pub inbox: InboxConfig,
    /// Endpoints approval events are POSTed to, signed per Standard Webhooks.
    pub webhooks: Vec<WebhookEndpoint>,
    /// Systems that may post decisions signed per Standard Webhooks instead of with a key.
    pub signed_senders: Vec<SignedSender>,
    /// Attempts to send one delivery before it is given up. Default 10.
    pub delivery_max_attempts: u32,
    /// Milliseconds before the first retry of a failed delivery; each retry doubles it, up
    /// to an hour. Default 5000.
    pub delivery_retry_base_ms: u64,
    /// Largest request body in bytes; larger ones get 413. Default 65536.
    pub max_body_bytes: usize,
    /// Seconds an `Idempotency-Key` of `POST /v1/runs` is remembered. Default 86400.
    pub idempotency_ttl_secs: u64,
    /// Milliseconds a client has to send a request's headers, counted from when the
    /// connection starts waiting for them (so a kept-alive connection whose next request does
    /// not come is closed after this long too). Default 5000.
    pub header_read_timeout_ms: u64,
    /// Milliseconds a client has to send a request's body once its headers arrived; a late
    /// body is answered 408 and the connection closed. Default 10000.
    pub body_timeout_ms: u64,
    /// Milliseconds a connection may move no byte either way (say, a client that stopped
    /// reading its answer) before it is closed. Default 60000.
    pub idle_timeout_ms: u64,
    /// Connections served at once; further ones wait in the listen backlog until one
    /// closes. Default 1024.
    pub max_connections: usize,
    /// Milliseconds between the comments that keep a quiet run's live events stream (`GET
    /// /v1/runs/{id}/events`) open through proxies, and `idle_timeout_ms` from closing it.
    /// Default 15000.
    pub live_heartbeat_ms: u64,
    /// Milliseconds a run's live events wait for a client that reads too slowly to make
    /// room, before it is cut off (with a `stream.cut` event, after which it reconnects with
    /// `Last-Event-ID`). Default 10000.
    pub live_slow_reader_ms: u64,
    /// Live events streams (`GET /v1/runs/{id}/events` and the inbox's) this gateway serves
    /// at once; one more is answered `429 too_many_streams` with `Retry-After`. Open streams
    /// are counted here and not in `max_connections`, so however many are open, probes and
    /// decisions are still answered. Default 512.
    pub live_max_streams: usize,
    /// Live events streams one principal (all its keys and sessions) may have open at once on
    /// this gateway. Default 16.
    pub live_max_streams_per_principal: usize,
    /// Live events streams of one run open at once on this gateway. Default 64.
    pub live_max_streams_per_run: usize,
    /// Countersignature receipts for approved calls; `COUNTERSIGN_RECEIPT_KEY_FILE` sets
    /// `key_file` (the table's other keys stay as the file has them).
    #[env("COUNTERSIGN_RECEIPT_KEY_FILE", with = receipt_key_file_from_env)]
    pub receipts: ReceiptsConfig,
    /// The MCP endpoint of `mcp_client` agents, `/mcp/{agent}`.
    pub mcp: McpConfig,
    /// The door of `external` agents, `/v1/agents/{agent}/calls`.
    pub door: DoorConfig,
}

/// How `/mcp/{agent}` answers a `tools/call`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// Seconds a `tools/call` waits for its run to finish (for a held call: for a person's
    /// decision) before it is answered that the call waits, and that calling again with the
    /// same arguments returns its outcome. Default 60.
    pub wait_secs: u64,
}

/// The door of `external` agents.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DoorConfig {
    /// The longest an ask, or a look at a call, may wait for the call's outcome before it is
    /// answered that the call still waits (the request's `wait_secs` is capped by it).
    /// Default 60.
    pub max_wait_secs: u64,
}

impl Default for DoorConfig {
    fn default() -> Self {
        Self { max_wait_secs: 60 }
    }
}

impl Default for McpConfig {
    fn default() -> Self {
        Self { wait_secs: 60 }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            connections: Connections::default(),
            listen: "127.0.0.1:8080".into(),
            metrics_listen: None,
            metrics_token: None,
            agents_dir: "agents".into(),
            agents_reload_ms: 2000,
            api_keys: Vec::new(),
            people: Vec::new(),
            slack: None,
            email: None,
            inbox: InboxConfig::default(),
            webhooks: Vec::new(),
            signed_senders: Vec::new(),
            delivery_max_attempts: 10,
            delivery_retry_base_ms: 5000,
            max_body_bytes: 64 * 1024,
            idempotency_ttl_secs: 24 * 3600,
            header_read_timeout_ms: 5000,
            body_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            max_connections: 1024,
            live_heartbeat_ms: 15_000,
            live_slow_reader_ms: 10_000,
            live_max_streams: 512,
            live_max_streams_per_principal: 16,
            live_max_streams_per_run: 64,
            receipts: ReceiptsConfig::default(),
            mcp: McpConfig::default(),
            door: DoorConfig::default(),
        }
    }
}

/// Countersignature receipts: every approved call is given one, signed with `key_file`, which
/// its tool can verify against `GET /.well-known/jwks.json`. Gateways of one deployment share
/// the key file and the published keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReceiptsConfig {
    /// The signing key, a secret: an Ed25519 private key as a PKCS#8 PEM file or a private
    /// OKP JWK. Default none: approved calls carry no receipt, and tools that verify refuse
    /// them (the gateway says so when it starts).
    pub key_file: Option<PathBuf>,
    /// The signing key's `kid`. Default: the JWK's own, else its RFC 7638 thumbprint.
    pub kid: Option<String>,
    /// A JWK Set file of retired public keys still published (so receipts they signed before
    /// a rotation verify until they expire). Default none.
    pub retired_keys_file: Option<PathBuf>,
    /// The receipts' `iss`. Default: the public base URL (`[inbox]` or `[email]`), else
    /// `countersign`.
    pub issuer: Option<String>,
    /// Seconds a receipt is valid: long enough for a resume after an outage. Default 604800
    /// (7 days).
    pub ttl_secs: u64,
}

impl Default for ReceiptsConfig {
    fn default() -> Self {
        Self {
            key_file: None,
            kid: None,
            retired_keys_file: None,
            issuer: None,
            ttl_secs: 7 * 24 * 3600,
        }
    }
}

/// One API key (an `[[api_keys]]` entry): a bearer token, the role it has and the principal it
/// speaks for.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    /// The bearer token. Never logged.
    pub key: Secret,
    /// What the key may do (see `Role`).
    pub role: Role,
    /// Who this key speaks for: recorded as the requester of runs and the maker of decisions.
    pub principal: String,
    /// Other principals a decision made with this key may name as `decided_by` (an
    /// integration deciding for the people it authenticated); `*` means anyone. Default none.
    #[serde(default)]
    pub speaks_for: Vec<String>,
}

/// How the gateway asks reviewers in Slack and takes their decisions from it (the `[slack]`
/// table).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackConfig {
    /// The Web API's base URL. Default `https://slack.com/api`.
    #[serde(default = "slack_api")]
    pub api_base_url: String,
    /// The bot token (`xoxb-…`), with the `chat:write` scope. Never logged.
    pub bot_token: Secret,
    /// The app's signing secret, for `POST /slack/interactions`. Never logged.
    pub signing_secret: Secret,
    /// The workspace (`T…`) whose people decide: an interaction whose `team.id` differs is
    /// refused. Default none (any workspace the app is installed in); set it, since Slack
    /// user ids are mapped to people without it.
    #[serde(default)]
    pub team_id: Option<String>,
    /// The app (`A…`) whose interactions count: one whose `api_app_id` differs is refused.
    /// Default none; set it.
    #[serde(default)]
    pub api_app_id: Option<String>,
}

fn slack_api() -> String {
    "https://slack.com/api".into()
}

/// How the gateway emails reviewers (the `[email]` table).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailConfig {
    /// The SMTP server's host name.
    pub smtp_host: String,
    /// Default 587.
    #[serde(default = "smtp_port")]
    pub smtp_port: u16,
    /// `starttls` (default), `tls` (implicit, usually port 465) or `none` (a local relay).
    #[serde(default)]
    pub smtp_tls: SmtpTls,
    /// The user to sign in to the SMTP server as; none to send without signing in.
    #[serde(default)]
    pub smtp_username: Option<String>,
    /// Never logged.
    #[serde(default)]
    pub smtp_password: Option<Secret>,
    /// The sender, e.g. `Countersign <approvals@example.com>`.
    pub from: String,
    /// Where reviewers reach this gateway, for the links: e.g. `https://approvals.example.com`.
    pub public_base_url: String,
    /// Seconds an email link works. Default 604800 (7 days).
    #[serde(default = "link_ttl")]
    pub link_ttl_secs: u64,
}

fn smtp_port() -> u16 {
    587
}

fn link_ttl() -> u64 {
    7 * 24 * 3600
}

/// The reviewers' web inbox (the `[inbox]` table): where it is reached and how its sign-in
/// works.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InboxConfig {
    /// Where reviewers reach this gateway, e.g. `https://approvals.example.com`: the base of
    /// emailed sign-in links, and, when `https`, the session cookie is `Secure`. Default: the
    /// `[email]` table's `public_base_url`, if any.
    pub public_base_url: Option<String>,
    /// Seconds a signed-in session lasts. Default 28800 (8 hours).
    pub session_ttl_secs: u64,
    /// Seconds an emailed sign-in link works (once). Default 900 (15 minutes).
    pub sign_in_link_ttl_secs: u64,
}

impl Default for InboxConfig {
    fn default() -> Self {
        Self {
            public_base_url: None,
            session_ttl_secs: 8 * 3600,
            sign_in_link_ttl_secs: 15 * 60,
        }
    }
}

impl Config {
    /// Where reviewers reach this gateway, if configured (see [`InboxConfig::public_base_url`]).
    pub fn public_base_url(&self) -> Option<&str> {
        self.inbox
            .public_base_url
            .as_deref()
            .or(self.email.as_ref().map(|e| e.public_base_url.as_str()))
            .map(|url| url.trim_end_matches('/'))
    }
}

/// How the gateway's connection to the SMTP server is secured (`smtp_tls`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmtpTls {
    /// Plain at first, then upgraded with STARTTLS (the default, usually port 587).
    #[default]
    Starttls,
    /// TLS from the start (implicit TLS, usually port 465).
    Tls,
    /// No TLS at all: only for a relay on the same machine or network.
    None,
}

/// An endpoint approval events are POSTed to (a `[[webhooks]]` entry), signed per Standard
/// Webhooks.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookEndpoint {
    /// Named by `webhook:NAME` in a policy's channels: ASCII letters, digits, '-' and '_'.
    pub name: String,
    /// May carry credentials (user info, a token in the query): printed redacted.
    pub url: String,
    /// `whsec_` and base64 of 24 to 64 random bytes. Never logged.
    pub secret: WebhookSecret,
    /// Receive every approval event, not only those of calls whose channels name it.
    #[serde(default)]
    pub all_events: bool,
}

impl fmt::Debug for WebhookEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookEndpoint")
            .field("name", &self.name)
            .field("url", &redacted_url(&self.url))
            .field("all_events", &self.all_events)
            .finish_non_exhaustive()
    }
}

/// A system that may post decisions signed per Standard Webhooks instead of with an API key (a
/// `[[signed_senders]]` entry).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedSender {
    /// The principal the sender's requests are made as.
    pub name: String,
    /// `whsec_…`, the secret it signs with. Never logged.
    pub secret: WebhookSecret,
    /// Principals whose decisions it may relay in `decided_by` (`*`: anyone).
    #[serde(default)]
    pub speaks_for: Vec<String>,
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

    /// Refuses a configuration the gateway cannot run with, saying what is wrong.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.max_body_bytes >= 1024,
            "max_body_bytes must be at least 1024"
        );
        anyhow::ensure!(
            self.header_read_timeout_ms > 0 && self.body_timeout_ms > 0 && self.idle_timeout_ms > 0,
            "header_read_timeout_ms, body_timeout_ms and idle_timeout_ms must be above 0"
        );
        anyhow::ensure!(
            self.live_heartbeat_ms > 0 && self.live_heartbeat_ms < self.idle_timeout_ms,
            "live_heartbeat_ms must be above 0 and below idle_timeout_ms, which would close a quiet live events stream"
        );
        anyhow::ensure!(
            self.live_slow_reader_ms > 0,
            "live_slow_reader_ms must be above 0"
        );
        anyhow::ensure!(
            self.max_connections > 0,
            "max_connections must be at least 1"
        );
        anyhow::ensure!(
            self.live_max_streams > 0
                && self.live_max_streams_per_principal > 0
                && self.live_max_streams_per_run > 0,
            "live_max_streams, live_max_streams_per_principal and live_max_streams_per_run must be at least 1"
        );
        self.validate_keys_and_names()?;
        anyhow::ensure!(
            self.inbox.session_ttl_secs > 0 && self.inbox.sign_in_link_ttl_secs > 0,
            "inbox.session_ttl_secs and inbox.sign_in_link_ttl_secs must be above 0"
        );
        if let Some(url) = self.public_base_url() {
            anyhow::ensure!(
                url.starts_with("https://") || url.starts_with("http://"),
                "the public base URL {url:?} must start with https:// or http://"
            );
        }
        anyhow::ensure!(self.mcp.wait_secs >= 1, "mcp.wait_secs must be at least 1");
        anyhow::ensure!(
            self.delivery_max_attempts >= 1,
            "delivery_max_attempts must be at least 1"
        );
        self.validate_unique()?;
        if let Some(email) = &self.email {
            email
                .from
                .parse::<lettre::message::Mailbox>()
                .map_err(|e| {
                    anyhow::anyhow!("email.from {:?} is not an address: {e}", email.from)
                })?;
        }
        Ok(())
    }

    /// Checks the metrics token, the API keys (long enough, with a principal), that nobody
    /// configured takes a reviewer model's name, and that webhook names are plain.
    fn validate_keys_and_names(&self) -> anyhow::Result<()> {
        countersign_runtime::metrics_http::check_token(self.metrics_token.as_ref())?;
        for key in &self.api_keys {
            anyhow::ensure!(
                key.key.expose().len() >= 16,
                "the API key of {:?} is shorter than 16 characters",
                key.principal
            );
            anyhow::ensure!(!key.principal.is_empty(), "an API key has no principal");
        }
        // A reviewer model's name is its own: a person under it would read as the model in
        // the trail and the receipts (and get past a tool that refuses models' approvals).
        let named = self.api_keys.iter().map(|k| &k.principal);
        let named = named
            .chain(self.people.iter().map(|p| &p.id))
            .chain(self.signed_senders.iter().map(|s| &s.name));
        for id in named {
            anyhow::ensure!(
                !countersign_model::authority::names_a_model(id),
                "{id:?} is a reviewer model's name (model:…): no person, key or sender may have it"
            );
        }
        for hook in &self.webhooks {
            anyhow::ensure!(
                !hook.name.is_empty()
                    && hook
                        .name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                "webhook name {:?} may hold only ASCII letters, digits, '-' and '_'",
                hook.name
            );
        }
        Ok(())
    }

    /// Checks that no person, webhook or signed sender is configured twice.
    fn validate_unique(&self) -> anyhow::Result<()> {
        let mut ids = std::collections::HashSet::new();
        for person in &self.people {
            anyhow::ensure!(
                ids.insert(&person.id),
                "person {:?} is configured twice",
                person.id
            );
        }
        let mut names = std::collections::HashSet::new();
        for name in self.webhooks.iter().map(|h| &h.name) {
            anyhow::ensure!(names.insert(name), "webhook {name:?} is configured twice");
        }
        let mut names = std::collections::HashSet::new();
        for name in self.signed_senders.iter().map(|s| &s.name) {
            anyhow::ensure!(
                names.insert(name),
                "signed sender {name:?} is configured twice"
            );
        }
        Ok(())
    }

    /// The role `id` decides with when a door names a person rather than presenting a key
    /// (Slack, an email link, an inbox session from an emailed link, a key speaking for
    /// them): their `[[people]]` entry's `role`; without one, their API keys' (one that
    /// decides, if any does); a person with neither is a reviewer. Someone who is neither a
    /// configured person nor the principal of a key has no role.
    pub fn person_role(&self, id: &str) -> Option<Role> {
        let person = self.people.iter().find(|p| p.id == id);
        if let Some(role) = person.and_then(|p| p.role) {
            return Some(role);
        }
        let keys: Vec<Role> = self
            .api_keys
            .iter()
            .filter(|k| k.principal == id)
            .map(|k| k.role)
            .collect();
        let deciding = keys.iter().copied().find(|r| r.decides());
        deciding
            .or(keys.first().copied())
            .or(person.map(|_| Role::Reviewer))
    }

    /// Checks that every channel the agents' policies name can be reached with this
    /// configuration, so a typo is found at start-up rather than when a call waits.
    pub fn check_channels(&self, catalog: &Catalog) -> anyhow::Result<()> {
        for agent in catalog.iter() {
            for tool in &agent.def.tools {
                for channel in tool.channels() {
                    let missing = match channel {
                        Channel::Slack(_) if self.slack.is_none() => Some("a [slack] table"),
                        Channel::Email(_) if self.email.is_none() => Some("an [email] table"),
                        Channel::Email(address)
                            if address != "approvers"
                                && !self
                                    .people
                                    .iter()
                                    .any(|p| p.email.as_deref() == Some(address)) =>
                        {
                            Some("a person with that email address")
                        }
                        Channel::Webhook(name)
                            if !self.webhooks.iter().any(|h| h.name == *name) =>
                        {
                            Some("a webhook of that name")
                        }
                        _ => None,
                    };
                    if let Some(missing) = missing {
                        anyhow::bail!(
                            "{}.{} sends to \"{channel}\", which needs {missing} in the gateway's configuration",
                            agent.def.name,
                            tool.name
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// `COUNTERSIGN_API_KEYS`: `key:role:principal` entries separated by commas, as the
/// `[[api_keys]]` tables they stand for (without `speaks_for`).
fn receipt_key_file_from_env(text: &str) -> anyhow::Result<toml::Value> {
    Ok(toml::Value::Table(toml::Table::from_iter([(
        "key_file".to_string(),
        toml::Value::String(text.to_string()),
    )])))
}

fn api_keys_from_env(text: &str) -> anyhow::Result<toml::Value> {
    let keys = text
        .split(',')
        .filter(|entry| !entry.trim().is_empty())
        .map(|entry| {
            let parts: Vec<&str> = entry.trim().splitn(3, ':').collect();
            let [key, role, principal] = parts[..] else {
                anyhow::bail!("entries are key:role:principal");
            };
            let table: toml::Table = [("key", key), ("role", role), ("principal", principal)]
                .into_iter()
                .map(|(name, value)| (name.to_string(), value.into()))
                .collect();
            Ok(table.into())
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(toml::Value::Array(keys))
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_runtime::config::parse;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn keys_from(env: &str) -> anyhow::Result<Vec<ApiKey>> {
        let env = |name: &str| (name == "COUNTERSIGN_API_KEYS").then(|| env.to_string());
        parse::<Config>("", &env).map(|(config, _)| config.api_keys)
    }

    #[test]
    fn keys_parse_from_the_environment_form() {
        let keys =
            keys_from("k1k1k1k1k1k1k1k1:reviewer:alice, k2k2k2k2k2k2k2k2:admin:ops").unwrap();
        assert_eq!(keys[0].role, Role::Reviewer);
        assert_eq!(keys[1].principal, "ops");
        let err = keys_from("k:nobody:x").unwrap_err().to_string();
        assert!(
            err.contains("COUNTERSIGN_API_KEYS") && err.contains("nobody"),
            "{err}"
        );
        let err = keys_from("k-reviewer-alice").unwrap_err().to_string();
        assert!(err.contains("COUNTERSIGN_API_KEYS"), "{err}");
    }

    #[test]
    fn nobody_configured_takes_a_reviewer_model_s_name() {
        for text in [
            "[[api_keys]]\nkey = \"k1k1k1k1k1k1k1k1\"\nrole = \"reviewer\"\nprincipal = \"model:haiku@v1\"\n",
            "[[people]]\nid = \"model:haiku@v1\"\n",
        ] {
            let (config, _): (Config, _) = parse(text, &no_env).unwrap();
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains("reviewer model's name"), "{text}: {err}");
        }
    }

    #[test]
    fn variables_override_the_file() {
        let env = |name: &str| match name {
            "COUNTERSIGN_LISTEN" => Some("0.0.0.0:9".to_string()),
            "COUNTERSIGN_METRICS_TOKEN" => Some("a-token-of-sixteen-chars".to_string()),
            "NATS_URL" => Some("nats://env:1".to_string()),
            _ => None,
        };
        let (config, connections): (Config, _) = parse(
            "listen = \"127.0.0.1:1\"\nnats_url = \"nats://file:1\"\n",
            &env,
        )
        .unwrap();
        assert_eq!(config.listen, "0.0.0.0:9");
        assert!(config.metrics_token.is_some());
        assert_eq!(connections.nats_url, "nats://env:1");
        assert_eq!(
            parse::<Config>("", &no_env).unwrap().0.listen,
            "127.0.0.1:8080"
        );
    }

    #[test]
    fn an_empty_metrics_token_is_refused_not_taken_for_none() {
        // A secret that failed to arrive must not leave `/metrics` open.
        let env = |name: &str| (name == "COUNTERSIGN_METRICS_TOKEN").then(String::new);
        let (config, _): (Config, _) = parse("", &env).unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("metrics_token"), "{err}");
        // Other variables set empty count as unset.
        let env = |name: &str| (name == "COUNTERSIGN_LISTEN").then(String::new);
        assert_eq!(
            parse::<Config>("", &env).unwrap().0.listen,
            "127.0.0.1:8080"
        );
    }

    #[test]
    fn webhook_urls_print_without_their_credentials() {
        let hook: WebhookEndpoint = toml::from_str(
            "name = \"ops\"\nurl = \"https://bot:hunter2@hooks.example.com/in?token=s3cr3t\"\n\
             secret = \"whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3\"\n",
        )
        .unwrap();
        let printed = format!("{hook:?}");
        assert!(
            !printed.contains("hunter2") && !printed.contains("s3cr3t"),
            "{printed}"
        );
        assert!(
            printed.contains("hooks.example.com/in?token=redacted"),
            "{printed}"
        );
    }

    #[test]
    fn the_receipt_key_file_variable_keeps_the_rest_of_the_receipts_table() {
        let file = "[receipts]\nissuer = \"https://a.example\"\nkey_file = \"/from/file\"\n";
        let env = |name: &str| {
            (name == "COUNTERSIGN_RECEIPT_KEY_FILE").then(|| "/run/secrets/key".to_string())
        };
        let (config, _) = parse::<Config>(file, &env).unwrap();
        assert_eq!(
            config.receipts.key_file.as_deref(),
            Some(std::path::Path::new("/run/secrets/key"))
        );
        assert_eq!(config.receipts.issuer.as_deref(), Some("https://a.example"));
    }

    #[test]
    fn keys_never_print() {
        let key = keys_from("secretsecretsecret:admin:ops").unwrap();
        assert!(!format!("{key:?}").contains("secretsecret"));
    }
}

#[cfg(test)]
mod unknown_keys {
    use super::*;

    #[test]
    fn a_misspelled_key_is_refused_with_its_name() {
        let parse = |text| {
            countersign_runtime::config::parse::<Config>(text, &|_| None).map(
                |(mut config, connections)| {
                    config.connections = connections;
                    config
                },
            )
        };
        let err = parse("listen = \"127.0.0.1:1\"\nredis_ulr = \"redis://x\"\n").unwrap_err();
        assert!(err.to_string().contains("redis_ulr"), "{err}");
        let err = parse("[[people]]\nid = \"a\"\nrole = [\"x\"]\n").unwrap_err();
        assert!(err.to_string().contains("role"), "{err}");
        let config = parse("redis_url = \"redis://x\"\nlisten = \"0.0.0.0:1\"\n").unwrap();
        assert_eq!(config.connections.redis_url, "redis://x");
    }

    #[test]
    fn the_reference_configuration_loads_and_validates() {
        let (config, _): (Config, _) =
            countersign_runtime::config::parse(include_str!("../config.example.toml"), &|_| None)
                .unwrap();
        config.validate().unwrap();
        assert_eq!(config.api_keys.len(), 2);
        assert!(config.slack.is_some() && config.email.is_some());
        let slack = config.slack.unwrap();
        assert!(slack.team_id.is_some() && slack.api_app_id.is_some());
    }

    #[test]
    fn the_reference_configuration_documents_every_key_and_the_page_every_variable() {
        countersign_runtime::config::check_example::<Config>(include_str!(
            "../config.example.toml"
        ))
        .unwrap_or_else(|faults| panic!("config.example.toml:\n{faults}"));
        countersign_runtime::config::check_env_table::<Config>(
            include_str!("../../docs/configuration.md"),
            "gateway",
        )
        .unwrap_or_else(|faults| panic!("docs/configuration.md:\n{faults}"));
    }

    #[test]
    fn channels_the_agents_name_must_exist_in_the_configuration() {
        let dir = std::env::temp_dir().join(format!("cs-channels-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let agent = |channel: &str| {
            format!(
                "name = \"a\"\nsystem = \"s\"\n[model]\nprovider = \"anthropic\"\nname = \"m\"\n\
                 [[tools]]\nname = \"t\"\ndescription = \"d\"\ninput_schema = {{ type = \"object\" }}\n\
                 http = {{ url = \"http://127.0.0.1:1/t\" }}\n[tools.approval]\nchannels = [\"{channel}\"]\n"
            )
        };
        let check = |channel: &str, config: &Config| {
            std::fs::write(dir.join("a.toml"), agent(channel)).unwrap();
            let agent = countersign_model::agent::Agent::from_toml(&agent(channel), &dir).unwrap();
            config.check_channels(&countersign_model::agent::Catalog::new([agent]).unwrap())
        };
        let bare = Config::default();
        for channel in ["webhook:ops", "slack:#x", "email:approvers"] {
            let err = check(channel, &bare).unwrap_err().to_string();
            assert!(err.contains(channel), "{err}");
        }
        let (full, _): (Config, _) =
            countersign_runtime::config::parse(include_str!("../config.example.toml"), &|_| None)
                .unwrap();
        for channel in [
            "webhook:ops",
            "slack:#x",
            "email:approvers",
            "email:bob@example.com",
        ] {
            check(channel, &full).unwrap();
        }
        assert!(check("webhook:other", &full).is_err());
        assert!(check("email:stranger@example.com", &full).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
