//! Holding a call for a person: its digest, deadline, reminder and who may decide (within
//! their authority limits, at its stage), under its tool's policy now. Both a turn's new calls (`calls`) and a decided call its changed policy
//! asks about again (`recheck`) are held this way.

use super::Engine;
use countersign_model::agent::ToolDef;
use countersign_model::digest::call_digest;
use countersign_model::limits;
use countersign_model::run::{HeldCall, Run};
use countersign_model::stage::Stage;
use countersign_model::window::Share;
use serde_json::Value;

/// A call the policy asks a person about, and what to tell them.
pub(super) struct Asked<'a> {
    pub call_id: &'a str,
    pub input: &'a Value,
    pub reason: String,
    pub summary: String,
    /// Its shares of the policy's windows, with their totals before it.
    pub shares: Vec<Share>,
    /// The stage it is held at, with a policy of stages.
    pub stage: Option<Stage>,
}

impl Engine {
    /// The call as held for a person under `tool`'s policy now; its deadline is the policy's
    /// timeout from `now`, but never after `not_after`.
    pub(super) fn hold(
        &self,
        run: &Run,
        tool: &ToolDef,
        asked: Asked<'_>,
        now: i64,
        not_after: Option<i64>,
    ) -> HeldCall {
        // With stages, the stage's approvers, quorum, channels and deadline.
        let number = asked.stage.as_ref().map_or(1, |s| s.number);
        let deadline = now + self.approval_timeout(tool, number).as_millis() as i64;
        let deadline = not_after.map_or(deadline, |limit| deadline.min(limit));
        let mut reviewers = tool.approval.reviewers_at(number);
        let mut reason = asked.reason;
        // Authority limits narrow who decides this input, and the reviewer is told why. A
        // call above every limit keeps an empty list of deciders: nobody, not anyone.
        let routed = tool
            .approval
            .limits()
            .and_then(|limits| limits::route(limits, &reviewers, asked.input));
        let deciders = match routed {
            Some(routed) => {
                reviewers.approvers = routed.approvers;
                reviewers.escalate_to = routed.escalate_to;
                reason = format!("{reason}. {}", routed.why);
                Some(
                    self.people
                        .resolve(&reviewers.approvers)
                        .unwrap_or_default(),
                )
            }
            None => self.people.resolve(&reviewers.approvers),
        };
        // The windows' totals the policy read, told as the limits' routing is.
        for share in &asked.shares {
            reason = format!("{reason}. {}", share.told());
        }
        if let Some(stage) = &asked.stage {
            reason = format!("{reason}. Approvals in order: {}", stage.told());
        }
        let policy_version = tool.policy_version();
        HeldCall {
            call_id: asked.call_id.to_string(),
            tool: tool.name.clone(),
            digest: call_digest(
                run.run_id.as_str(),
                &tool.name,
                asked.input,
                &policy_version,
            ),
            policy_version,
            input: asked.input.clone(),
            summary: asked.summary,
            reason,
            deciders,
            reviewers,
            deadline: Some(deadline),
            remind_at: tool
                .remind_before()
                .map(|before| deadline - before.as_millis() as i64)
                .filter(|at| *at > now),
            escalated: false,
            recheck: None,
            risk: tool.risk,
            windows: asked.shares,
            stage: asked.stage,
            model_approval: None,
        }
    }
}
