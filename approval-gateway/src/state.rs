//! What every handler and delivery shares, built once at start-up. It depends only on the
//! configuration and the shared crate.

use crate::config::{ApiKey, Config, EmailConfig, Role, SmtpTls};
use crate::receipts::Receipts;
use countersign_model::agent::Catalog;
use countersign_model::digest::sha256_hex;
use countersign_model::people::Directory;
use countersign_model::run::{Decision, Run, RunId};
use countersign_runtime::bus::Bus;
use countersign_runtime::health::Consumers;
use countersign_runtime::metrics::Metrics;
use countersign_store::relay::Relay;
use countersign_store::{GatewayStore, StoreError};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, Tokio1Executor};
use std::collections::HashMap;
use std::sync::Arc;

/// The SMTP transport (a pool), built once from `[email]`.
pub(crate) type Mailer = AsyncSmtpTransport<Tokio1Executor>;

#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) store: GatewayStore,
    pub(crate) bus: Bus,
    /// Publishes what the scripts queued.
    pub(crate) outbox: Relay,
    /// Whether the deliveries' work loop pulls from its consumers (a readiness check).
    pub(crate) consumers: Consumers,
    /// The agents as last loaded (see [`AppState::catalog`]).
    agents: Arc<tokio::sync::watch::Sender<Catalog>>,
    pub(crate) config: Arc<Config>,
    /// This gateway's figures, served at `GET /metrics`.
    pub(crate) metrics: Metrics,
    pub(crate) people: Arc<Directory>,
    /// The SMTP transport, when email is configured.
    pub(crate) mailer: Option<Mailer>,
    /// For outbound calls (webhooks, Slack); follows no redirects.
    pub(crate) http: reqwest::Client,
    /// Signs approved calls' receipts; the keys tools verify them with.
    pub(crate) receipts: Arc<Receipts>,
    /// The live events streams open on this gateway, against their caps.
    pub(crate) live_streams: Arc<crate::live::streams::Streams>,
    /// API keys by the SHA-256 of the key, so lookups do not compare secrets byte by byte.
    keys: Arc<HashMap<String, ApiKey>>,
}

impl AppState {
    pub(crate) fn new(
        store: GatewayStore,
        bus: Bus,
        catalog: Catalog,
        config: Config,
        metrics: Metrics,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            mailer: config.email.as_ref().map(smtp).transpose()?,
            receipts: Arc::new(Receipts::load(&config)?),
            keys: Arc::new(
                config
                    .api_keys
                    .iter()
                    .map(|k| (sha256_hex(k.key.expose()), k.clone()))
                    .collect(),
            ),
            live_streams: Arc::default(),
            outbox: Relay::new(&store, bus.clone(), metrics.clone()),
            metrics,
            consumers: Consumers::default(),
            store,
            bus,
            agents: Arc::new(tokio::sync::watch::Sender::new(catalog)),
            people: Arc::new(Directory::new(&config.people)),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("an HTTP client with default TLS"),
            config: Arc::new(config),
        })
    }

    /// The agents as last loaded: a request works with the version it read first.
    pub(crate) fn catalog(&self) -> Catalog {
        self.agents.borrow().clone()
    }

    /// Puts reloaded agents in place for the requests that start from now.
    pub(crate) fn replace_catalog(&self, catalog: Catalog) {
        self.agents.send_replace(catalog);
    }

    /// Changes each time reloaded agents are put in place.
    pub(crate) fn reloads(&self) -> tokio::sync::watch::Receiver<Catalog> {
        self.agents.subscribe()
    }

    /// The role a person decides with when a door names them (Slack, an email link, a
    /// session from an emailed link, a key speaking for them): see
    /// [`Config::person_role`]; someone with no role decides nothing.
    pub(crate) fn person_role(&self, id: &str) -> Role {
        self.config.person_role(id).unwrap_or(Role::Reader)
    }

    /// The configured API key `key` is, if it is one.
    pub(crate) fn api_key(&self, key: &str) -> Option<&ApiKey> {
        self.api_key_by_fingerprint(&sha256_hex(key))
    }

    /// The configured API key whose SHA-256 is `fingerprint`, if there is one.
    pub(crate) fn api_key_by_fingerprint(&self, fingerprint: &str) -> Option<&ApiKey> {
        self.keys.get(fingerprint)
    }

    /// The run a path or a link names; none if the id is malformed or nothing is stored.
    pub(crate) async fn run(&self, run_id: &str) -> Result<Option<Run>, StoreError> {
        match RunId::parse(run_id) {
            Some(id) => self.store.load(&id).await,
            None => Ok(None),
        }
    }

    /// [`AppState::run`] and the decisions recorded on its calls, read in one round trip.
    pub(crate) async fn run_with_decisions(
        &self,
        run_id: &str,
    ) -> Result<Option<(Run, HashMap<String, Decision>)>, StoreError> {
        match RunId::parse(run_id) {
            Some(id) => self.store.load_with_decisions(&id).await,
            None => Ok(None),
        }
    }
}

fn smtp(config: &EmailConfig) -> anyhow::Result<Mailer> {
    let host = config.smtp_host.as_str();
    let builder = match config.smtp_tls {
        SmtpTls::None => Mailer::builder_dangerous(host),
        SmtpTls::Starttls => Mailer::starttls_relay(host)?,
        SmtpTls::Tls => Mailer::relay(host)?,
    };
    let builder = builder.port(config.smtp_port);
    let builder = match (&config.smtp_username, &config.smtp_password) {
        (Some(user), Some(password)) => builder.credentials(Credentials::new(
            user.clone(),
            password.expose().to_string(),
        )),
        _ => builder,
    };
    Ok(builder.build())
}
