//! What the door answers about a call: where it stands (`status`), and what the agent needs
//! next: the input it may run and the receipt for an approval or an edit, the reason for a
//! rejection, the tool's result when countersign ran it, and for a call still waiting, who
//! was asked and until when.

use crate::time::rfc3339;
use countersign_model::agent::Agent;
use countersign_model::door::{DoorCall, ExecStatus};
use countersign_model::one_call;
use countersign_model::run::{Action, CallOutcome, Decision, Run, RunId, RunStatus};
use countersign_store::AgentExecution;
use serde_json::{Map, Value, json};
use std::collections::HashMap;

/// The call `call_id` of run `id` (`run`, as last read, if found) of `agent`, with its
/// decisions and, for a call released to the agent, its execution record as the agent
/// reported it; its receipt shown only if `receipts`.
pub(super) fn of(
    id: &RunId,
    call_id: &str,
    run: Option<&Run>,
    agent: Option<&Agent>,
    (decisions, execution): (&HashMap<String, Decision>, Option<&AgentExecution>),
    receipts: bool,
) -> Value {
    let mut out = Map::new();
    out.insert("run_id".into(), json!(id));
    out.insert("call_id".into(), json!(call_id));
    let decision = latest(decisions, call_id);
    let asked = run.and_then(asked_call);
    if let Some((tool, input)) = asked {
        out.insert("tool".into(), json!(tool));
        let runs_itself = agent
            .and_then(|a| a.tool(&tool))
            .is_some_and(|t| t.http.is_none() && t.mcp.is_none());
        let executes = if runs_itself { "agent" } else { "countersign" };
        out.insert("executes".into(), json!(executes));
        out.insert("input".into(), input);
    }
    // What may run after an edit is the reviewer's input.
    if let Some(edited) = decision.and_then(|d| d.input.as_ref()) {
        out.insert("input".into(), edited.clone());
    }
    let status = match (run, run.and_then(result)) {
        (_, Some((outcome, content, is_error))) => {
            finished(&mut out, outcome, content, is_error, decision)
        }
        (Some(run), None) => unfinished(&mut out, run, call_id),
        (None, None) => "working",
    };
    out.insert("status".into(), json!(status));
    if let Some(decision) = decision {
        out.insert("decision".into(), decided(decision, receipts));
    }
    if let Some(execution) = execution {
        out.insert("execution".into(), executed(execution));
    }
    out.insert(
        "links".into(),
        json!({
            "self": format!("/v1/runs/{id}/calls/{call_id}"),
            "run": format!("/v1/runs/{id}"),
            "events": format!("/v1/runs/{id}/events"),
        }),
    );
    Value::Object(out)
}

/// The status of a call with a result, and what the agent needs of it.
fn finished(
    out: &mut Map<String, Value>,
    outcome: CallOutcome,
    content: &str,
    is_error: bool,
    decision: Option<&Decision>,
) -> &'static str {
    let decided = || match decision.map(|d| d.action) {
        Some(Action::Edit) => "edited",
        Some(Action::Approve) => "approved",
        _ => "allowed",
    };
    match outcome {
        CallOutcome::Released => decided(),
        CallOutcome::Rejected => "rejected",
        CallOutcome::Expired => "expired",
        CallOutcome::Cancelled => "cancelled",
        CallOutcome::Executed | CallOutcome::Approved | CallOutcome::Edited => {
            out.insert(
                "result".into(),
                json!({"content": content, "is_error": is_error}),
            );
            decided()
        }
        CallOutcome::Failed | CallOutcome::Unknown => {
            out.insert(
                "result".into(),
                json!({"content": content, "is_error": true}),
            );
            out.insert(
                "error".into(),
                json!(match outcome {
                    CallOutcome::Unknown => "its outcome is unknown: it started and its result was lost; a person should check",
                    _ => "the tool failed",
                }),
            );
            "failed"
        }
    }
}

/// The status of a call without a result: held for a person (with who, why and until
/// when), not sorted yet, or in a run that ended without running it.
fn unfinished(out: &mut Map<String, Value>, run: &Run, call_id: &str) -> &'static str {
    match run.status {
        RunStatus::Cancelled => {
            if let Some(cancel) = &run.cancel {
                out.insert("cancel".into(), json!(cancel));
            }
            return "cancelled";
        }
        RunStatus::Failed => {
            out.insert("error".into(), json!(run.error));
            return "failed";
        }
        _ => {}
    }
    let held = run
        .held_calls()
        .filter(|c| same_call(&c.call_id, call_id))
        .last();
    let Some(held) = held else {
        return "working";
    };
    out.insert(
        "held".into(),
        json!({
            "call_id": held.call_id,
            "digest": held.digest,
            "policy_version": held.policy_version,
            "reason": held.reason,
            "deciders": held.deciders,
            "quorum": held.reviewers.quorum,
            "deadline": held.deadline.map(rfc3339),
        }),
    );
    "pending"
}

/// A decision as the agent is shown it; its receipt only to whoever may hold it.
fn decided(decision: &Decision, receipts: bool) -> Value {
    let mut shown = json!({
        "call_id": decision.call_id,
        "action": decision.action.as_str(),
        "decided_by": decision.decided_by,
        "decided_at": rfc3339(decision.decided_at),
        "digest": decision.digest,
    });
    for (name, value) in [
        ("input", decision.input.clone()),
        ("note", decision.note.clone().map(Value::from)),
        ("reason", decision.reason.clone().map(Value::from)),
        ("delegation", decision.delegation.clone().map(Value::from)),
    ] {
        if let Some(value) = value {
            shown[name] = value;
        }
    }
    if decision.expired {
        shown["expired"] = json!(true);
    }
    if receipts && let Some(receipt) = &decision.receipt {
        shown["receipt"] = json!(receipt);
    }
    shown
}

/// The agent's execution record of a call released to it: who claimed it and when, and how
/// it ended once reported.
fn executed((start, end): &AgentExecution) -> Value {
    let mut shown = json!({
        "status": end.as_ref().map_or(ExecStatus::Started, |e| e.status),
        "attempt": start.attempt,
        "reported_by": start.reported_by,
        "started_at": rfc3339(start.at),
    });
    if let Some(end) = end {
        shown["finished_at"] = json!(rfc3339(end.at));
        if let Some(result) = &end.result {
            shown["result"] = result.clone();
        }
        if let Some(error) = &end.error {
            shown["error"] = json!(error);
        }
    }
    shown
}

/// The decision that counts for the call: the latest on it or on the call it became when it
/// was held again after a policy change, other than the closing of a superseded one.
fn latest<'a>(decisions: &'a HashMap<String, Decision>, call_id: &str) -> Option<&'a Decision> {
    decisions
        .values()
        .filter(|d| same_call(&d.call_id, call_id) && !d.superseded)
        .max_by_key(|d| d.decided_at)
}

/// Whether `id` names the call `call_id`, or the call it became when held again (`.r2`…).
fn same_call(id: &str, call_id: &str) -> bool {
    id == call_id
        || id
            .strip_prefix(call_id)
            .and_then(|rest| rest.strip_prefix(".r"))
            .is_some_and(|n| n.parse::<u32>().is_ok())
}

/// The tool and input the agent asked to call, as its run keeps them.
fn asked_call(run: &Run) -> Option<(String, Value)> {
    DoorCall::of_run(&run.metadata)
        .ok()
        .map(|call| (call.tool, call.input))
}

/// The call's result: its outcome, text and whether it is an error.
fn result(run: &Run) -> Option<(CallOutcome, &str, bool)> {
    let (content, is_error) = one_call::result(&run.messages)?;
    let outcome = one_call::outcome(&run.messages).unwrap_or(match is_error {
        true => CallOutcome::Failed,
        false => CallOutcome::Executed,
    });
    Some((outcome, content, is_error))
}
