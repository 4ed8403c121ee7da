//! Running the whole of countersign on one machine: the demo tools service and the local
//! runner behind `cargo run -p countersign-local`, and the NATS users it starts NATS with.

pub mod demo_agent;
pub mod demo_tools;
pub mod nats_users;
