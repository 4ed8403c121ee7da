//! How runs and pending calls look in the API's answers.

use countersign_shared::run::{Cancellation, Decision, Message, PendingCall, Run};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;

#[derive(Serialize)]
pub struct RunView {
    pub run_id: String,
    pub agent: String,
    pub agent_version: String,
    pub status: &'static str,
    pub requested_by: Option<String>,
    pub metadata: Value,
    pub turns: u32,
    /// The model's words in the turn the run is paused on.
    pub text: String,
    pub pending: Vec<PendingView>,
    pub answer: Option<String>,
    pub error: Option<String>,
    /// Who asked to cancel the run, why and when, once someone has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel: Option<Cancellation>,
    pub messages: Vec<Message>,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Serialize)]
pub struct PendingView {
    #[serde(flatten)]
    pub call: PendingCall,
    pub decision: Option<Decision>,
}

pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl RunView {
    pub fn new(run: Run, mut decisions: HashMap<String, Decision>) -> Self {
        let pending = run
            .pending()
            .map(|call| PendingView {
                decision: decisions.remove(&call.call_id),
                call: call.clone(),
            })
            .collect();
        Self {
            text: run.held_turn_text(),
            run_id: run.run_id.to_string(),
            agent: run.agent,
            agent_version: run.agent_version,
            status: run.status.as_str(),
            requested_by: run.requested_by,
            metadata: run.metadata,
            turns: run.turns,
            pending,
            answer: run.answer,
            error: run.error,
            cancel: run.cancel,
            messages: run.messages,
            created_at: rfc3339(run.created_at),
            updated_at: rfc3339(run.updated_at),
        }
    }
}
