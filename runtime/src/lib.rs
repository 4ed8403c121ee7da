//! What every countersign process runs on: its configuration, logs and traces, metrics and
//! probes, shutdown, the NATS bus with the names of its subjects and streams, and the work loop
//! that takes messages from it. Knows the model's types but nothing of Redis (that is
//! `countersign-store`, built on this crate).

pub mod agents;
pub mod bus;
pub mod config;
pub mod health;
pub mod mcp;
pub mod metrics;
pub mod metrics_http;
pub mod names;
pub mod probe;
pub mod redact;
pub mod secret;
pub mod shutdown;
pub mod signing;
pub mod telemetry;
pub mod tls;
pub mod trace_context;
pub mod work;

// `#[derive(Settings)]` names this crate by its name, here too.
extern crate self as countersign_runtime;
