//! A call decided (or closed while waiting) under a policy that has changed since is checked
//! again under the policy now, before anything runs: the version a call was held under (its
//! tool's schema and policy, and an MCP tool's definition) is part of its digest, so a
//! decision never covers a call under a policy nobody checked it against.

use super::hold::Asked;
use super::{Changes, Engine, StepError};
use crate::agents::{Agents, RunnableAgent};
use countersign_model::agent::ToolDef;
use countersign_model::audit::AuditKind;
use countersign_model::events::Event;
use countersign_model::policy::Gate;
use countersign_model::run::{CallResult, Decision, HeldCall, Recheck, Run, RunStatus, TurnCall};
use countersign_model::stage::Stage;
use countersign_model::window::Share;
use countersign_runtime::names::msg_id;
use countersign_store::{Announcement, Closing, DecideOutcome, StoreError};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// What the policy now says of a decided call.
pub(super) enum Verdict<'a> {
    /// Its policy has not changed (or it already started): it goes on as decided.
    Unchanged(&'a ToolDef),
    /// The policy changed and still lets it run.
    Released(&'a ToolDef),
    /// Its tool is gone or its input no longer fits: the model is told, nothing runs.
    Refused(CallResult),
    /// The policy changed and asks a person: the call as held again, under a new id.
    Reheld(Box<TurnCall>),
}

impl Engine {
    /// Checks `call` (held as `call.held`, decided as `decision`, none when it was closed
    /// while waiting, and about to run with `input`) against its tool's policy now. Anything
    /// but `Unchanged` is audited (`policy_changed`) and announced (`run.policy_changed`)
    /// through `unsaved`.
    pub(super) async fn recheck<'a>(
        &self,
        run: &Run,
        agent: &'a RunnableAgent,
        call: &TurnCall,
        decision: Option<&Decision>,
        input: &Value,
        unsaved: &mut Changes,
    ) -> Result<Verdict<'a>, StepError> {
        let pending = call.held.as_ref().expect("a held call");
        let tool = agent.agent.tool(&pending.tool);
        let version = tool.map(ToolDef::policy_version).unwrap_or_default();
        // A call closed while it waited is always checked: nobody decided it.
        if let Some(tool) = tool
            && decision.is_some()
        {
            if version == pending.policy_version {
                return Ok(Verdict::Unchanged(tool));
            }
            // A call an attempt already started may have had its effect: it is finished as
            // decided (its recorded result, or reported unknown), never asked about again.
            if self.store.exec_started(&run.run_id, &call.call_id).await? {
                return Ok(Verdict::Unchanged(tool));
            }
        }
        let refused = |why: String| {
            Verdict::Refused(CallResult::failed(format!(
                "The policy of {} changed while this call waited, and {why}, so it did not run.",
                pending.tool
            )))
        };
        let verdict = match tool {
            None => refused(format!("the tool {} no longer exists", pending.tool)),
            Some(tool) => match agent.agent.validate_input(&tool.name, input) {
                Err(errors) => refused(format!(
                    "its input no longer fits the tool's schema: {}",
                    errors.join("; ")
                )),
                Ok(()) => match self.resorted(run, agent, call, input).await? {
                    (Gate::Run, _) => Verdict::Released(tool),
                    (Gate::Ask { reason, summary }, shares) => {
                        let asked = (input, reason, summary, shares);
                        Verdict::Reheld(Box::new(
                            self.held_again(run, tool, call, decision, asked).await?,
                        ))
                    }
                },
            },
        };
        self.record_recheck(run, pending, version, &verdict, unsaved);
        Ok(verdict)
    }

    /// The policy now on `call` about to run with `input`: its shares of the policy's windows
    /// now are added under the id it was counted under, and those of windows it no longer
    /// counts in given back.
    async fn resorted(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        call: &TurnCall,
        input: &Value,
    ) -> Result<(Gate, Vec<Share>), StepError> {
        let pending = call.held.as_ref().expect("a held call");
        let (gate, shares) = self
            .sort_call(run, agent, &pending.tool, &call.call_id, input)
            .await?;
        self.give_back(&super::windows::not_among(&pending.windows, &shares))
            .await?;
        Ok((gate, shares))
    }

    /// `call` held again under a new id, as the policy now asks (`asked`: the input, the
    /// policy's reason and summary), bound to the decision it had (`decision`) for the record.
    async fn held_again(
        &self,
        run: &Run,
        tool: &ToolDef,
        call: &TurnCall,
        decision: Option<&Decision>,
        (input, reason, summary, shares): (&Value, String, String, Vec<Share>),
    ) -> Result<TurnCall, StepError> {
        let pending = call.held.as_ref().expect("a held call");
        let mut again = call.clone();
        again.held_again();
        again.input = input.clone();
        let now = self.store.time_ms().await?;
        let asked = Asked {
            call_id: &again.call_id,
            input,
            reason,
            summary,
            shares,
            // Under a changed policy, every stage is asked again.
            stage: Stage::first(tool.approval.stages()),
        };
        // A call closed while it waited keeps the time it had left, at most.
        let not_after = if decision.is_none() {
            pending.deadline
        } else {
            None
        };
        let mut held = self.hold(run, tool, asked, now, not_after);
        held.recheck = Some(Recheck {
            call_id: pending.call_id.clone(),
            digest: pending.digest.clone(),
            policy_version: pending.policy_version.clone(),
            decision: decision.cloned(),
        });
        again.held = Some(held);
        Ok(again)
    }

    /// Audits (`policy_changed`) and announces (`run.policy_changed`) what the re-check of
    /// `pending`, now under policy `version`, found, through `unsaved`.
    fn record_recheck(
        &self,
        run: &Run,
        pending: &HeldCall,
        version: String,
        verdict: &Verdict<'_>,
        unsaved: &mut Changes,
    ) {
        let (outcome, new_call, detail) = match verdict {
            Verdict::Unchanged(_) | Verdict::Released(_) => ("released", None, String::new()),
            Verdict::Refused(result) => ("refused", None, result.content.clone()),
            Verdict::Reheld(again) => ("reheld", again.held.as_ref(), String::new()),
        };
        let audit = serde_json::json!({
            "tool": pending.tool, "outcome": outcome, "detail": detail,
            "from_version": pending.policy_version, "to_version": version,
            "new_call_id": new_call.map(|h| &h.call_id),
            "new_digest": new_call.map(|h| &h.digest),
        });
        unsaved
            .audits
            .push(self.entry(run, AuditKind::PolicyChanged, Some(pending), audit));
        let event = Event::RunPolicyChanged {
            run_id: run.run_id.clone(),
            call_id: pending.call_id.clone(),
            tool: pending.tool.clone(),
            outcome: outcome.to_string(),
            from_version: pending.policy_version.clone(),
            to_version: version,
            new_call_id: new_call.map(|h| h.call_id.clone()),
            detail,
            channels: pending.reviewers.channels.clone(),
        };
        unsaved.announce.push(Announcement::new(
            msg_id::policy_changed(&run.run_id, &pending.call_id),
            self.bus.names.run_policy_changed(&run.run_id),
            event,
        ));
        self.metrics.policy_recheck(outcome);
        tracing::info!(call_id = %pending.call_id, outcome, "the call's policy changed; checked again");
    }
}

/// Who a call closed because its policy changed is recorded as decided by.
const POLICY_CHANGE: &str = "policy change";
/// How long the mark that an agent version's waiting calls were checked stays: a worker
/// starting under a version already checked does not read every waiting run again.
const RECHECK_LEASE: Duration = Duration::from_secs(7 * 86_400);

impl Engine {
    /// Closes every call still waiting under a version of its tool's policy that `agents`
    /// (the set just loaded) no longer has, as `superseded`, so its run resumes and
    /// [`Engine::recheck`] settles it under the policy now: released, held again (the
    /// channels are told of both) or refused. Calls already decided are checked when they are
    /// about to run. One worker does this per agent version; returns how many calls it
    /// closed. A set replaced by another while it is checked stops there: the newer set is
    /// checked next, and a call it would not have closed stays as it is (a call decided
    /// meanwhile is checked when it is about to run, under the policy then).
    pub(crate) async fn recheck_waiting(&self, agents: &Agents) -> Result<usize, StoreError> {
        let mut mine = HashMap::new();
        for agent in agents.iter() {
            let (name, version) = (&agent.agent.def.name, &agent.agent.version);
            let owner = &self.settings.owner;
            if self
                .store
                .take_recheck(name, version, owner, RECHECK_LEASE)
                .await?
            {
                mine.insert(name.as_str(), agent);
            }
        }
        let mut closed = 0;
        if mine.is_empty() {
            return Ok(closed);
        }
        for id in self.store.all_awaiting().await? {
            if !std::ptr::eq(Arc::as_ptr(&self.agents()), agents) {
                tracing::info!(
                    closed,
                    "the agents changed again while their waiting calls were checked; the newer ones are checked next"
                );
                return Ok(closed);
            }
            let Some(run) = self.store.load(&id).await? else {
                continue;
            };
            let Some(agent) = mine.get(run.agent.as_str()) else {
                continue;
            };
            if run.status != RunStatus::AwaitingApproval {
                continue;
            }
            for held in run.held_calls() {
                let now = agent.agent.tool(&held.tool).map(ToolDef::policy_version);
                if now.as_deref() != Some(held.policy_version.as_str())
                    && self.supersede(&run, held, &now.unwrap_or_default()).await?
                {
                    closed += 1;
                }
            }
        }
        Ok(closed)
    }

    /// Closes one waiting call whose policy changed; whether it was still waiting.
    async fn supersede(
        &self,
        run: &Run,
        held: &HeldCall,
        to_version: &str,
    ) -> Result<bool, StoreError> {
        let reason = format!("the policy of {} changed while the call waited", held.tool);
        let detail = serde_json::json!({
            "tool": held.tool, "outcome": "superseded",
            "from_version": held.policy_version, "to_version": to_version,
        });
        let entry = self.entry(run, AuditKind::PolicyChanged, Some(held), detail);
        let closed = self
            .close_unattended(
                &run.run_id,
                (&held.call_id, &held.digest),
                (POLICY_CHANGE, &reason),
                entry,
                Closing::Policy,
            )
            .await?;
        match closed {
            DecideOutcome::Decided { queued, .. } => {
                self.metrics.policy_recheck("superseded");
                self.publish(&run.run_id, &queued).await;
                Ok(true)
            }
            // Decided first, or the run moved on: it is checked when it runs, if at all.
            _ => Ok(false),
        }
    }
}
