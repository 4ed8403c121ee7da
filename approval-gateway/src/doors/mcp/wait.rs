//! Waiting for a proxy run's outcome. The run is read again whenever one of its `run.*`
//! events arrives (a subscription on NATS, taken before the first read so none is missed) and
//! every [`POLL`] besides, for an event the worker's outbox has not published yet or a NATS
//! connection that dropped it. A client that sent a `progressToken` is told every
//! [`PROGRESS_EVERY`] what the run waits for.

use countersign_model::mcp_proxy;
use countersign_model::run::{Run, RunId, RunStatus};
use countersign_store::StoreError;
use futures::StreamExt;
use rmcp::Peer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::RoleServer;
use std::future::Future;
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};

use crate::state::AppState;

/// How often the run is read when no event came.
const POLL: Duration = Duration::from_secs(1);
/// How often a client that asked for progress is told the call still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How a wait ended.
pub(super) enum Waited {
    /// The call has its result, or the run ended without one.
    Done(Run),
    /// The time was up (or the wait abandoned) first; the run as last read.
    Pending(Option<Run>),
}

/// Waits at most `wait` for run `id` to answer its call, until `abandoned` completes (the
/// client cancelled, the gateway stops), telling `progress`'s peer how it goes.
pub(super) async fn outcome(
    state: &AppState,
    id: &RunId,
    wait: Duration,
    progress: Option<(Peer<RoleServer>, ProgressToken)>,
    abandoned: impl Future<Output = ()>,
) -> Result<Waited, StoreError> {
    let started = Instant::now();
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline, abandoned);
    let subject = state.bus.names.run_events(id);
    let mut events = match state.bus.client.subscribe(subject).await {
        Ok(events) => Some(events),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the run's events; reading it every second");
            None
        }
    };
    // The run was just read: the first poll is one period away.
    let mut poll = tokio::time::interval_at(started + POLL, POLL);
    poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut tell = tokio::time::interval_at(started + PROGRESS_EVERY, PROGRESS_EVERY);
    let mut last = None;
    loop {
        match state.store.load(id).await? {
            Some(run) if answered(&run) => return Ok(Waited::Done(run)),
            run => last = run.or(last),
        }
        loop {
            tokio::select! {
                _ = &mut deadline => return Ok(Waited::Pending(last)),
                _ = &mut abandoned => return Ok(Waited::Pending(last)),
                came = next(&mut events) => {
                    if came {
                        state.metrics.mcp_proxy_wakeup("event");
                    }
                    break;
                }
                _ = poll.tick() => {
                    state.metrics.mcp_proxy_wakeup("poll");
                    break;
                }
                _ = tell.tick(), if progress.is_some() => {
                    let (peer, token) = progress.as_ref().expect("checked by the guard");
                    let message = waiting_for(id, last.as_ref());
                    let param = ProgressNotificationParam::new(
                        token.clone(),
                        started.elapsed().as_secs_f64().floor(),
                    )
                    .with_message(message);
                    // A client that stopped listening is still answered at the end.
                    let _ = peer.notify_progress(param).await;
                }
            }
        }
    }
}

/// Whether the run has its call's result, or has ended without one.
fn answered(run: &Run) -> bool {
    run.status.is_terminal() || mcp_proxy::result(&run.messages).is_some()
}

/// Whether the next event came (false: the subscription ended), or never once there are
/// none to watch.
async fn next(events: &mut Option<async_nats::Subscriber>) -> bool {
    match events {
        Some(subscriber) => {
            let came = subscriber.next().await.is_some();
            if !came {
                *events = None;
            }
            came
        }
        None => std::future::pending().await,
    }
}

/// What a waiting call is told it waits for.
fn waiting_for(id: &RunId, run: Option<&Run>) -> String {
    match run.map(|r| r.status) {
        Some(RunStatus::AwaitingApproval) => format!("awaiting a decision on run {id}"),
        Some(status) => format!("run {id} is {}", status.as_str()),
        None => format!("run {id} is starting"),
    }
}
