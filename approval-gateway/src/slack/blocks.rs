//! Slack Block Kit for approval requests: the message with its buttons, the message once
//! decided (buttons gone), and the reject and edit modals. Buttons and modals carry the run,
//! call and digest the reviewer was shown, so the decision is bound to exactly that.

use countersign_shared::events::Evidence;
use countersign_shared::run::PendingCall;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What a button or modal is about.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Target {
    #[serde(rename = "r")]
    pub run_id: String,
    #[serde(rename = "c")]
    pub call_id: String,
    #[serde(rename = "d")]
    pub digest: String,
}

/// Slack's limit for a section's text.
const MAX_TEXT: usize = 2900;

fn clip(text: &str) -> String {
    if text.chars().count() <= MAX_TEXT {
        text.to_string()
    } else {
        text.chars().take(MAX_TEXT).collect::<String>() + "…"
    }
}

fn section(text: String) -> Value {
    json!({"type": "section", "text": {"type": "mrkdwn", "text": clip(&text)}})
}

pub struct Request<'a> {
    pub channel: &'a str,
    pub agent: &'a str,
    pub requested_by: Option<&'a str>,
    pub text: &'a str,
    pub call: &'a PendingCall,
    pub evidence: &'a [Evidence],
    pub target: &'a Target,
}

pub fn request_message(r: &Request) -> Value {
    let value = serde_json::to_string(r.target).expect("targets serialize");
    let mut blocks = vec![
        section(format!("*Approval needed:* {}", r.call.summary)),
        section(format!("*Why:* {}", r.call.reason)),
    ];
    if !r.text.is_empty() {
        blocks.push(section(format!("*The agent said:* {}", r.text)));
    }
    for e in r.evidence {
        let mark = if e.is_error { " (failed)" } else { "" };
        blocks.push(section(format!(
            "*Evidence — {}{mark}:* ```{}```",
            e.tool, e.content
        )));
    }
    let approvers = if r.call.reviewers.approvers.is_empty() {
        "any reviewer".to_string()
    } else {
        r.call.reviewers.approvers.join(", ")
    };
    blocks.push(
        json!({"type": "context", "elements": [{"type": "mrkdwn", "text": format!(
            "Agent {} · run {} · requested by {} · approvers: {} · no deadline",
            r.agent, r.target.run_id, r.requested_by.unwrap_or("unknown"), approvers
        )}]}),
    );
    blocks.push(
        json!({"type": "actions", "block_id": "decision", "elements": [
            {"type": "button", "action_id": "approve", "style": "primary",
             "text": {"type": "plain_text", "text": "Approve"}, "value": value},
            {"type": "button", "action_id": "reject", "style": "danger",
             "text": {"type": "plain_text", "text": "Reject"}, "value": value},
            {"type": "button", "action_id": "edit",
             "text": {"type": "plain_text", "text": "Edit"}, "value": value},
        ]}),
    );
    json!({
        "channel": r.channel,
        "text": format!("Approval needed: {}", r.call.summary),
        "blocks": blocks,
    })
}

/// When the call expires, as people read it.
pub fn deadline(call: &PendingCall) -> String {
    match call
        .deadline
        .and_then(chrono::DateTime::from_timestamp_millis)
    {
        Some(at) => format!("decide by {}", at.format("%Y-%m-%d %H:%M:%S UTC")),
        None => "no deadline".into(),
    }
}

/// The message once decided: what was asked, who decided what, and no buttons.
pub fn decided_message(channel: &str, ts: &str, summary: &str, outcome: &str) -> Value {
    json!({
        "channel": channel,
        "ts": ts,
        "text": format!("{summary}: {outcome}"),
        "blocks": [section(format!("*{summary}*")), section(outcome.to_string())],
    })
}

pub const REJECT: &str = "reject";
pub const EDIT: &str = "edit";
/// Block and action ids of the modals' inputs.
pub const REASON: &str = "reason";
pub const INPUT: &str = "input";
pub const NOTE: &str = "note";

fn input_block(id: &str, label: &str, multiline: bool, initial: Option<String>) -> Value {
    let mut element = json!({"type": "plain_text_input", "action_id": id, "multiline": multiline});
    if let Some(initial) = initial {
        element["initial_value"] = initial.into();
    }
    json!({"type": "input", "block_id": id, "label": {"type": "plain_text", "text": label}, "element": element})
}

fn modal(
    trigger_id: &str,
    callback: &str,
    title: &str,
    submit: &str,
    target: &Target,
    blocks: Vec<Value>,
) -> Value {
    json!({"trigger_id": trigger_id, "view": {
        "type": "modal", "callback_id": callback,
        "title": {"type": "plain_text", "text": title},
        "submit": {"type": "plain_text", "text": submit},
        "close": {"type": "plain_text", "text": "Cancel"},
        "private_metadata": serde_json::to_string(target).expect("targets serialize"),
        "blocks": blocks,
    }})
}

pub fn reject_modal(trigger_id: &str, target: &Target) -> Value {
    let reason = input_block(REASON, "Why? The agent is told.", true, None);
    modal(
        trigger_id,
        REJECT,
        "Reject request",
        "Reject",
        target,
        vec![reason],
    )
}

pub fn edit_modal(trigger_id: &str, target: &Target, input: &Value) -> Value {
    let pretty = serde_json::to_string_pretty(input).unwrap_or_default();
    let blocks = vec![
        input_block(INPUT, "Arguments (JSON)", true, Some(pretty)),
        input_block(NOTE, "Note for the agent", true, None),
    ];
    modal(
        trigger_id,
        EDIT,
        "Edit request",
        "Approve edited",
        target,
        blocks,
    )
}
