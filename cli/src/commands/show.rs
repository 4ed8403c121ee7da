//! `countersign show RUN`: the request as a reviewer needs it to decide: the agent's words,
//! and for each call of the paused turn its summary, the policy's reason, the exact input,
//! the deadline, the digest to quote, and its decision once there is one.

use crate::client::Gateway;
use crate::error::CliError;
use crate::render::{clip, fields, indent, moment, print_json, time_left};
use crate::view::{HeldView, RunView, read};
use countersign_model::run::{Action, Block, CallOutcome, Decision, Message};
use std::collections::HashMap;

pub(super) async fn run(gateway: &Gateway, run: &str, json: bool) -> Result<(), CliError> {
    let answer = gateway.get(gateway.url(&["v1", "runs", run])).await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let view: RunView = read(answer)?;
    print!("{}", overview(&view));
    let seen = evidence(&view.messages);
    if !seen.is_empty() {
        print!("\nThe agent had seen these results:\n{seen}");
    }
    if !view.text.trim().is_empty() {
        print!("\nThe agent said:\n{}", indent(view.text.trim()));
    }
    for call in &view.pending {
        print!("\n{}", call_block(&view.run_id, call));
    }
    Ok(())
}

/// The run's status and outcome, for `show` and `runs get`.
pub(super) fn overview(run: &RunView) -> String {
    let undecided = run.pending.iter().filter(|p| p.decision.is_none()).count();
    let waiting = if run.status == "awaiting_approval" && undecided > 0 {
        format!("{undecided} call(s) waiting for a decision")
    } else {
        String::new()
    };
    let cancel = run.cancel.as_ref().map_or_else(String::new, |c| {
        let why = c
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        format!("asked by {} at {}{why}", c.by, moment(c.at))
    });
    fields(&[
        ("run", run.run_id.clone()),
        ("agent", run.agent.clone()),
        ("status", run.status.clone()),
        ("requested by", run.requested_by.clone().unwrap_or_default()),
        ("asked", clip(&run.request(), 200)),
        ("started", run.created_at.clone()),
        ("updated", run.updated_at.clone()),
        ("waiting", waiting),
        ("cancel", cancel),
        ("failed calls", failed_count(run)),
        ("answer", run.answer.clone().unwrap_or_default()),
        ("error", run.error.clone().unwrap_or_default()),
    ]) + &failed_lines(run)
}

/// How many calls failed, the count [`overview`] shows; empty when none did.
fn failed_count(run: &RunView) -> String {
    match run.failed_calls.len() {
        0 => String::new(),
        n => format!("{n}, listed below (the agent was told)"),
    }
}

/// Each failed call in a line: its tool, id, and what it answered.
fn failed_lines(run: &RunView) -> String {
    run.failed_calls
        .iter()
        .map(|call| {
            let how = match call.outcome {
                CallOutcome::Unknown => "outcome unknown",
                _ => "failed",
            };
            let error = clip(&call.error, 200);
            format!("Call {} ({}) {how}: {error}\n", call.call_id, call.tool)
        })
        .collect()
}

fn call_block(run_id: &str, pending: &HeldView) -> String {
    let call = &pending.call;
    let deadline = call
        .deadline
        .map(|d| format!("{} ({})", moment(d), time_left(d)))
        .unwrap_or_default();
    // The people the policy's approvers were resolved to when the call was held, which is
    // what a decision is checked against.
    let approvers = match &call.deciders {
        _ if call.nobody_decides() => "nobody (above every approver's limit)".to_string(),
        Some(people) => people.join(", "),
        None => "anyone whose key may decide".to_string(),
    };
    let quorum = if call.reviewers.quorum > 1 {
        format!("{} must approve", call.reviewers.quorum)
    } else {
        String::new()
    };
    let decision = pending
        .decision
        .as_ref()
        .map_or_else(|| "none yet".to_string(), describe);
    let input = serde_json::to_string_pretty(&call.input).expect("JSON values print");
    let mut block = format!("Call {} ({}): {}\n", call.call_id, call.tool, call.summary);
    block.push_str(&indent(&fields(&[
        ("reason", call.reason.clone()),
        (
            "risk",
            call.risk.map(|r| r.told().to_string()).unwrap_or_default(),
        ),
        ("deadline", deadline),
        ("approvers", approvers),
        ("quorum", quorum),
        ("digest", call.digest.clone()),
        ("decision", decision),
    ])));
    block.push_str("  input:\n");
    block.push_str(&indent(&indent(&input)));
    if pending.decision.is_none() {
        block.push_str(&format!(
            "  decide: countersign approve {run_id} {} --digest {}\n",
            call.call_id, call.digest
        ));
    }
    block
}

/// A recorded decision in a line: who did what, when, and why.
fn describe(decision: &Decision) -> String {
    let when = moment(decision.decided_at);
    if decision.expired {
        return format!("expired at {when}: nobody decided in time, it did not run");
    }
    if decision.superseded {
        return format!("closed at {when}: its policy changed, so it is checked again");
    }
    let what = match decision.action {
        Action::Approve => "approved".to_string(),
        Action::Reject => format!(
            "rejected ({})",
            decision.reason.as_deref().unwrap_or_default()
        ),
        Action::Edit => format!(
            "edited to {} ({})",
            decision
                .input
                .as_ref()
                .map(std::string::ToString::to_string)
                .unwrap_or_default(),
            decision.note.as_deref().unwrap_or_default()
        ),
    };
    format!(
        "{what} by {} via {} at {when}",
        decision.decided_by, decision.door
    )
}

/// The evidence: every tool result in the conversation so far, after the call that gave it
/// (its tool and input), as the agent read it before the turn it is paused on.
fn evidence(messages: &[Message]) -> String {
    let mut calls = HashMap::new();
    let mut out = String::new();
    for block in messages.iter().flat_map(|m| &m.content) {
        match block {
            Block::ToolUse { id, name, input } => {
                calls.insert(id.as_str(), format!("{name} {input}"));
            }
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
                ..
            } => {
                let call = calls
                    .get(tool_use_id.as_str())
                    .map_or("a call", String::as_str);
                let failed = if *is_error { " (an error)" } else { "" };
                out.push_str(&format!("  {}{failed}:\n", clip(call, 120)));
                out.push_str(&format!("    {}\n", clip(content, 300)));
            }
            Block::Text { .. } => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_model::run::Speaker;
    use serde_json::json;

    #[test]
    fn evidence_is_each_result_after_the_call_that_gave_it() {
        let messages = vec![
            Message::user_text("Refund A-1001."),
            Message {
                role: Speaker::Assistant,
                content: vec![Block::ToolUse {
                    id: "c1".into(),
                    name: "get_order".into(),
                    input: json!({"order_id": "A-1001"}),
                }],
            },
            Message {
                role: Speaker::User,
                content: vec![Block::ToolResult {
                    tool_use_id: "c1".into(),
                    content: "{\"status\": \"delivered\"}".into(),
                    is_error: false,
                    outcome: None,
                    images: Vec::new(),
                    mcp: None,
                }],
            },
        ];
        assert_eq!(
            evidence(&messages),
            "  get_order {\"order_id\":\"A-1001\"}:\n    {\"status\": \"delivered\"}\n"
        );
        assert_eq!(evidence(&messages[..2]), "");
    }
}
