//! What the test sees while it plays a history, each with the instant it saw it on its own
//! clock: the requests the tools received, the fake model's answers, the gateway's answers to
//! the test's requests; and, at the end, each run's record and audit trail, and what the
//! shards' indexes of waiting still name.

use serde_json::Value;
use std::time::Instant;

/// One request a tool received.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    /// `/lookup` or `/refunds`.
    pub path: String,
    /// `{run_id}:{turn}:{call_id}`, as the worker names the call.
    pub key: String,
    pub body: Value,
    /// When it arrived.
    pub at: Instant,
}

impl ToolRequest {
    /// The run, turn and call its idempotency key names.
    pub fn names(&self) -> Option<(&str, u32, &str)> {
        let mut parts = self.key.rsplitn(3, ':');
        let call = parts.next()?;
        let turn = parts.next()?.parse().ok()?;
        Some((parts.next()?, turn, call))
    }
}

/// One answer of the fake model.
#[derive(Clone, Debug)]
pub struct ModelAnswer {
    /// The ids of the calls it asked for, fresh for every answer (none for a reviewer's
    /// verdict).
    pub call_ids: Vec<String>,
    /// It was the reviewer model's verdict on a held call, not an agent's turn.
    pub review: bool,
    /// When the answer was made, just before it was sent: anything done with it happened
    /// later.
    pub at: Instant,
}

/// What the test asked the gateway.
#[derive(Clone, Debug)]
pub enum Asked {
    /// A decision on `call_id` of run `run` (an index into the history's runs).
    Decide {
        run: usize,
        call_id: String,
        principal: &'static str,
        action: &'static str,
        /// What the decision lets run, if it does: the input shown (approve) or the edited one.
        runs_with: Option<Value>,
        /// The digest quoted is not the call's.
        stale: bool,
    },
    Cancel {
        run: usize,
    },
}

/// The gateway's answer to one request of the test (after any 503s, which are retried).
#[derive(Clone, Debug)]
pub struct Answer {
    pub asked: Asked,
    /// When the request was first sent, and when its last answer came.
    pub sent: Instant,
    pub at: Instant,
    pub status: u16,
    /// The error's code (`error.code`, or a batch result's), for a refusal.
    pub code: Option<String>,
    /// A decision's `status` (`recorded`, `already_recorded`), or the whole error's message.
    pub said: String,
    /// How many 503s came before.
    pub unavailable: u32,
}

/// A run at the end of the history, as the gateway shows it.
#[derive(Clone, Debug)]
pub struct Ended {
    pub run: usize,
    pub run_id: String,
    /// `GET /v1/runs/{id}`.
    pub record: Value,
    /// `GET /v1/runs/{id}/audit`.
    pub trail: Value,
}

/// Everything one history produced.
#[derive(Clone, Debug, Default)]
pub struct Observations {
    /// Each started run's id, by index.
    pub run_ids: Vec<Option<String>>,
    /// The scripts' inputs, by index.
    pub inputs: Vec<String>,
    pub tools: Vec<ToolRequest>,
    pub model: Vec<ModelAnswer>,
    pub answers: Vec<Answer>,
    pub ended: Vec<Ended>,
    /// What the shard indexes of waiting held once every run had ended: (index, member)
    /// of `awaiting` (a run id), `deadlines` and `reminders` (`run_id|call_id|digest`).
    pub indexed: Vec<(String, String)>,
    /// Runs that had not ended when the test stopped waiting, and how they stood.
    pub unfinished: Vec<(usize, String)>,
    /// Every refund limit the agent had.
    pub limits: Vec<u32>,
    /// Whether a worker may have died mid-step (kills, restarts).
    pub disrupted: bool,
    /// Whether a server the gateway needs went away.
    pub restarts: bool,
}
