//! The contracts between countersign's services: the run model, the events on NATS, the
//! agent definitions, and the NATS and Redis adapters both services use. No service logic.

pub mod agent;
pub mod audit;
pub mod authority;
pub mod bus;
pub mod digest;
pub mod edit;
pub mod events;
pub mod health;
pub mod infra;
pub mod metrics;
pub mod metrics_http;
pub mod names;
pub mod outbox;
pub mod people;
pub mod probe;
pub mod redact;
pub mod run;
pub mod secret;
pub mod shutdown;
pub mod signing;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod trace_context;

/// Milliseconds since the Unix epoch, the one clock every stored timestamp uses.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
