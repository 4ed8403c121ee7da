//! How a tool's reviewer model agreed with the people (see [`countersign_model::reviewer`]):
//! its verdicts (`reviewer_verdict` audit entries) on the held calls of an agent's runs in a
//! window, beside how people settled each call. The calls it would have approved that a
//! person rejected or edited come first: they are what a team must see before letting it
//! decide. A live reviewer's approvals decided their calls, so they are counted as `decided`,
//! not as agreement. It reads; it never writes.

use crate::error::ApiError;
use crate::replay::{Window, live_agent, window_runs};
use crate::state::AppState;
use crate::suggest::held_of;
use countersign_model::run::Run;
use countersign_model::suggest::Settled;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The agreement of an agent's reviewer models with its people, per tool.
#[derive(Serialize)]
pub(crate) struct Agreement {
    agent: String,
    /// The window's start, in ms since the epoch.
    since_ms: i64,
    /// Runs of the agent read.
    runs: usize,
    /// Runs active in the window whose state is no longer retained (of any agent).
    runs_not_retained: usize,
    /// Per tool with a verdict in the window.
    tools: BTreeMap<String, ToolAgreement>,
    /// Put to the model now, over recorded history (see [`crate::reviewer_replay`]): how
    /// many calls were asked about, and how many more the limit left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) replayed: Option<Replayed>,
}

/// How much of the window a replay put to the model.
#[derive(Serialize)]
pub(crate) struct Replayed {
    pub(crate) asked: usize,
    pub(crate) left_out: usize,
}

#[derive(Default, Serialize)]
struct ToolAgreement {
    /// Held calls the reviewer gave a verdict on.
    reviewed: usize,
    /// Its verdicts, by kind: `approve`, `ask_person`, `outside_envelope`, `error`.
    verdicts: BTreeMap<String, usize>,
    /// How people settled the calls it would have approved, in shadow: `approved`, `edited`,
    /// `rejected`, `unanswered`, or `waiting` (not settled yet).
    approved_then: BTreeMap<String, usize>,
    /// The calls it approved live, which its approval decided.
    decided: usize,
    /// How people settled the calls it left to a person.
    asked_then: BTreeMap<String, usize>,
    /// Of its approvals people settled, the share they approved as asked; none if none.
    agreement: Option<f64>,
    /// What a verdict took, in ms: the mean and the slowest.
    ms_mean: f64,
    ms_max: u64,
    #[serde(skip)]
    ms_total: u64,
    /// The provider's tokens of all its verdicts, input and output (what they cost).
    tokens: Tokens,
    /// The calls it would have approved that a person rejected or edited.
    approved_but_refused: Vec<Disagreement>,
}

#[derive(Default, Serialize)]
struct Tokens {
    input: u64,
    output: u64,
}

#[derive(Serialize)]
struct Disagreement {
    run_id: String,
    call_id: String,
    input: Value,
    /// How the person settled it.
    settled: Settled,
    /// Why the model would have approved it.
    reason: String,
}

/// One verdict as the report counts it.
pub(crate) struct Counted<'a> {
    pub(crate) run_id: &'a str,
    pub(crate) call_id: &'a str,
    pub(crate) tool: &'a str,
    /// `approve`, `ask_person`, `outside_envelope` or `error`.
    pub(crate) verdict: &'a str,
    pub(crate) reason: &'a str,
    pub(crate) ms: u64,
    /// The provider's (input, output) tokens.
    pub(crate) tokens: (u64, u64),
    /// Whether its approval decided the call (live).
    pub(crate) live: bool,
}

impl Agreement {
    /// A report of agent `name` over a window that starts at `since_ms`, `runs` read of it.
    pub(crate) fn new(name: &str, read: &Window) -> Self {
        Self {
            agent: name.to_string(),
            since_ms: read.since_ms,
            runs: read.runs.len(),
            runs_not_retained: read.runs_not_retained,
            tools: BTreeMap::new(),
            replayed: None,
        }
    }

    /// Counts `v`, a verdict on a call people settled as `then` (with its input), if they
    /// have.
    pub(crate) fn count(&mut self, v: &Counted<'_>, then: Option<&(Settled, Value)>) {
        let counts = self.tools.entry(v.tool.to_string()).or_default();
        counts.reviewed += 1;
        *counts.verdicts.entry(v.verdict.to_string()).or_default() += 1;
        counts.tokens.input += v.tokens.0;
        counts.tokens.output += v.tokens.1;
        counts.ms_max = counts.ms_max.max(v.ms);
        counts.ms_total += v.ms;
        let how = then.map_or("waiting", |(s, _)| s.as_str()).to_string();
        match v.verdict {
            "approve" if v.live => counts.decided += 1,
            "approve" => *counts.approved_then.entry(how).or_default() += 1,
            "ask_person" => *counts.asked_then.entry(how).or_default() += 1,
            _ => {}
        }
        if let (Some((settled, input)), "approve", false) = (then, v.verdict, v.live)
            && settled.refused()
        {
            counts.approved_but_refused.push(Disagreement {
                run_id: v.run_id.to_string(),
                call_id: v.call_id.to_string(),
                input: input.clone(),
                settled: *settled,
                reason: v.reason.to_string(),
            });
        }
    }

    /// The report, its means and shares worked out.
    pub(crate) fn finished(mut self) -> Self {
        for counts in self.tools.values_mut() {
            counts.ms_mean = counts.ms_total as f64 / counts.reviewed as f64;
            let then = &counts.approved_then;
            let settled: usize = ["approved", "edited", "rejected"]
                .iter()
                .filter_map(|k| then.get(*k))
                .sum();
            let agreed = then.get("approved").copied().unwrap_or_default();
            counts.agreement = (settled > 0).then(|| agreed as f64 / settled as f64);
        }
        self
    }
}

/// The calls of `run` people settled, by id: how, and the input they were held with.
pub(crate) fn settled_in(run: &Run, trail: &[Value]) -> BTreeMap<String, (Settled, Value)> {
    held_of(run, trail)
        .map(|h| (h.call.call_id, (h.settled, h.call.input)))
        .collect()
}

/// The agreement of agent `name`'s reviewer models with its people over the last `window`,
/// from the verdicts its runs' trails recorded.
pub(crate) async fn agreement(
    state: &AppState,
    name: &str,
    window: Duration,
) -> Result<Agreement, ApiError> {
    live_agent(state, name)?;
    let read = window_runs(state, name, window).await?;
    let mut report = Agreement::new(name, &read);
    for (run, trail) in &read.runs {
        let settled = settled_in(run, trail);
        let verdicts = trail.iter().filter(|e| {
            matches!(
                e["kind"].as_str(),
                Some("reviewer_verdict" | "reviewer_shadow")
            )
        });
        for entry in verdicts {
            let detail = &entry["detail"];
            let (Some(call_id), Some(tool), Some(verdict)) = (
                entry["call_id"].as_str(),
                detail["tool"].as_str(),
                detail["verdict"].as_str(),
            ) else {
                continue;
            };
            let tokens = &detail["tokens"];
            let counted = Counted {
                run_id: run.run_id.as_str(),
                call_id,
                tool,
                verdict,
                reason: detail["reason"].as_str().unwrap_or_default(),
                ms: detail["ms"].as_u64().unwrap_or_default(),
                tokens: (
                    tokens["input_tokens"].as_u64().unwrap_or_default(),
                    tokens["output_tokens"].as_u64().unwrap_or_default(),
                ),
                live: detail["mode"] == "live",
            };
            report.count(&counted, settled.get(call_id));
        }
    }
    Ok(report.finished())
}
