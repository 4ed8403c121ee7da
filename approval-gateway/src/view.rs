//! How runs and held calls look in the API's answers.

use crate::time::rfc3339;
use countersign_model::agent::Catalog;
use countersign_model::edit;
use countersign_model::run::{Cancellation, Decision, FailedCall, HeldCall, Message, Run};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;

#[derive(Serialize)]
pub(crate) struct RunView {
    pub(crate) run_id: String,
    pub(crate) agent: String,
    pub(crate) agent_version: String,
    pub(crate) status: &'static str,
    pub(crate) requested_by: Option<String>,
    pub(crate) metadata: Value,
    pub(crate) turns: u32,
    /// The model's words in the turn the run is paused on.
    pub(crate) text: String,
    pub(crate) pending: Vec<HeldView>,
    pub(crate) answer: Option<String>,
    pub(crate) error: Option<String>,
    /// The calls that failed (a tool answered an error, could not be reached, or a call's
    /// outcome is unknown), derived from the run's stored results: a `completed` run may have
    /// some, the model having answered anyway.
    pub(crate) failed_calls: Vec<FailedCall>,
    /// Who asked to cancel the run, why and when, once someone has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cancel: Option<Cancellation>,
    pub(crate) messages: Vec<Message>,
    pub(crate) created_at: String,
    pub(crate) updated_at: String,
}

#[derive(Serialize)]
pub(crate) struct HeldView {
    #[serde(flatten)]
    pub(crate) call: HeldCall,
    /// The id the model gave the call, when the call has one of ours (see `Run::calls_asked`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) model_call_id: Option<String>,
    /// The input fields an edit may change (see `countersign_model::edit`), so a client can
    /// refuse a misspelt one before sending.
    pub(crate) fields: Vec<String>,
    /// Its decision, with its receipt withheld unless the reader may see receipts.
    pub(crate) decision: Option<Value>,
}

impl RunView {
    /// The run as shown to a reader who sees receipts (`receipts`: an admin) or not.
    pub(crate) fn new(
        run: Run,
        mut decisions: HashMap<String, Decision>,
        catalog: &Catalog,
        receipts: Receipts,
    ) -> Self {
        let agent = catalog.get(&run.agent);
        let pending = run
            .paused_turn
            .iter()
            .filter_map(|held| {
                let call = held.held.as_ref()?;
                Some(HeldView {
                    decision: decisions
                        .remove(&call.call_id)
                        .map(|d| decision_view(&d, receipts)),
                    model_call_id: held.model_call_id.clone(),
                    fields: edit::editable_fields(
                        agent
                            .as_ref()
                            .and_then(|a| a.tool(&call.tool))
                            .map_or(&Value::Null, |t| &t.input_schema),
                        &call.input,
                    ),
                    call: call.clone(),
                })
            })
            .collect();
        Self {
            text: run.paused_turn_text(),
            failed_calls: run.failed_calls(),
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

/// Whether a reader sees the receipts decisions and audit entries keep: bearer tokens that
/// run their calls, shown to admins only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Receipts {
    Shown,
    Withheld,
}

impl Receipts {
    pub(crate) fn for_role(role: crate::config::Role) -> Self {
        match role {
            crate::config::Role::Admin => Self::Shown,
            _ => Self::Withheld,
        }
    }
}

/// A decision as the API shows it: its receipt replaced by `{"withheld": true}` unless
/// `receipts` are shown.
pub(crate) fn decision_view(decision: &Decision, receipts: Receipts) -> Value {
    let mut shown = serde_json::to_value(decision).expect("decisions serialize");
    if receipts == Receipts::Withheld && decision.receipt.is_some() {
        shown["receipt"] = countersign_model::audit::withheld();
    }
    shown
}
