//! A model-based test of the run (`tests/tests/e2e/model_check.rs`), its pure parts here so they
//! can be read and unit-tested on their own: a seeded generator of histories (several runs at
//! once; decisions raced from two doors, stale digests, cancels, deadlines let pass, policy
//! reloads, worker kills, NATS and Redis restarts), what the test observes while it plays one
//! against the real services (every request the tools received, every answer the fake model
//! and the gateway gave, each with its instant), a reference model that checks those
//! observations and each run's final record and audit trail against the promises of the run,
//! and a shrinker that makes a failing history smaller.
//!
//! Every check is causal: it compares the order of events one process saw (the test's own
//! clock, `Instant`) or what the services stored, never a wall-clock tolerance, so a correct
//! system passes every history however the machine schedules it.

pub mod brain;
pub mod history;
pub mod observe;
pub mod procs;
pub mod reference;
pub mod rng;
pub mod shrink;
pub mod tools;

pub use history::{Act, CallSpec, Door, History, Op, Script};
pub use observe::{Answer, Asked, Ended, ModelAnswer, Observations, ToolRequest};
pub use reference::{Violation, check};
