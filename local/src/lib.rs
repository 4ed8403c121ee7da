//! Running the whole of countersign on one machine: the demo tools service and the local
//! runner behind `cargo run -p countersign-local`, with the parts it uses: where it listens
//! (`place`), how it watches what it started (`supervise`) and waits for it (`ready`), and the
//! NATS users it starts NATS with (`nats_users`).

pub mod demo_agent;
pub mod demo_ledger;
pub mod demo_mcp;
pub mod demo_tools;
pub mod nats_users;
pub mod place;
pub mod ready;
pub mod supervise;
