//! Putting a held call to its tool's reviewer model (see [`countersign_model::reviewer`]):
//! the envelope first, evaluated here, never by the model; inside it, the call as data,
//! within the reviewer's timeout; the verdict, its reason and what it cost. The worker asks
//! this of the calls it holds, the gateway of the calls of recorded history.

use crate::{Model, ModelRequest, Usage};
use countersign_model::condition::Condition;
use countersign_model::reviewer::{self, CallView, ReviewerDef, Verdict};
use serde_json::Value;
use std::time::{Duration, Instant};

/// A reviewer's verdict on one call.
#[derive(Debug)]
pub struct Review {
    /// What it made of the call.
    pub verdict: Verdict,
    /// Why, in its words (or why there is no verdict).
    pub reason: String,
    /// The provider's tokens (none when the model was not asked, or did not answer).
    pub usage: Usage,
    /// How long the verdict took.
    pub took: Duration,
}

/// The most a verdict's answer may take, in tokens: one tool call with a sentence.
const VERDICT_TOKENS: u32 = 256;

/// The verdict of `model` (as `def` names it, bounded by `envelope`, its compiled envelope)
/// on the call `view` shows.
pub async fn review(
    model: &Model,
    http: &reqwest::Client,
    (def, envelope): (&ReviewerDef, &Condition),
    view: &CallView<'_>,
) -> Review {
    let started = Instant::now();
    let (verdict, reason, usage) = if envelope.matches(view.input) {
        ask(model, http, def, view).await
    } else {
        let outside = "outside the envelope".to_string();
        (Verdict::OutsideEnvelope, outside, Usage::default())
    };
    Review {
        verdict,
        reason,
        usage,
        took: started.elapsed(),
    }
}

/// The model's verdict on `view`, or `Error` with why there is none; and the tokens it took.
async fn ask(
    model: &Model,
    http: &reqwest::Client,
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
    let asked = model.complete(http, &request, &deltas);
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
