//! The parts of the gateway's answers the tables show, read into the shared crate's types
//! where it has them (`--json` prints the answers whole instead).

use countersign_model::audit::AuditEntry;
use countersign_model::delegation::{Delegation, DelegationStatus, DelegationUse};
use countersign_model::grant::{Grant, GrantStatus, GrantUse};
use countersign_model::run::{Cancellation, Decision, FailedCall, HeldCall, Message, Speaker};
use serde::Deserialize;
use serde_json::Value;

/// `GET /v1/runs/{run_id}`.
#[derive(Deserialize)]
pub(crate) struct RunView {
    pub run_id: String,
    pub agent: String,
    pub status: String,
    pub requested_by: Option<String>,
    /// The model's words in the turn the run is paused on.
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub pending: Vec<HeldView>,
    pub answer: Option<String>,
    pub error: Option<String>,
    /// The run's calls that failed; absent from a gateway that does not say.
    #[serde(default)]
    pub failed_calls: Vec<FailedCall>,
    pub cancel: Option<Cancellation>,
    #[serde(default)]
    pub messages: Vec<Message>,
    pub created_at: String,
    pub updated_at: String,
}

impl RunView {
    /// What the user asked: the conversation's first message.
    pub(crate) fn request(&self) -> String {
        self.messages
            .first()
            .filter(|m| m.role == Speaker::User)
            .map(Message::text)
            .unwrap_or_default()
    }
}

/// A call of the paused turn, and its decision once there is one.
#[derive(Deserialize)]
pub(crate) struct HeldView {
    #[serde(flatten)]
    pub call: HeldCall,
    /// The input fields an edit may change; absent from a gateway that does not say.
    pub fields: Option<Vec<String>>,
    pub decision: Option<Decision>,
}

/// One entry of `GET /v1/approvals`.
#[derive(Deserialize)]
pub(crate) struct Approval {
    pub run_id: String,
    pub agent: String,
    pub requested_by: Option<String>,
    pub paused_at: String,
    pub call_id: String,
    pub summary: String,
    /// When the call expires, in ms since the epoch.
    pub deadline: Option<i64>,
}

/// A grant of `GET /v1/grants` and `GET /v1/grants/{id}` (which lists its uses too).
#[derive(Deserialize)]
pub(crate) struct GrantView {
    #[serde(flatten)]
    pub grant: Grant,
    pub status: GrantStatus,
    #[serde(default)]
    pub used_by: Vec<GrantUse>,
}

/// A delegation of `GET /v1/delegations` and `GET /v1/delegations/{id}` (with its uses).
#[derive(Deserialize)]
pub(crate) struct DelegationView {
    #[serde(flatten)]
    pub delegation: Delegation,
    pub status: DelegationStatus,
    #[serde(default)]
    pub used_by: Vec<DelegationUse>,
}

/// `GET /v1/runs/{run_id}/audit`.
#[derive(Deserialize)]
pub(crate) struct Trail {
    pub verified: bool,
    pub broken_at: Option<usize>,
    /// The chain's elements, `{prev, hash, entry}`, kept as values: verifying hashes the
    /// entries exactly as stored.
    pub entries: Vec<Value>,
    #[serde(default)]
    pub refusals: Vec<Value>,
}

impl Trail {
    /// The entry of a chain element, if it reads as one.
    pub(crate) fn entry(element: &Value) -> Option<AuditEntry> {
        serde_json::from_value(element["entry"].clone()).ok()
    }
}

/// Reads an answer into the type a table shows; an answer of another shape is not a
/// gateway's.
pub(crate) fn read<T: serde::de::DeserializeOwned>(
    value: Value,
) -> Result<T, crate::error::CliError> {
    serde_json::from_value(value).map_err(|e| {
        crate::error::CliError::Unreachable(format!("the gateway's answer was not understood: {e}"))
    })
}
