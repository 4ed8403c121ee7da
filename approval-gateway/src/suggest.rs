//! Suggesting policies from an agent's own recorded decisions (see
//! [`countersign_model::suggest`]): the held calls of the window, as their audit trails
//! settled them, give the bounds; each bound's candidate file is then replayed over the same
//! window exactly as `POST /v1/agents/{agent}/replay` replays one, and a call a person
//! rejected or edited that the candidate would have let run disqualifies it. It reads; it
//! never writes.

use crate::error::ApiError;
use crate::replay::{candidate_agent, live_agent, waiting, window_runs};
use crate::state::AppState;
use axum::http::StatusCode;
use countersign_model::agent::Agent;
use countersign_model::authority::names_a_model;
use countersign_model::grant::Grant;
use countersign_model::replay::{self, CallRef, Example, Forecast, Recorded, ToolCounts, Waiting};
use countersign_model::run::Run;
use countersign_model::span::Span;
use countersign_model::suggest::{self, Bound, HeldRecord, RewriteError, Settled, Thresholds};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashSet;
use std::time::Duration;

/// The most suggestions one answer replays and shows.
const MOST: usize = 10;

/// The suggestions for an agent, with what they were read from.
#[derive(Serialize)]
pub(crate) struct Suggested {
    /// The agent.
    agent: String,
    /// The window's start, in ms since the epoch.
    since_ms: i64,
    /// Runs of the agent read.
    runs: usize,
    /// Runs active in the window whose state is no longer retained (of any agent).
    runs_not_retained: usize,
    /// Held calls of the agent people settled in the window (or nobody did, in time).
    held: usize,
    /// Most approvals first; those with disqualifiers included, marked.
    suggestions: Vec<Suggestion>,
}

/// One bound, replayed.
#[derive(Serialize)]
struct Suggestion {
    #[serde(flatten)]
    bound: Bound,
    /// The tool's `when`, now and in the candidate.
    when: Change,
    /// What the candidate changes for the tool's recorded calls in the window.
    replay: ToolCounts,
    /// Approvals asked for per day, by approver group, now and with the candidate.
    approvals_per_day: Forecast,
    /// Calls a person rejected or edited that the candidate would have let run.
    disqualifiers: Vec<Example>,
    /// Whether there is any: such a suggestion is shown, not offered.
    disqualified: bool,
    /// The same bound as a standing grant instead of a policy change, made by approving a
    /// call waiting now that it covers; none if no waiting call is covered or the policy
    /// allows no grants.
    grant: Option<GrantOffer>,
    /// The candidate agent file, whole, for a person to review and ship.
    candidate: String,
}

/// A standing grant a person could make, approving one waiting call: `POST /v1/grants` with
/// these terms (or `countersign grant RUN CALL --digest D --when C --uses N --for SPAN`).
#[derive(Serialize)]
struct GrantOffer {
    run_id: String,
    call_id: String,
    digest: String,
    condition: String,
    /// As many uses as the window's approvals within the bound, within the policy's cap.
    max_uses: u32,
    /// As long as the window, within the policy's cap (`90s`, `30m`, `8h`, `7d`).
    expires_in: String,
}

#[derive(Serialize)]
struct Change {
    before: String,
    after: String,
}

/// The suggestions for agent `name` from the decisions of the last `window`.
pub(crate) async fn suggest(
    state: &AppState,
    name: &str,
    window: Duration,
    thresholds: Thresholds,
) -> Result<Suggested, ApiError> {
    let live = live_agent(state, name)?;
    let read = window_runs(state, name, window).await?;
    let recorded: Vec<Recorded> = read
        .runs
        .iter()
        .flat_map(|(run, trail)| crate::replay::calls_of(run, trail))
        .collect();
    let held: Vec<HeldRecord> = read
        .runs
        .iter()
        .flat_map(|(run, trail)| held_of(run, trail))
        .collect();
    let refused: HashSet<(&str, &str)> = held
        .iter()
        .filter(|h| h.settled.refused())
        .map(|h| (h.call.run_id.as_str(), h.call.call_id.as_str()))
        .collect();
    let waiting = waiting(state, name).await?;
    let days = window.as_secs_f64() / 86_400.0;
    let mut suggestions = Vec::new();
    for bound in suggest::bounds(&held, thresholds).into_iter().take(MOST) {
        let rewritten = match suggest::rewrite(&live.source, &bound.tool, &bound.release) {
            Ok(rewritten) => rewritten,
            // The file changed since those calls were held: the tool asks for nothing now.
            Err(RewriteError::NeverAsks(_) | RewriteError::NoTool(_)) => continue,
            Err(e) => {
                return Err(ApiError::for_status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the live agent file cannot be rewritten: {e}"),
                ));
            }
        };
        let candidate = candidate_agent(&live, &rewritten.text)?;
        let mut disqualifiers = Vec::new();
        let report = replay::replay_each(
            &live,
            &candidate,
            &recorded,
            &waiting,
            days,
            |call, kind| {
                if kind == replay::NEWLY_RELEASED
                    && refused.contains(&(call.run_id.as_str(), call.call_id.as_str()))
                {
                    disqualifiers.push(Example::of(call));
                }
            },
        )
        .map_err(|e| ApiError::bad_request(format!("the candidate does not load: {e}")))?;
        let grant = grant_offer(&live, &bound, &report.waiting.released, &waiting, window);
        suggestions.push(Suggestion {
            grant,
            replay: report.tools.get(&bound.tool).cloned().unwrap_or_default(),
            approvals_per_day: report.approvals_per_day,
            disqualified: !disqualifiers.is_empty(),
            disqualifiers,
            when: Change {
                before: rewritten.before,
                after: rewritten.after,
            },
            candidate: rewritten.text,
            bound,
        });
    }
    Ok(Suggested {
        agent: name.to_string(),
        since_ms: read.since_ms,
        runs: read.runs.len(),
        runs_not_retained: read.runs_not_retained,
        held: held.len(),
        suggestions,
    })
}

/// The bound as a grant made by approving the first waiting call of its tool the candidate
/// `released`, with terms within the live policy's caps.
fn grant_offer(
    live: &Agent,
    bound: &Bound,
    released: &[CallRef],
    waiting: &[Waiting],
    window: Duration,
) -> Option<GrantOffer> {
    let limits = live.tool(&bound.tool)?.approval.grant_limits();
    if !limits.allowed {
        return None;
    }
    let covered = released.iter().find(|c| c.tool == bound.tool)?;
    let held = &waiting
        .iter()
        .find(|w| w.run_id == covered.run_id && w.held.call_id == covered.call_id)?
        .held;
    let uses = u32::try_from(bound.evidence.approved).unwrap_or(u32::MAX);
    let secs = window.as_secs().min(limits.max_duration_secs).max(1);
    Some(GrantOffer {
        run_id: covered.run_id.clone(),
        call_id: held.call_id.clone(),
        digest: held.digest.clone(),
        condition: bound.release.clone(),
        max_uses: uses.clamp(1, limits.max_uses.max(1)),
        expires_in: Span::of_secs(secs).to_string(),
    })
}

/// The calls `run` held, as its audit `trail` says people settled them: by the action a
/// worker ran them under (`executed`), else rejected if a decision rejected them, else
/// unanswered if they expired or the run ended first. A call still waiting, or decided and
/// not yet run, is not settled and left out; so is one a reviewer model decided, which is no
/// person's decision (neither evidence for a suggestion nor a verdict to measure one by).
pub(crate) fn held_of<'a>(
    run: &'a Run,
    trail: &'a [Value],
) -> impl Iterator<Item = HeldRecord> + 'a {
    let mut seen = HashSet::new();
    trail
        .iter()
        .filter(|e| e["kind"] == "requested")
        .filter_map(move |requested| {
            let call_id = requested["call_id"].as_str()?;
            if !seen.insert(call_id) {
                return None;
            }
            let about = |kind: &'static str| {
                trail
                    .iter()
                    .filter(move |e| e["kind"] == kind && e["call_id"].as_str() == Some(call_id))
            };
            let executed = about("executed").find(|e| e["detail"]["action"].is_string());
            let decided: Vec<&Value> = about("decided").collect();
            let action = |e: &Value| e["detail"]["action"].as_str().map(str::to_string);
            let settled = match executed.and_then(action).as_deref() {
                Some("approve") => Settled::Approved,
                Some("edit") => Settled::Edited,
                Some("reject") => Settled::Rejected,
                _ if decided
                    .iter()
                    .any(|e| action(e).as_deref() == Some("reject")) =>
                {
                    Settled::Rejected
                }
                _ if about("expired").next().is_some() || run.status.is_terminal() => {
                    Settled::Unanswered
                }
                _ => return None,
            };
            // Each approval of a quorum is a `decided` entry of its own; people deciding
            // through a standing grant are its makers.
            let deciders: Vec<String> = decided
                .iter()
                .filter_map(|e| e["actor"].as_str())
                .flat_map(Grant::people_of)
                .map(str::to_string)
                .collect();
            if deciders.iter().any(|d| names_a_model(d)) {
                return None;
            }
            let detail = &requested["detail"];
            Some(HeldRecord {
                call: Recorded {
                    run_id: run.run_id.to_string(),
                    call_id: call_id.to_string(),
                    tool: detail["tool"].as_str()?.to_string(),
                    input: detail["input"].clone(),
                    metadata: run.metadata.clone(),
                    requester: run.requested_by.clone().unwrap_or_default(),
                    at: requested["at"].as_i64().unwrap_or(run.created_at),
                    ran: matches!(settled, Settled::Approved | Settled::Edited),
                },
                settled,
                deciders,
            })
        })
}
