//! What becomes of each call of a turn: sorted by the policy (refused outright, held for a
//! person, or run at once), and, once the held ones are decided, turned into the results the
//! model is told, in plain words.

use super::hold::Asked;
use super::recheck::Verdict;
use super::{Changes, Engine, Resumed, StepError, results_message};
use crate::agents::RunnableAgent;
use crate::tools::{self, ToolCall};
use countersign_model::agent::ToolDef;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::digest::{MAX_EXACT_INTEGER, inexact_integer};
use countersign_model::edit;
use countersign_model::live::{Disposition, LiveEvent};
use countersign_model::policy::Gate;
use countersign_model::run::{Action, CallOutcome, CallResult, Decision, Run, TurnCall};
use countersign_model::stage::Stage;
use countersign_store::StoreError;
use serde_json::Value;
use std::collections::HashMap;
use tracing::warn;

/// The most input, in bytes of JSON, the calls held in one turn may carry together: what
/// waits is announced whole to the channels, within NATS's payload limit. A call that would
/// go past it is not held: the model is told it failed, and why.
pub(super) const MAX_HELD_INPUT: usize = 256 * 1024;

/// Why a call the policy would hold cannot be, in the words the model is told; `held` is
/// the input the turn's calls held so far carry, in bytes.
fn unholdable(tool: &str, input: &Value, held: usize) -> Option<String> {
    if let Some((at, n)) = inexact_integer(input) {
        return Some(format!(
            "This {tool} call was not run and not sent for approval: {at} is the integer {n}, past ±{MAX_EXACT_INTEGER} (2^53 − 1), and the digest a reviewer approves reads numbers as IEEE doubles, so it would not bind that exact number. Send such numbers as strings."
        ));
    }
    let size = serde_json::to_vec(input).map_or(usize::MAX, |v| v.len());
    if held.saturating_add(size) > MAX_HELD_INPUT {
        return Some(format!(
            "This {tool} call was not run and not sent for approval: its input is {size} bytes, and the calls of one turn that need approval may carry at most {MAX_HELD_INPUT} bytes of input together ({held} are held already). Send less, or split the work over several turns."
        ));
    }
    None
}

impl Engine {
    /// Sorts one turn's calls: refused outright (unknown tool, bad input), held for a
    /// person, or to run now (neither a result nor held). What a shadow policy would have done
    /// differently goes into `unsaved`.
    pub(super) async fn gate(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        calls: Vec<TurnCall>,
        unsaved: &mut Changes,
    ) -> Result<Vec<TurnCall>, StepError> {
        let mut turn = Vec::with_capacity(calls.len());
        // Deadlines are on Redis's clock, which the sweepers and the decision script read.
        let mut now = None;
        let mut held_input = 0;
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
                    Ok(()) => {
                        let (gate, shares) = self
                            .sort_call(run, agent, &tool.name, &call.call_id, &call.input)
                            .await?;
                        self.shadow(run, agent, tool, &call, &gate, unsaved);
                        let ask = match gate {
                            Gate::Ask { reason, summary } => Some((reason, summary)),
                            _ => None,
                        };
                        let refused = ask
                            .as_ref()
                            .and_then(|_| unholdable(&tool.name, &call.input, held_input));
                        if let Some(why) = refused {
                            warn!(call_id = %call.call_id, tool = %tool.name, "a call the policy holds cannot be held; the model is told");
                            self.give_back(&shares).await?;
                            call.result = Some(CallResult::failed(why));
                        } else if let Some((reason, summary)) = ask {
                            held_input += serde_json::to_vec(&call.input).map_or(0, |v| v.len());
                            let now = match now {
                                Some(now) => now,
                                None => *now.insert(self.store.time_ms().await?),
                            };
                            let asked = Asked {
                                call_id: &call.call_id,
                                input: &call.input,
                                reason,
                                summary,
                                shares,
                                stage: Stage::first(tool.approval.stages()),
                            };
                            call.held = Some(self.hold(run, tool, asked, now, None));
                        }
                    }
                },
            }
            turn.push(call);
        }
        for call in &turn {
            let disposition = match (&call.result, &call.held) {
                (Some(_), _) => Disposition::Refused,
                (None, Some(_)) => Disposition::Held,
                (None, None) => Disposition::Run,
            };
            let event = LiveEvent::call(&run.run_id, run.turns, call, disposition);
            self.live(&run.run_id, event).await;
        }
        Ok(turn)
    }

    /// Runs the calls of `turn` that need nobody and have no result yet, together, each
    /// through its execution record (`marked` started already, by the save that stored the
    /// turn): a worker that takes a stored turn over gets the result an earlier attempt
    /// recorded, or `unknown` for a call it started and never finished. Each execution's audit
    /// entry goes into `unsaved`.
    pub(super) async fn run_free(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        turn: &mut [TurnCall],
        marked: bool,
        unsaved: &mut Changes,
    ) -> Result<(), StepError> {
        let free: Vec<(usize, &ToolDef)> = turn
            .iter()
            .enumerate()
            .filter(|(_, c)| c.runs_now())
            .filter_map(|(i, c)| Some((i, agent.agent.tool(&c.tool)?)))
            .collect();
        let results = futures::future::join_all(free.iter().map(|&(i, tool)| {
            let call = &turn[i];
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
                marked,
            )
        }))
        .await;
        // Every call that ran is recorded before an error (a cancel refusing one) goes up:
        // the execution records keep them for whoever finishes the run.
        let mut refused = None;
        for ((i, _), result) in free.iter().zip(results) {
            match result {
                Ok(result) => {
                    let call = &mut turn[*i];
                    unsaved.audits.push(self.executed(run, call, None, &result));
                    let event = LiveEvent::result(&run.run_id, run.turns, call, &result);
                    self.live(&run.run_id, event).await;
                    call.result = Some(result);
                }
                Err(e) => refused = refused.or(Some(e)),
            }
        }
        match refused {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// The audit entry of a call that ran (or whose outcome was found unknown), with the
    /// decision it ran under, if it was held.
    pub(super) fn executed(
        &self,
        run: &Run,
        call: &TurnCall,
        decision: Option<&Decision>,
        result: &CallResult,
    ) -> AuditEntry {
        let detail = serde_json::json!({
            "tool": call.tool,
            "action": decision.map(|d| d.action), "decided_by": decision.map(|d| &d.decided_by),
            "outcome": result.outcome, "is_error": result.is_error,
            // The countersignature the tool was sent, kept with the trail.
            "receipt": decision.and_then(|d| d.receipt.as_ref()),
        });
        let mut entry = self.entry(run, AuditKind::Executed, call.held.as_ref(), detail);
        entry.call_id = Some(call.call_id.clone());
        entry
    }

    /// Turns each decision of the held turn into a result, the audit entries of the calls it
    /// ran or refused going into `unsaved`. A call decided under a policy that changed since
    /// is checked again first (see [`Engine::recheck`]). When every call has its result, the
    /// turn's results are appended and the answer is `Resumed::Turn` with when the last
    /// decision was made (ms); when a call is held again, the turn stays paused on it.
    pub(super) async fn resume_turn(
        &self,
        run: &mut Run,
        agent: &RunnableAgent,
        decisions: &HashMap<String, Decision>,
        unsaved: &mut Changes,
    ) -> Result<Resumed, StepError> {
        let last_decided = decisions.values().map(|d| d.decided_at).max().unwrap_or(0);
        let mut held = std::mem::take(&mut run.paused_turn);
        let mut resolved = 0;
        for call in held.iter_mut().filter(|c| c.result.is_none()) {
            if call.held.is_none() {
                continue;
            }
            let Some(decision) = decisions.get(&call.call_id) else {
                return Err(
                    StoreError::Corrupt(format!("call {} has no decision", call.call_id)).into(),
                );
            };
            let runs_with = match decision.action {
                Action::Edit => decision.input.clone().unwrap_or(Value::Null),
                Action::Approve | Action::Reject => call.input.clone(),
            };
            let counted = call.held.as_ref().map_or(&[][..], |h| &h.windows);
            let result = match not_run(decision) {
                Some(result) => {
                    self.give_back(counted).await?;
                    result
                }
                None => {
                    // A call closed while it waited because its policy changed has no decision
                    // to run under: the policy now says.
                    let decided = (!decision.superseded).then_some(decision);
                    let checked = self
                        .recheck(run, agent, call, decided, &runs_with, unsaved)
                        .await?;
                    match checked {
                        Verdict::Unchanged(tool) | Verdict::Released(tool) => {
                            // A stage before the last passes the call on to the next.
                            let next = self.next_stage(run, agent, tool, call, decided, &runs_with);
                            if let Some(again) = next.await? {
                                *call = again;
                                continue;
                            }
                            self.run_decided(run, agent, tool, call, decided, &runs_with)
                                .await?
                        }
                        Verdict::Refused(result) => {
                            self.give_back(counted).await?;
                            result
                        }
                        Verdict::Reheld(again) => {
                            *call = *again;
                            continue;
                        }
                    }
                }
            };
            unsaved
                .audits
                .push(self.executed(run, call, Some(decision), &result));
            let event = LiveEvent::result(&run.run_id, run.turns, call, &result);
            self.live(&run.run_id, event).await;
            call.result = Some(result);
            resolved += 1;
        }
        self.metrics.calls("resolved", resolved);
        if held.iter().any(|c| c.result.is_none()) {
            // Paused again on the calls held anew: those decided are now what the reviewers
            // see beside them, like the calls of a turn that ran at once.
            for call in held.iter_mut().filter(|c| c.result.is_some()) {
                call.held = None;
            }
            run.paused_turn = held;
            return Ok(Resumed::HeldAgain);
        }
        run.messages.push(results_message(&held));
        Ok(Resumed::Turn { last_decided })
    }

    /// Runs an approved or edited call (an edit as the reviewer left it, `runs_with`), or,
    /// without a decision, one its changed policy now lets through, and says what happened
    /// in the words the model is told.
    async fn run_decided(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        tool: &ToolDef,
        call: &TurnCall,
        decision: Option<&Decision>,
        runs_with: &Value,
    ) -> Result<CallResult, StepError> {
        let tool_call = ToolCall {
            run: &run.run_id,
            turn: run.turns,
            call_id: &call.call_id,
            input: runs_with,
            receipt: decision.and_then(|d| d.receipt.as_deref()),
        };
        let outcome = match decision.map(|d| d.action) {
            None => CallOutcome::Executed,
            Some(Action::Edit) => CallOutcome::Edited,
            Some(_) => CallOutcome::Approved,
        };
        // It counts in its windows from now, with what it runs with.
        let counted = call.held.as_ref().map_or(&[][..], |h| &h.windows);
        self.count_run(run, agent, (&tool.name, &call.call_id), runs_with, counted)
            .await?;
        let Some(decision) = decision.filter(|d| d.action == Action::Edit) else {
            return Ok(self.execute(agent, tool, tool_call, outcome, false).await?);
        };
        let mut result = match agent.agent.validate_input(&tool.name, runs_with) {
            Err(errors) => CallResult::failed(format!(
                "The reviewer's edited input does not match the schema: {}",
                errors.join("; ")
            )),
            Ok(()) => self.execute(agent, tool, tool_call, outcome, false).await?,
        };
        let edited = format!(
            "A reviewer ({}) edited this call before it ran.\nThey changed (field: yours → theirs):\n{}\nIt ran with: {}\nTheir note: {}",
            decision.decided_by,
            edit::described(&edit::changes(&call.input, runs_with)),
            runs_with,
            decision.note.as_deref().unwrap_or("none given"),
        );
        // An MCP proxy's client reads the same, before the server's own content.
        tools::mcp::told_first(&mut result.mcp, &edited);
        result.content = format!("{edited}\nResult: {}", result.content);
        Ok(result)
    }
}

/// The result of a call whose decision lets it not run: expired with nobody deciding it, or
/// rejected (a rejection stands whatever the policy says now); None for a call that may run.
fn not_run(decision: &Decision) -> Option<CallResult> {
    if decision.expired {
        return Some(CallResult {
            outcome: CallOutcome::Expired,
            is_error: true,
            content: format!(
                "Nobody decided on this call before its deadline ({}), so it did not run. This is not a rejection: no one reviewed it.",
                chrono::DateTime::from_timestamp_millis(decision.decided_at)
                    .unwrap_or_default()
                    .to_rfc3339()
            ),
            images: Vec::new(),
            mcp: None,
        });
    }
    (decision.action == Action::Reject && !decision.superseded).then(|| CallResult {
        outcome: CallOutcome::Rejected,
        is_error: true,
        content: format!(
            "A reviewer ({}) rejected this call, so it did not run. Their reason: {}",
            decision.decided_by,
            decision.reason.as_deref().unwrap_or("none given")
        ),
        images: Vec::new(),
        mcp: None,
    })
}
