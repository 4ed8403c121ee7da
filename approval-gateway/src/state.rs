//! What every handler shares.

use crate::config::{ApiKey, Config};
use crate::extract::Caller;
use countersign_shared::agent::Catalog;
use countersign_shared::bus::Bus;
use countersign_shared::digest::sha256_hex;
use countersign_shared::outbox::Outbox;
use countersign_shared::people::Directory;
use countersign_shared::store::Store;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub bus: Bus,
    /// Publishes what the scripts queued.
    pub outbox: Outbox,
    pub catalog: Catalog,
    pub config: Arc<Config>,
    pub people: Arc<Directory>,
    /// The SMTP transport, when email is configured.
    pub mailer: Option<crate::email::Mailer>,
    /// For outbound calls (webhooks, Slack); follows no redirects.
    pub http: reqwest::Client,
    /// API keys by the SHA-256 of the key, so lookups do not compare secrets byte by byte.
    keys: Arc<HashMap<String, ApiKey>>,
}

impl AppState {
    pub fn new(store: Store, bus: Bus, catalog: Catalog, config: Config) -> anyhow::Result<Self> {
        let keys = config
            .api_keys
            .iter()
            .map(|k| (sha256_hex(k.key.expose()), k.clone()))
            .collect();
        Ok(Self {
            mailer: config
                .email
                .as_ref()
                .map(crate::email::mailer)
                .transpose()?,
            outbox: Outbox::new(store.clone(), bus.clone()),
            store,
            bus,
            catalog,
            people: Arc::new(Directory::new(&config.people)),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("an HTTP client with default TLS"),
            config: Arc::new(config),
            keys: Arc::new(keys),
        })
    }

    pub fn caller_for(&self, key: &str) -> Option<Caller> {
        self.keys.get(&sha256_hex(key)).map(|k| Caller {
            principal: k.principal.clone(),
            role: k.role,
            speaks_for: k.speaks_for.clone(),
        })
    }
}
