//! What countersign is about, as types and pure functions: a run and its conversation, the
//! calls a turn asks for and the ones held for a person, decisions and who may make them,
//! the audit chain, the events announced about runs, the digests that bind a decision to
//! what was shown, and agent definitions with their policies and scripted turns; and the
//! decoder of server-sent events the worker, the command line and the tests read streams with.
//! No I/O: the command line depends on this crate alone.

pub mod agent;
pub mod approval;
pub mod audit;
pub mod authority;
pub mod condition;
pub mod delegation;
pub mod digest;
pub mod door;
pub mod edit;
pub mod events;
pub mod grant;
pub mod input_problem;
pub mod limits;
pub mod live;
pub mod mcp;
pub mod mcp_proxy;
pub mod one_call;
pub mod people;
pub mod policy;
pub mod refusal;
pub mod replay;
pub mod reviewer;
pub mod run;
pub mod scripted;
pub mod span;
pub mod sse;
pub mod stage;
pub mod suggest;
pub mod window;

/// Milliseconds since the Unix epoch, the one clock every stored timestamp uses.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
