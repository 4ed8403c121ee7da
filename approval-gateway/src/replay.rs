//! Replaying an agent's recorded calls against a candidate version of its file (see
//! [`countersign_model::replay`]): the calls are those of the runs still retained that left
//! an audit element in the window (read from the `AUDIT` stream), and the calls waiting now.
//! It reads; it never writes.

use crate::error::ApiError;
use crate::state::AppState;
use countersign_model::agent::{Agent, AgentDef};
use countersign_model::mcp::McpTool;
use countersign_model::now_ms;
use countersign_model::replay::{self, Recorded, Report, Waiting};
use countersign_model::run::{Block, Run, RunStatus, Speaker};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A replay's report with what it read.
#[derive(Serialize)]
pub(crate) struct Replayed {
    #[serde(flatten)]
    pub(crate) report: Report,
    /// The window's start, in ms since the epoch.
    pub(crate) since_ms: i64,
    /// Runs of the agent whose calls were replayed.
    pub(crate) runs: usize,
    /// Runs active in the window whose state is no longer retained (of any agent): their
    /// calls cannot be replayed.
    pub(crate) runs_not_retained: usize,
}

/// Replays the calls of agent `name` made in the last `window` and those waiting now under
/// `candidate` (the text of an agent file of the same name).
pub(crate) async fn replay(
    state: &AppState,
    name: &str,
    candidate: &str,
    window: Duration,
) -> Result<Replayed, ApiError> {
    let live = live_agent(state, name)?;
    let candidate = candidate_agent(&live, candidate)?;
    let read = window_runs(state, name, window).await?;
    let recorded: Vec<Recorded> = read
        .runs
        .iter()
        .flat_map(|(run, trail)| calls_of(run, trail))
        .collect();
    let waiting = waiting(state, name).await?;
    let days = window.as_secs_f64() / 86_400.0;
    let report = replay::replay(&live, &candidate, &recorded, &waiting, days)
        .map_err(|e| ApiError::bad_request(format!("the candidate does not load: {e}")))?;
    Ok(Replayed {
        report,
        since_ms: read.since_ms,
        runs: read.runs.len(),
        runs_not_retained: read.runs_not_retained,
    })
}

/// The live agent named `name`; 404 if there is none.
pub(crate) fn live_agent(state: &AppState, name: &str) -> Result<Arc<Agent>, ApiError> {
    state
        .catalog()
        .get(name)
        .ok_or_else(|| ApiError::not_found(format!("no agent named {name:?}")))
}

/// What the last `window` left of agent `name`'s runs.
pub(crate) struct Window {
    /// The window's start, in ms since the epoch.
    pub(crate) since_ms: i64,
    /// The retained runs that left an audit element in it, each with its trail's entries.
    pub(crate) runs: Vec<(Run, Vec<Value>)>,
    /// Runs active in it (of any agent) that are no longer retained.
    pub(crate) runs_not_retained: usize,
}

/// Reads the [`Window`] of agent `name`'s runs over the last `window`.
pub(crate) async fn window_runs(
    state: &AppState,
    name: &str,
    window: Duration,
) -> Result<Window, ApiError> {
    let since_ms = now_ms() - window.as_millis() as i64;
    let audited = state
        .bus
        .audited_runs_since(since_ms)
        .await
        .map_err(ApiError::unavailable)?;
    let (mut read, mut runs_not_retained) = (Vec::new(), 0);
    for id in &audited {
        match state.store.load(id).await? {
            None => runs_not_retained += 1,
            Some(run) if run.agent == name => {
                // The stored elements are `{prev, hash, entry}`: the entries are read.
                let trail = state.store.audit_trail(id).await?.unwrap_or_default();
                let entries = trail.into_iter().map(|mut e| e["entry"].take()).collect();
                read.push((run, entries));
            }
            Some(_) => {}
        }
    }
    Ok(Window {
        since_ms,
        runs: read,
        runs_not_retained,
    })
}

/// The candidate file as an agent. Its MCP tools are taken as the live agent's servers
/// listed them, so a replay asks no server anything.
pub(crate) fn candidate_agent(live: &Agent, text: &str) -> Result<Agent, ApiError> {
    let refuse = |e: &dyn std::fmt::Display| {
        ApiError::bad_request(format!("the candidate does not load: {e}"))
    };
    let def = AgentDef::parse(text).map_err(|e| refuse(&e))?;
    if def.name != live.def.name {
        return Err(ApiError::bad_request(format!(
            "the candidate is agent {:?}, not {:?}",
            def.name, live.def.name
        )));
    }
    let mut listed: BTreeMap<String, Vec<McpTool>> = BTreeMap::new();
    for tool in &live.def.tools {
        if let (Some(server), Some(found)) = (&tool.mcp, &tool.discovered) {
            listed
                .entry(server.clone())
                .or_default()
                .push(found.clone());
        }
    }
    Agent::from_def(text, def, &live.dir, &listed).map_err(|e| refuse(&e))
}

/// Every tool call the model asked for in `run`, as it asked, with when it ran and whether
/// it did, as its audit `trail` says (`executed` entries; a call without one did not run and
/// is dated when the run was made).
pub(crate) fn calls_of<'a>(
    run: &'a Run,
    trail: &'a [Value],
) -> impl Iterator<Item = Recorded> + 'a {
    let executed = |call_id: &str| {
        trail
            .iter()
            .find(|entry| entry["kind"] == "executed" && entry["call_id"].as_str() == Some(call_id))
    };
    run.messages
        .iter()
        .filter(|m| m.role == Speaker::Assistant)
        .flat_map(|m| &m.content)
        .filter_map(move |block| match block {
            Block::ToolUse { id, name, input } => {
                let ran = executed(id).filter(|entry| {
                    let outcome = entry["detail"]["outcome"].as_str().unwrap_or("");
                    RAN.contains(&outcome)
                });
                Some(Recorded {
                    run_id: run.run_id.to_string(),
                    call_id: id.clone(),
                    tool: name.clone(),
                    input: input.clone(),
                    metadata: run.metadata.clone(),
                    requester: run.requested_by.clone().unwrap_or_default(),
                    at: ran.and_then(|e| e["at"].as_i64()).unwrap_or(run.created_at),
                    ran: ran.is_some(),
                })
            }
            _ => None,
        })
}

/// The outcomes of a call that ran (or may have: `unknown` counts, as a window would).
const RAN: [&str; 4] = ["executed", "approved", "edited", "unknown"];

/// The calls of agent `name` waiting for a decision now.
pub(crate) async fn waiting(state: &AppState, name: &str) -> Result<Vec<Waiting>, ApiError> {
    let mut found = Vec::new();
    for id in state.store.all_awaiting().await? {
        let Some(run) = state.store.load(&id).await? else {
            continue;
        };
        if run.agent != name || run.status != RunStatus::AwaitingApproval {
            continue;
        }
        let decided = state.store.decisions(&run.run_id).await?;
        for held in run
            .held_calls()
            .filter(|c| !decided.contains_key(&c.call_id))
        {
            found.push(Waiting {
                run_id: run.run_id.to_string(),
                held: held.clone(),
                metadata: run.metadata.clone(),
                requester: run.requested_by.clone().unwrap_or_default(),
            });
        }
    }
    Ok(found)
}
