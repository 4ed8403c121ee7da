//! What becomes of each call of a turn: sorted by the policy (refused outright, held for a
//! person, or run at once), and, once the held ones are decided, turned into the results the
//! model is told, in plain words.

use super::{Engine, StepError, results_message};
use crate::agents::RunnableAgent;
use crate::policy::Gate;
use crate::tools::ToolCall;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::digest::call_digest;
use countersign_model::edit;
use countersign_model::run::{Action, CallOutcome, CallResult, Decision, HeldCall, Run, TurnCall};
use countersign_store::StoreError;
use serde_json::Value;
use std::collections::HashMap;

impl Engine {
    /// Sorts one turn's calls: refused outright (unknown tool, bad input), held for a
    /// person, or run now. The free ones run together; their results are kept in order.
    pub(super) async fn gate_and_run(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        calls: Vec<TurnCall>,
    ) -> Result<Vec<TurnCall>, StepError> {
        let mut held = Vec::with_capacity(calls.len());
        let mut free = Vec::new();
        // Deadlines are on Redis's clock, which the sweepers and the decision script read.
        let mut now = None;
        for mut call in calls {
            match agent.agent.tool(&call.tool) {
                None => {
                    call.result = Some(CallResult::failed(format!(
                        "There is no tool named {:?}.",
                        call.tool
                    )));
                }
                Some(tool) => match agent.agent.validate_input(&tool.name, &call.input) {
                    Err(errors) => {
                        call.result = Some(CallResult::failed(format!(
                            "The input does not match the schema of {}: {}",
                            tool.name,
                            errors.join("; ")
                        )));
                    }
                    Ok(()) => match agent.policies[&tool.name].gate(&call.input, &run.metadata) {
                        Gate::Run => free.push((held.len(), tool)),
                        Gate::Ask { reason, summary } => {
                            let now = match now {
                                Some(now) => now,
                                None => *now.insert(self.store.time_ms().await?),
                            };
                            let deadline = now + self.approval_timeout(tool).as_millis() as i64;
                            let reviewers = tool.reviewers();
                            let policy_version = tool.policy_version();
                            call.held = Some(HeldCall {
                                call_id: call.call_id.clone(),
                                tool: tool.name.clone(),
                                digest: call_digest(
                                    run.run_id.as_str(),
                                    &tool.name,
                                    &call.input,
                                    &policy_version,
                                ),
                                policy_version,
                                input: call.input.clone(),
                                summary,
                                reason,
                                deciders: self.people.resolve(&reviewers.approvers),
                                reviewers,
                                deadline: Some(deadline),
                                remind_at: tool
                                    .remind_before()
                                    .map(|before| deadline - before.as_millis() as i64)
                                    .filter(|at| *at > now),
                                escalated: false,
                            });
                        }
                    },
                },
            }
            held.push(call);
        }
        let results = futures::future::join_all(free.iter().map(|&(i, tool)| {
            let call = &held[i];
            self.execute(
                agent,
                tool,
                ToolCall {
                    run: &run.run_id,
                    turn: run.turns,
                    call_id: &call.call_id,
                    input: &call.input,
                    receipt: None,
                },
                CallOutcome::Executed,
            )
        }))
        .await;
        for ((i, _), result) in free.iter().zip(results) {
            held[*i].result = Some(result?);
        }
        Ok(held)
    }

    /// Turns each decision of the held turn into a result and appends the turn's results;
    /// returns the audit entries of the calls it ran or refused, and when the last decision
    /// was made (ms).
    pub(super) async fn resume_turn(
        &self,
        run: &mut Run,
        agent: &RunnableAgent,
        decisions: &HashMap<String, Decision>,
    ) -> Result<(Vec<AuditEntry>, i64), StepError> {
        let last_decided = decisions.values().map(|d| d.decided_at).max().unwrap_or(0);
        let mut held = std::mem::take(&mut run.paused_turn);
        let mut executed = Vec::new();
        for call in held.iter_mut().filter(|c| c.result.is_none()) {
            let Some(decision) = decisions.get(&call.call_id) else {
                return Err(
                    StoreError::Corrupt(format!("call {} has no decision", call.call_id)).into(),
                );
            };
            let Some(tool) = agent.agent.tool(&call.tool) else {
                call.result = Some(CallResult::failed(format!(
                    "The tool {} no longer exists.",
                    call.tool
                )));
                continue;
            };
            let by = &decision.decided_by;
            let result = match decision.action {
                _ if decision.expired => CallResult {
                    outcome: CallOutcome::Expired,
                    is_error: true,
                    content: format!(
                        "Nobody decided on this call before its deadline ({}), so it did not run. This is not a rejection: no one reviewed it.",
                        chrono::DateTime::from_timestamp_millis(decision.decided_at)
                            .unwrap_or_default()
                            .to_rfc3339()
                    ),
                    images: Vec::new(),
                },
                Action::Approve => {
                    self.execute(
                        agent,
                        tool,
                        ToolCall {
                            run: &run.run_id,
                            turn: run.turns,
                            call_id: &call.call_id,
                            input: &call.input,
                            receipt: decision.receipt.as_deref(),
                        },
                        CallOutcome::Approved,
                    )
                    .await?
                }
                Action::Reject => CallResult {
                    outcome: CallOutcome::Rejected,
                    is_error: true,
                    content: format!(
                        "A reviewer ({by}) rejected this call, so it did not run. Their reason: {}",
                        decision.reason.as_deref().unwrap_or("none given")
                    ),
                    images: Vec::new(),
                },
                Action::Edit => {
                    let input = decision.input.clone().unwrap_or(Value::Null);
                    let mut result = match agent.agent.validate_input(&tool.name, &input) {
                        Err(errors) => CallResult::failed(format!(
                            "The reviewer's edited input does not match the schema: {}",
                            errors.join("; ")
                        )),
                        Ok(()) => {
                            self.execute(
                                agent,
                                tool,
                                ToolCall {
                                    run: &run.run_id,
                                    turn: run.turns,
                                    call_id: &call.call_id,
                                    input: &input,
                                    receipt: decision.receipt.as_deref(),
                                },
                                CallOutcome::Edited,
                            )
                            .await?
                        }
                    };
                    result.content = format!(
                        "A reviewer ({by}) edited this call before it ran.\nThey changed (field: yours → theirs):\n{}\nIt ran with: {}\nTheir note: {}\nResult: {}",
                        edit::described(&edit::changes(&call.input, &input)),
                        input,
                        decision.note.as_deref().unwrap_or("none given"),
                        result.content
                    );
                    result
                }
            };
            if let Some(pending) = &call.held {
                let detail = serde_json::json!({
                    "action": decision.action, "decided_by": by,
                    "outcome": result.outcome, "is_error": result.is_error,
                    // The countersignature the tool was sent, kept with the trail.
                    "receipt": decision.receipt,
                });
                executed.push(self.entry(run, AuditKind::Executed, Some(pending), detail));
            }
            call.result = Some(result);
        }
        let resolved = held.iter().filter(|c| c.held.is_some()).count();
        self.metrics.calls("resolved", resolved);
        run.messages.push(results_message(&held));
        Ok((executed, last_decided))
    }
}
