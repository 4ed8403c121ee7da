//! Waiting for a proxy call's outcome (`crate::runs::wait`), telling a client that sent a
//! `progressToken` every [`PROGRESS_EVERY`] what the run waits for.

use crate::runs::wait::{self, Until, Waited};
use crate::state::AppState;
use countersign_model::run::{Run, RunId, RunStatus};
use countersign_store::StoreError;
use rmcp::Peer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::RoleServer;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// How often a client that asked for progress is told the call still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Waits at most `wait` for run `id` to answer its call (or, `until` held, to hold it), until
/// `abandoned` completes (the client cancelled, the gateway stops), telling `progress`'s peer
/// how it goes.
pub(super) async fn outcome(
    state: &AppState,
    id: &RunId,
    (wait, until): (Duration, Until),
    progress: Option<(Peer<RoleServer>, ProgressToken)>,
    abandoned: impl Future<Output = ()>,
) -> Result<Waited, StoreError> {
    tokio::pin!(abandoned);
    let Some((peer, token)) = progress else {
        return wait::outcome(state, id, (wait, until), abandoned.as_mut()).await;
    };
    let started = Instant::now();
    let time_up = started + wait;
    loop {
        let slice = time_up
            .saturating_duration_since(Instant::now())
            .min(PROGRESS_EVERY);
        let waited = wait::outcome(state, id, (slice, until), abandoned.as_mut()).await?;
        let last = match waited {
            Waited::Pending(last)
                if Instant::now() < time_up && !last.as_ref().is_some_and(|r| stops(until, r)) =>
            {
                last
            }
            done_or_time_up => return Ok(done_or_time_up),
        };
        let message = waiting_for(id, last.as_ref());
        let param =
            ProgressNotificationParam::new(token.clone(), started.elapsed().as_secs_f64().floor())
                .with_message(message);
        // A client that stopped listening is still answered at the end.
        let _ = peer.notify_progress(param).await;
    }
}

/// Whether a wait `until` ends with `run` as it is, without an outcome.
fn stops(until: Until, run: &Run) -> bool {
    until == Until::OutcomeOrHeld && wait::held(run)
}

/// What a waiting call is told it waits for.
fn waiting_for(id: &RunId, run: Option<&Run>) -> String {
    match run.map(|r| r.status) {
        Some(RunStatus::AwaitingApproval) => format!("awaiting a decision on run {id}"),
        Some(status) => format!("run {id} is {}", status.as_str()),
        None => format!("run {id} is starting"),
    }
}
