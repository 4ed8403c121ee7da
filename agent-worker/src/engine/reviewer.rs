//! A tool's reviewer model (see [`countersign_model::reviewer`]): each call the turn holds
//! under a tool that names one is put to the model, as a person would see it, if the envelope
//! holds it; the verdict is audited (`reviewer_verdict`) and counted. In shadow that is all;
//! live, an `approve` is set on the held call ([`ModelApproval`]), saved with the pause, and
//! the gateway decides the call in the model's name from what was saved. The calls are put
//! all at once, each within its reviewer's timeout, so the pause waits for the slowest at
//! most. A worker that stops before the pause is saved loses the verdicts with it, and the
//! turn is played again from what was saved.

use super::{Changes, Engine};
use crate::agents::RunnableAgent;
use crate::llm::{ModelRequest, Usage};
use countersign_model::audit::AuditKind;
use countersign_model::reviewer::{self, CallView, ModelApproval, ReviewerDef, Verdict};
use countersign_model::run::{HeldCall, Run};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// What a verdict cost: its time, and the provider's tokens (none when the model was not
/// asked, or did not answer).
struct Cost {
    took: Duration,
    usage: Usage,
}

/// The most a verdict's answer may take, in tokens: one tool call with a sentence.
const VERDICT_TOKENS: u32 = 256;

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
                let started = Instant::now();
                let (verdict, reason, usage) = if reviewer.envelope.matches(&held.input) {
                    let view = CallView::of(run, held, &tool.description);
                    self.ask_reviewer(&reviewer.model, def, &view).await
                } else {
                    let outside = "outside the envelope".to_string();
                    (Verdict::OutsideEnvelope, outside, Usage::default())
                };
                let cost = Cost {
                    took: started.elapsed(),
                    usage,
                };
                (held, def, verdict, reason, cost)
            })
        });
        let mut approvals = Vec::new();
        for (held, def, verdict, reason, cost) in futures::future::join_all(asks).await {
            unsaved
                .audits
                .push(self.verdict_entry(run, held, def, verdict, &reason, &cost));
            self.metrics
                .reviewer_verdict(&held.tool, verdict.as_str(), cost.took);
            if def.decides() && verdict == Verdict::Approve {
                let by = def.principal(&held.policy_version);
                approvals.push((held.call_id.clone(), ModelApproval { by, reason }));
            }
        }
        approvals
    }

    /// The model's verdict on `view`, or `Error` with why there is none; and the tokens it
    /// took.
    async fn ask_reviewer(
        &self,
        model: &crate::llm::Model,
        def: &ReviewerDef,
        view: &CallView<'_>,
    ) -> (Verdict, String, Usage) {
        let messages = reviewer::prompt(view);
        let tools = [reviewer::verdict_tool()];
        let request = ModelRequest {
            model: &def.model,
            max_tokens: VERDICT_TOKENS,
            system: reviewer::SYSTEM,
            messages: &messages,
            tools: &tools,
            metadata: &Value::Null,
        };
        // Nobody follows the reviewer's words as they come.
        let (deltas, _) = tokio::sync::mpsc::unbounded_channel();
        let asked = model.complete(&self.http, &request, &deltas);
        match tokio::time::timeout(Duration::from_millis(def.timeout_ms), asked).await {
            Ok(Ok(answer)) => {
                let (verdict, reason) = reviewer::read_answer(&answer.blocks);
                (verdict, reason, answer.usage)
            }
            Ok(Err(e)) => (Verdict::Error, e.to_string(), Usage::default()),
            Err(_) => (
                Verdict::Error,
                format!("no answer within {} ms", def.timeout_ms),
                Usage::default(),
            ),
        }
    }

    fn verdict_entry(
        &self,
        run: &Run,
        held: &HeldCall,
        def: &ReviewerDef,
        verdict: Verdict,
        reason: &str,
        cost: &Cost,
    ) -> countersign_model::audit::AuditEntry {
        let detail = json!({
            "tool": held.tool, "mode": def.mode.as_str(), "verdict": verdict.as_str(), "reason": reason,
            "model": def.named(), "envelope": def.envelope,
            "ms": cost.took.as_millis() as u64, "tokens": cost.usage,
        });
        self.entry(run, AuditKind::ReviewerVerdict, Some(held), detail)
    }
}
