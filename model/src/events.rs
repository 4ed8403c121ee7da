//! Messages on NATS. Each is JSON with a `type` and a `version` field.

use crate::run::{Action, HeldCall, Run, RunId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The version of every payload below; bump it when a field changes meaning.
pub const EVENT_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub version: u32,
    #[serde(flatten)]
    pub event: Event,
}

impl Envelope {
    pub fn new(event: Event) -> Self {
        Self {
            version: EVENT_VERSION,
            event,
        }
    }
}

/// One tool result the agent had seen when it asked for approval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub call_id: String,
    pub tool: String,
    pub input: Value,
    pub content: String,
    pub is_error: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    /// A job on `runs.start`, published by the gateway that stored the run; a worker never
    /// creates a run from one.
    #[serde(rename = "run.start")]
    RunStart {
        run_id: RunId,
        agent: String,
        input: String,
        #[serde(default)]
        requested_by: Option<String>,
        #[serde(default)]
        metadata: Value,
    },
    #[serde(rename = "approval.requested")]
    ApprovalRequested {
        run_id: RunId,
        agent: String,
        turn: u32,
        /// The model's own words in the turn that asked for the calls.
        text: String,
        calls: Vec<HeldCall>,
        /// The results of the turn's calls that needed nobody: what the agent had seen.
        #[serde(default)]
        evidence: Vec<Evidence>,
        #[serde(default)]
        requested_by: Option<String>,
    },
    #[serde(rename = "approval.decided")]
    ApprovalDecided {
        run_id: RunId,
        call_id: String,
        action: Action,
        decided_by: String,
        /// The door the decision came through (`api`, `web`, `slack`, `email`, `webhook`,
        /// `grant`, `deadline`, `policy`).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        door: String,
        /// Whether every held call of the turn now has a decision.
        all_decided: bool,
        /// The channels the call was sent to, which should show the outcome.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        channels: Vec<String>,
        /// The standing grant that decided the call (nobody was asked, so no channel showed
        /// it before).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        under_grant: Option<String>,
        /// Closed undecided because its policy changed while it waited; its run is checked
        /// again under the policy now (a call held again is announced anew).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        superseded: bool,
    },
    /// A held call still waits: a reminder before its deadline, or (`escalated`) its deadline
    /// passed and more approvers are asked, with a later deadline.
    #[serde(rename = "approval.reminder")]
    ApprovalReminder {
        run_id: RunId,
        agent: String,
        text: String,
        call: Box<HeldCall>,
        escalated: bool,
        #[serde(default)]
        requested_by: Option<String>,
    },
    /// A held call's deadline passed with no decision; it counts as refused.
    #[serde(rename = "approval.expired")]
    ApprovalExpired {
        run_id: RunId,
        call_id: String,
        deadline: i64,
        /// The channels the call was sent to, which should show it expired.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        channels: Vec<String>,
    },
    /// A person should look: a call's side effect may or may not have happened (its worker
    /// died after starting it, and the tool is not idempotent; `call_id`, `tool` and `input`
    /// name it), or the run's stored state cannot be read, so no worker goes on with it.
    #[serde(rename = "run.attention")]
    RunAttention {
        run_id: RunId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        #[serde(default)]
        input: Value,
        reason: String,
    },
    /// A call held or decided under a policy that changed since was checked again under the
    /// new one: `released` (it runs), `reheld` (asked again as `new_call_id`), `refused` (its
    /// tool is gone or its input no longer fits; the model is told) or `superseded` (a waiting
    /// call closed so that its run is checked again).
    #[serde(rename = "run.policy_changed")]
    RunPolicyChanged {
        run_id: RunId,
        call_id: String,
        tool: String,
        outcome: String,
        /// The policy version the call was held under, and the version now (empty when the
        /// tool is gone).
        from_version: String,
        to_version: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        new_call_id: Option<String>,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
        /// The channels the call was sent to, which should show what became of it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        channels: Vec<String>,
    },
    /// A tool's shadow policy sorted a call differently from the live one, which decided:
    /// `would_hold`, `would_release` or `other_reviewers`; `live` and `shadow` say what each
    /// did (`{"gate": "run"}`, or `{"gate": "hold", "approvers", "quorum"}`).
    #[serde(rename = "run.policy_shadow")]
    RunPolicyShadow {
        run_id: RunId,
        call_id: String,
        tool: String,
        outcome: String,
        live: Value,
        shadow: Value,
    },
    /// A held call was closed undecided because its run was cancelled.
    #[serde(rename = "approval.cancelled")]
    ApprovalCancelled {
        run_id: RunId,
        call_id: String,
        cancelled_by: String,
        /// The channels the call was sent to, which should show it was cancelled.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        channels: Vec<String>,
    },
    #[serde(rename = "run.completed")]
    RunCompleted { run_id: RunId, answer: String },
    #[serde(rename = "run.failed")]
    RunFailed { run_id: RunId, error: String },
    #[serde(rename = "run.cancelled")]
    RunCancelled {
        run_id: RunId,
        cancelled_by: String,
        #[serde(default)]
        reason: Option<String>,
    },
}

impl Event {
    /// The `approval.requested` of `run` as stored, paused on its held calls: what the worker
    /// announces, and what the gateway shows and matches grants against whatever the message
    /// on NATS said (the stored run is the one authority on what waits).
    pub fn approval_requested(run: &Run) -> Self {
        Event::ApprovalRequested {
            run_id: run.run_id.clone(),
            agent: run.agent.clone(),
            turn: run.turns,
            text: run.paused_turn_text(),
            calls: run.held_calls().cloned().collect(),
            evidence: run
                .paused_turn
                .iter()
                .filter_map(|c| {
                    let result = c.result.as_ref()?;
                    Some(Evidence {
                        call_id: c.call_id.clone(),
                        tool: c.tool.clone(),
                        input: c.input.clone(),
                        content: result.content.clone(),
                        is_error: result.is_error,
                    })
                })
                .collect(),
            requested_by: run.requested_by.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_carry_type_and_version() {
        let e = Envelope::new(Event::RunCompleted {
            run_id: RunId::parse("run_1").unwrap(),
            answer: "done".into(),
        });
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "run.completed");
        assert_eq!(v["version"], 1);
        assert_eq!(serde_json::from_value::<Envelope>(v).unwrap(), e);
    }
}
