//! A tool's reviewer model put to recorded history (see [`countersign_model::reviewer`]):
//! each call an agent's runs held in a window and people settled is asked of the reviewer its
//! tool names now, as the person was shown it then (the call, what the agent said in that
//! turn, the results it had), and the verdicts are counted beside how the people settled each
//! call, as the agreement report counts the verdicts recorded on live traffic
//! ([`crate::agreement`]). A call a model decided is no person's, and is not put to it. At most `limit`
//! calls, the most recent first, a few at a time: each is a paid request to the provider. It
//! reads and asks; it writes nothing.

use crate::agreement::{Agreement, Counted, Replayed};
use crate::error::ApiError;
use crate::replay::{live_agent, window_runs};
use crate::state::AppState;
use crate::suggest::held_of;
use countersign_llm::Model;
use countersign_llm::review::{Review, review};
use countersign_model::agent::Agent;
use countersign_model::condition::Condition;
use countersign_model::reviewer::{CallView, ReviewerDef, context};
use countersign_model::run::Run;
use countersign_model::suggest::Settled;
use futures::StreamExt;
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;

/// How many calls are put to the providers at once.
const AT_ONCE: usize = 4;
/// The most calls one replay may put to the model.
pub(crate) const MAX_LIMIT: usize = 500;

/// One recorded call to put to its reviewer.
struct Past<'a> {
    run: &'a Run,
    /// Its `requested` audit entry: what the person was shown.
    requested: &'a Value,
    /// How people settled it, with its input.
    then: (Settled, Value),
}

/// A tool's reviewer: its definition, its envelope compiled, its model.
type Reviewers<'a> = HashMap<&'a str, (&'a ReviewerDef, Condition, Model)>;

/// The verdict of its tool's reviewer on `p`, shown as its person was shown it then: the call,
/// what the agent said in the answer asking for it, the results it had by then.
async fn ask_about<'a>(
    state: &AppState,
    agent: &Agent,
    reviewers: &Reviewers<'_>,
    p: &'a Past<'a>,
) -> (&'a Past<'a>, Review) {
    let detail = &p.requested["detail"];
    let text = |field: &str| detail[field].as_str().unwrap_or_default();
    let tool = text("tool");
    let (def, envelope, model) = &reviewers[tool];
    let asked_in = detail["turn"]
        .as_u64()
        .and_then(|t| p.run.answer_of_turn(t));
    let messages = asked_in.map_or(&[][..], |i| &p.run.messages[..=i]);
    let (agent_said, evidence) = context(messages);
    let view = CallView {
        tool,
        tool_description: agent.tool(tool).map_or("", |t| t.description.as_str()),
        input: &detail["input"],
        reason: text("reason"),
        summary: text("summary"),
        agent_said,
        evidence,
    };
    (p, review(model, &state.http, (def, envelope), &view).await)
}

/// Puts the calls of agent `name`'s runs over the last `window` that people settled (at
/// most `limit`, the most recent first) to the reviewer models their tools name now.
pub(crate) async fn replay(
    state: &AppState,
    name: &str,
    window: Duration,
    limit: usize,
) -> Result<Agreement, ApiError> {
    let agent = live_agent(state, name)?;
    let reviewers: Reviewers<'_> = agent
        .def
        .tools
        .iter()
        .filter_map(|tool| {
            let def = tool.reviewer.as_ref()?;
            let envelope = def.envelope().ok()?;
            Some((
                tool.name.as_str(),
                (def, envelope, Model::for_reviewer(def)),
            ))
        })
        .collect();
    let read = window_runs(state, name, window).await?;
    let mut past = Vec::new();
    for (run, trail) in &read.runs {
        for held in held_of(run, trail) {
            if !reviewers.contains_key(held.call.tool.as_str()) {
                continue;
            }
            let requested = trail.iter().rfind(|e| {
                e["kind"] == "requested" && e["call_id"].as_str() == Some(&held.call.call_id)
            });
            if let Some(requested) = requested {
                let then = (held.settled, held.call.input);
                past.push(Past {
                    run,
                    requested,
                    then,
                });
            }
        }
    }
    past.sort_by_key(|p| std::cmp::Reverse(p.requested["at"].as_i64().unwrap_or_default()));
    let left_out = past.len().saturating_sub(limit);
    past.truncate(limit);

    let asks: Vec<_> = past
        .iter()
        .map(|p| ask_about(state, &agent, &reviewers, p))
        .collect();
    let verdicts: Vec<_> = futures::stream::iter(asks)
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;

    let mut report = Agreement::new(name, &read);
    for (p, verdict) in &verdicts {
        let counted = Counted {
            run_id: p.run.run_id.as_str(),
            call_id: p.requested["call_id"].as_str().unwrap_or_default(),
            tool: p.requested["detail"]["tool"].as_str().unwrap_or_default(),
            verdict: verdict.verdict.as_str(),
            reason: &verdict.reason,
            ms: verdict.took.as_millis() as u64,
            tokens: (verdict.usage.input_tokens, verdict.usage.output_tokens),
            live: false,
        };
        report.count(&counted, Some(&p.then));
    }
    report.replayed = Some(Replayed {
        asked: verdicts.len(),
        left_out,
    });
    Ok(report.finished())
}
