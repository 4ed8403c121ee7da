//! A tool's reviewer model (see [`countersign_model::reviewer`]): each call the turn holds
//! under a tool that names one is put to the model ([`countersign_llm::review`]), as a person
//! would see it, if the envelope holds it; the verdict is audited (`reviewer_verdict`) and
//! counted. In shadow that is all; live, an `approve` is set on the held call
//! ([`ModelApproval`]), saved with the pause, and the gateway decides the call in the model's
//! name from what was saved. The calls are put all at once, each within its reviewer's
//! timeout, so the pause waits for the slowest at most. A worker that stops before the pause
//! is saved loses the verdicts with it, and the turn is played again from what was saved.

use super::{Changes, Engine};
use crate::agents::RunnableAgent;
use countersign_llm::review::{Review, review};
use countersign_model::audit::AuditKind;
use countersign_model::reviewer::{CallView, ModelApproval, ReviewerDef, Verdict};
use countersign_model::run::{HeldCall, Run};
use serde_json::json;

impl Engine {
    /// Puts each call of the run's paused turn held under a tool with a reviewer model to it;
    /// the verdicts go into `unsaved` as audit entries, and a live reviewer's approvals onto
    /// the held calls.
    pub(super) async fn review(&self, run: &mut Run, agent: &RunnableAgent, unsaved: &mut Changes) {
        let approvals = self.verdicts(run, agent, unsaved).await;
        for call in &mut run.paused_turn {
            if let Some(held) = call.held.as_mut() {
                held.model_approval = approvals
                    .iter()
                    .find(|(id, _)| *id == held.call_id)
                    .map(|(_, approval)| approval.clone());
            }
        }
    }

    /// The verdicts on the held calls of `run`'s paused turn, audited into `unsaved`; the
    /// approvals of live reviewers, by call id.
    async fn verdicts(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        unsaved: &mut Changes,
    ) -> Vec<(String, ModelApproval)> {
        let asks = run.paused_turn.iter().filter_map(|call| {
            let held = call.held.as_ref()?;
            let tool = agent.agent.tool(&held.tool)?;
            let def = tool.reviewer.as_ref()?;
            let reviewer = agent.reviewers.get(&tool.name)?;
            Some(async move {
                let view = CallView::of(run, held, &tool.description);
                let bounds = (def, &reviewer.envelope);
                (
                    held,
                    def,
                    review(&reviewer.model, &self.http, bounds, &view).await,
                )
            })
        });
        let mut approvals = Vec::new();
        for (held, def, verdict) in futures::future::join_all(asks).await {
            unsaved
                .audits
                .push(self.verdict_entry(run, held, def, &verdict));
            self.metrics
                .reviewer_verdict(&held.tool, verdict.verdict.as_str(), verdict.took);
            if def.decides() && verdict.verdict == Verdict::Approve {
                let by = def.principal(&held.policy_version);
                let reason = verdict.reason;
                approvals.push((held.call_id.clone(), ModelApproval { by, reason }));
            }
        }
        approvals
    }

    fn verdict_entry(
        &self,
        run: &Run,
        held: &HeldCall,
        def: &ReviewerDef,
        verdict: &Review,
    ) -> countersign_model::audit::AuditEntry {
        let detail = json!({
            "tool": held.tool, "mode": def.mode.as_str(), "verdict": verdict.verdict.as_str(),
            "reason": verdict.reason, "model": def.named(), "envelope": def.envelope,
            "ms": verdict.took.as_millis() as u64, "tokens": verdict.usage,
        });
        self.entry(run, AuditKind::ReviewerVerdict, Some(held), detail)
    }
}
