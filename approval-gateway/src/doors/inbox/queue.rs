//! The queue: the calls waiting for one reviewer, that is, those they may approve now (by the
//! rule the decision script applies, see `authority::actions_for`), nearest deadline first.
//! The inbox lists it; after a decision the reviewer is taken to its next line.

use crate::error::ApiError;
use crate::runs;
use crate::state::AppState;
use countersign_model::authority::{self, Principal, RunFacts};
use countersign_model::run::Action;
use serde::Deserialize;

/// At most this many paused runs are read for one inbox; the oldest come first.
const MAX_RUNS: usize = 1000;
const BATCH: usize = 200;

#[derive(Default, Deserialize)]
pub(super) struct Filters {
    pub(super) agent: Option<String>,
    pub(super) tool: Option<String>,
}

impl Filters {
    /// The queue with these filters.
    pub(super) fn queue_path(&self) -> String {
        let chosen = [("agent", &self.agent), ("tool", &self.tool)]
            .into_iter()
            .filter_map(|(name, f)| Some((name, f.as_deref().filter(|f| !f.is_empty())?)));
        let query = serde_urlencoded::to_string(chosen.collect::<Vec<_>>()).unwrap_or_default();
        match query.is_empty() {
            true => "/inbox".into(),
            false => format!("/inbox?{query}"),
        }
    }

    /// Whether any filter is chosen.
    pub(super) fn any(&self) -> bool {
        [&self.agent, &self.tool]
            .into_iter()
            .any(|f| f.as_deref().is_some_and(|f| !f.is_empty()))
    }

    fn keeps(&self, agent: &str, tool: &str) -> bool {
        let matches = |filter: &Option<String>, value: &str| {
            filter.as_deref().is_none_or(|f| f.is_empty() || f == value)
        };
        matches(&self.agent, agent) && matches(&self.tool, tool)
    }
}

/// One line of the inbox.
pub(super) struct Line {
    pub(super) run_id: String,
    pub(super) call_id: String,
    pub(super) digest: String,
    pub(super) summary: String,
    /// The run's input: what the person asked the agent.
    pub(super) asked: String,
    pub(super) input: serde_json::Value,
    pub(super) agent: String,
    pub(super) tool: String,
    pub(super) requested_by: String,
    pub(super) deadline: Option<i64>,
    pub(super) paused_at: i64,
    /// How many of the run's calls failed so far ([`Run::failed_calls`]).
    ///
    /// [`Run::failed_calls`]: countersign_model::run::Run::failed_calls
    pub(super) failed: usize,
}

/// The calls `principal` may approve now, nearest deadline first (none last), then oldest.
pub(super) async fn waiting(
    state: &AppState,
    principal: Principal<'_>,
    filters: &Filters,
) -> Result<Vec<Line>, ApiError> {
    let mut lines = Vec::new();
    let mut after = None;
    let mut read = 0;
    // The calls of those who handed their approvals to `principal` are theirs too.
    let delegators = crate::decide::delegators(state, principal.id).await?;
    loop {
        let batch = state.store.awaiting(after.as_ref(), BATCH).await?;
        let exhausted = batch.len() < BATCH;
        read += batch.len();
        for at in &batch {
            let Some((run, calls)) = runs::awaiting_decision(state, &at.run_id).await? else {
                continue;
            };
            let failed = run.failed_calls().len();
            for call in calls {
                let may = authority::actions_for_delegate(
                    principal,
                    &delegators,
                    &call,
                    RunFacts::of(&run),
                );
                if !may.contains(&Action::Approve) || !filters.keeps(&run.agent, &call.tool) {
                    continue;
                }
                lines.push(Line {
                    run_id: run.run_id.to_string(),
                    call_id: call.call_id,
                    digest: call.digest,
                    summary: call.summary,
                    asked: run.input.clone(),
                    input: call.input,
                    agent: run.agent.clone(),
                    tool: call.tool,
                    requested_by: run.requested_by.clone().unwrap_or_else(|| "unknown".into()),
                    deadline: call.deadline,
                    paused_at: at.since_ms,
                    failed,
                });
            }
        }
        after = batch.last().cloned();
        if exhausted || read >= MAX_RUNS {
            break;
        }
    }
    lines.sort_by_key(|l| (l.deadline.is_none(), l.deadline, l.paused_at));
    Ok(lines)
}
