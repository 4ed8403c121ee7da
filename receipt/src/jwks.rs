//! The gateway's published keys as a tool holds them. Fetched from the gateway's JWK Set URL
//! (`GET /.well-known/jwks.json`) and kept; fetched again when a receipt names a key the copy
//! lacks (the gateway rotated to a new key) and when the copy is older than its maximum age
//! (so a key the gateway stopped publishing stops verifying here too).
//!
//! A lookup starts at most one fetch per minimum interval, however many receipts name keys
//! nobody published, so forged tokens cannot make a tool hammer the gateway; concurrent
//! lookups wait for the one fetch under way instead of starting their own. A copy past its
//! maximum age that cannot be refreshed is not used: receipts are refused as uncheckable (the
//! tool answers 503) until a fetch succeeds, rather than checked against keys that may have
//! been withdrawn.

use crate::{KeySet, PublicKey};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// How long one fetch of the key set may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// When a [`Jwks`] fetched from a URL fetches it again.
#[derive(Clone, Copy, Debug)]
pub struct Refresh {
    /// The least time between two fetches that lookups start; 10 s by default.
    pub min_interval: Duration,
    /// How long a fetched key set is used before it must be fetched again; 5 min by default.
    pub max_age: Duration,
}

impl Default for Refresh {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(10),
            max_age: Duration::from_secs(300),
        }
    }
}

/// Why the key set could not be had.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// The JWK Set URL did not answer with a key set.
    #[error("cannot fetch the key set from {url}: {source}")]
    Fetch {
        /// The URL fetched.
        url: String,
        /// Why the fetch failed.
        #[source]
        source: reqwest::Error,
    },
    /// The copy is out of date, and the last fetch failed too recently to try again; how long
    /// ago it was tried.
    #[error("the key set is out of date and was last fetched, without success, under {0:?} ago")]
    TooSoon(Duration),
}

/// The keys receipts are checked with: a fixed [`KeySet`], or one fetched from the gateway.
pub struct Jwks {
    source: Option<Source>,
    cache: RwLock<Cache>,
    /// Held while fetching, so one fetch runs at a time; holds when the last one started.
    fetching: tokio::sync::Mutex<Option<Instant>>,
}

struct Source {
    client: reqwest::Client,
    url: String,
    refresh: Refresh,
}

#[derive(Clone)]
struct Cache {
    keys: Arc<KeySet>,
    /// When `keys` were fetched; never for a fixed set or before the first fetch.
    fetched: Option<Instant>,
}

/// What a fetch is for: a lookup's fetch is skipped when another one did it meanwhile, and
/// rate limited; one asked for by [`Jwks::refresh`] is neither.
enum Why {
    Lookup { seen: Option<Instant> },
    Asked,
}

impl Jwks {
    /// These keys and no others, never fetched: for tests, and tools given their keys.
    pub fn fixed(keys: KeySet) -> Self {
        Self::with(None, keys)
    }

    /// The key set served at `url`, fetched at the first lookup (call [`Jwks::refresh`]
    /// first to find out at start whether it can be fetched).
    pub fn from_url(url: impl Into<String>, refresh: Refresh) -> Self {
        let source = Source {
            client: reqwest::Client::new(),
            url: url.into(),
            refresh,
        };
        Self::with(Some(source), KeySet::default())
    }

    fn with(source: Option<Source>, keys: KeySet) -> Self {
        Self {
            source,
            cache: RwLock::new(Cache {
                keys: Arc::new(keys),
                fetched: None,
            }),
            fetching: tokio::sync::Mutex::new(None),
        }
    }

    /// Fetches the key set now, whenever it was last fetched. A fixed set stays as it is.
    pub async fn refresh(&self) -> Result<(), JwksError> {
        match &self.source {
            Some(source) => self.fetch(source, Why::Asked).await,
            None => Ok(()),
        }
    }

    /// The published key `kid`, if it is published; an error when the key set is out of date
    /// and cannot be fetched.
    pub(crate) async fn find(&self, kid: &str) -> Result<Option<PublicKey>, JwksError> {
        let seen = self.cached();
        let Some(source) = &self.source else {
            return Ok(seen.keys.find(kid).cloned());
        };
        if source.fresh(&seen)
            && let Some(key) = seen.keys.find(kid)
        {
            return Ok(Some(key.clone()));
        }
        let fetched = self.fetch(source, Why::Lookup { seen: seen.fetched }).await;
        let now = self.cached();
        // Unfetched (too soon) is fine while the copy is fresh: the kid is simply unknown.
        if fetched.is_ok() || source.fresh(&now) {
            Ok(now.keys.find(kid).cloned())
        } else {
            fetched.map(|()| None)
        }
    }

    fn cached(&self) -> Cache {
        self.cache.read().expect("lock poisoned").clone()
    }

    async fn fetch(&self, source: &Source, why: Why) -> Result<(), JwksError> {
        let mut started = self.fetching.lock().await;
        if let Why::Lookup { seen } = why {
            if self.cached().fetched != seen {
                return Ok(()); // fetched while this lookup waited for the lock
            }
            if let Some(since) = started.map(|at| at.elapsed())
                && since < source.refresh.min_interval
            {
                return Err(JwksError::TooSoon(since));
            }
        }
        *started = Some(Instant::now());
        let keys = source.get().await.inspect_err(|e| {
            tracing::warn!(error = %e, "cannot fetch the receipt key set");
        })?;
        *self.cache.write().expect("lock poisoned") = Cache {
            keys: Arc::new(keys),
            fetched: Some(Instant::now()),
        };
        Ok(())
    }
}

impl Source {
    fn fresh(&self, cache: &Cache) -> bool {
        cache
            .fetched
            .is_some_and(|at| at.elapsed() < self.refresh.max_age)
    }

    async fn get(&self) -> Result<KeySet, JwksError> {
        let response = async {
            self.client
                .get(&self.url)
                .timeout(FETCH_TIMEOUT)
                .send()
                .await?
                .error_for_status()?
                .json::<KeySet>()
                .await
        };
        response.await.map_err(|source| JwksError::Fetch {
            url: self.url.clone(),
            source,
        })
    }
}
