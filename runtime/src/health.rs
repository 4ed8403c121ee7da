//! Readiness, the same for both services: Redis answers PING, the NATS client is connected,
//! every JetStream stream of the deployment answers a stream-info request, and the service's
//! shared consumers exist and it is pulling from them (so a ready worker is one that takes
//! work). Each check is bounded, so a probe answers within about a second even when a server
//! does not.

use crate::bus::Bus;
use futures::future::join_all;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long one check may take before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether a service pulls from its shared consumers: not until they exist and its pulls
/// have started, and not while it pulls anew after NATS went away. Clones share the state.
#[derive(Clone, Default)]
pub struct Consumers(Arc<AtomicBool>);

impl Consumers {
    /// The consumers exist and the service pulls from them.
    pub fn pulling(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// The service no longer pulls (its message streams ended).
    pub fn stopped(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    /// Whether the service pulls from its consumers now.
    pub fn is_pulling(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What each check found: its name and `None` when it passed, else why not.
pub struct Readiness {
    checks: Vec<(String, Option<String>)>,
}

impl Readiness {
    /// Runs every check at once; `redis_ping` is the store's PING.
    pub async fn check<E: std::fmt::Display>(
        redis_ping: impl Future<Output = Result<(), E>>,
        bus: &Bus,
        consumers: &Consumers,
    ) -> Self {
        let redis = bounded("redis".to_string(), async {
            redis_ping.await.map_err(|e| e.to_string())
        });
        let nats = async {
            let state = bus.client.connection_state();
            let failure = (state != async_nats::connection::State::Connected)
                .then(|| format!("the client is {state:?}").to_lowercase());
            ("nats".to_string(), failure)
        };
        let streams = join_all(bus.names.streams().into_iter().map(|name| {
            bounded(format!("stream {name}"), async move {
                bus.js
                    .get_stream(&name)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        }));
        let (redis, nats, streams) = tokio::join!(redis, nats, streams);
        let pulling = (
            "consumers".to_string(),
            (!consumers.is_pulling()).then(|| "not pulling from its consumers yet".to_string()),
        );
        let mut checks = vec![redis, nats];
        checks.extend(streams);
        checks.push(pulling);
        Self { checks }
    }

    /// The probe's HTTP status: 200 when ready, else 503.
    pub fn status(&self) -> u16 {
        if self.is_ready() { 200 } else { 503 }
    }

    /// Whether every check passed.
    pub fn is_ready(&self) -> bool {
        self.checks.iter().all(|(_, failure)| failure.is_none())
    }

    /// The answer of a probe: `{status: "ready", checks}` when all passed, else the API's
    /// error, `{error: {code: "not_ready", message, details: {checks}}}`, the message naming
    /// what failed. Each check is `"ok"` or why it failed.
    pub fn body(&self) -> Value {
        let checks: Map<String, Value> = self
            .checks
            .iter()
            .map(|(name, failure)| (name.clone(), failure.as_deref().unwrap_or("ok").into()))
            .collect();
        if self.is_ready() {
            return json!({"status": "ready", "checks": checks});
        }
        let failed: Vec<&str> = self
            .checks
            .iter()
            .filter(|(_, failure)| failure.is_some())
            .map(|(name, _)| name.as_str())
            .collect();
        json!({"error": {
            "code": "not_ready",
            "message": format!("not ready: {}", failed.join(", ")),
            "details": {"checks": checks},
        }})
    }
}

async fn bounded(
    name: String,
    check: impl Future<Output = Result<(), String>>,
) -> (String, Option<String>) {
    let failure = match tokio::time::timeout(CHECK_TIMEOUT, check).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(format!("no answer within {} ms", CHECK_TIMEOUT.as_millis())),
    };
    (name, failure)
}
