//! A tool's reviewer model, in shadow (see [`countersign_model::reviewer`]): each call the
//! turn holds under a tool that names one is put to the model, as a person would see it,
//! if the envelope holds it; the verdict is audited (`reviewer_shadow`) beside the person's
//! decision to come and counted, nothing more. The calls are put all at once, each within
//! its reviewer's timeout, so the pause waits for the slowest at most.

use super::{Changes, Engine};
use crate::agents::RunnableAgent;
use crate::llm::{ModelRequest, Usage};
use countersign_model::audit::AuditKind;
use countersign_model::reviewer::{self, CallView, ReviewerDef, Verdict};
use countersign_model::run::{HeldCall, Run, TurnCall};
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
    /// Puts each call of `turn` held under a tool with a reviewer model to it; the verdicts
    /// go into `unsaved` as audit entries.
    pub(super) async fn review(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        turn: &[TurnCall],
        unsaved: &mut Changes,
    ) {
        let asks = turn.iter().filter_map(|call| {
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
        for (held, def, verdict, reason, cost) in futures::future::join_all(asks).await {
            unsaved
                .audits
                .push(self.verdict_entry(run, held, def, verdict, &reason, &cost));
            self.metrics
                .reviewer_verdict(&held.tool, verdict.as_str(), cost.took);
        }
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
            "tool": held.tool, "mode": def.mode, "verdict": verdict.as_str(), "reason": reason,
            "model": def.named(), "envelope": def.envelope,
            "ms": cost.took.as_millis() as u64, "tokens": cost.usage,
        });
        self.entry(run, AuditKind::ReviewerShadow, Some(held), detail)
    }
}
