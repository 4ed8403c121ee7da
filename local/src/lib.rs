//! Running the whole of countersign on one machine: the demo tools service and the local
//! runner behind `cargo run -p countersign-local`.

pub mod demo_agent;
pub mod demo_tools;
