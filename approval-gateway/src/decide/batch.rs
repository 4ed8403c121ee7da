//! Decisions on calls of several runs at once (the API's `POST /v1/decisions`, the inbox's
//! batch forms). They are grouped by run, and each run's are checked and recorded by that
//! run's own script step, as if sent alone ([`super::decide`]): all of one run's stand or none
//! does, and one run's refusal leaves the other runs' decisions recorded.

use super::{DecideError, Decider, Proposed};
use crate::state::AppState;
use countersign_store::CallDecided;

/// The most decisions one batch may carry.
pub(crate) const MAX_BATCH: usize = 100;

/// What became of one run's decisions in a batch.
pub(crate) struct RunDecided {
    pub(crate) run_id: String,
    /// The calls decided, in the order they came.
    pub(crate) calls: Vec<String>,
    /// Each call's decision, or the one refusal of them all.
    pub(crate) outcome: Result<Vec<CallDecided>, DecideError>,
}

/// Decides `decisions` (each with its run's id), every run by its own script step, the runs
/// at once; the outcomes by run, in the order each run first appears. Bad input for the batch
/// as a whole (none, more than [`MAX_BATCH`]) is refused before anything is looked up.
pub(crate) async fn decide_batch(
    state: &AppState,
    decisions: Vec<(String, Proposed)>,
    by: &Decider<'_>,
) -> Result<Vec<RunDecided>, DecideError> {
    if decisions.is_empty() || decisions.len() > MAX_BATCH {
        return Err(DecideError::BadInput(format!(
            "decisions must hold 1 to {MAX_BATCH} decisions"
        )));
    }
    let mut runs: Vec<(String, Vec<Proposed>)> = Vec::new();
    for (run_id, proposed) in decisions {
        match runs.iter_mut().find(|(id, _)| *id == run_id) {
            Some((_, proposals)) => proposals.push(proposed),
            None => runs.push((run_id, vec![proposed])),
        }
    }
    Ok(
        futures::future::join_all(runs.into_iter().map(|(run_id, proposals)| async move {
            let calls = proposals.iter().map(|p| p.call_id.clone()).collect();
            let outcome = super::decide(state, &run_id, proposals, by).await;
            RunDecided {
                run_id,
                calls,
                outcome,
            }
        }))
        .await,
    )
}
