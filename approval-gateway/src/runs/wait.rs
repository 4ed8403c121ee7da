//! Waiting for the outcome of a run of one call (an MCP proxy call, a call asked at the door
//! of external agents). The run is read again whenever one of its `run.*` events arrives (a
//! subscription on NATS, taken before the first read so none is missed) and every [`POLL`]
//! besides, for an event the worker's outbox has not published yet or a NATS connection
//! that dropped it.

use countersign_model::one_call;
use countersign_model::run::{Run, RunId, RunStatus};
use countersign_store::StoreError;
use futures::StreamExt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};

use crate::state::AppState;

/// How often the run is read when no event came.
const POLL: Duration = Duration::from_secs(1);

/// What a wait is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// The call's outcome (its result, or the end of its run).
    Outcome,
    /// The outcome, or the call held for a person, whichever comes first: a client that can
    /// follow the call later (an MCP task) is answered as soon as a person must decide.
    OutcomeOrHeld,
}

/// How a wait ended.
pub(crate) enum Waited {
    /// The call has its result, or the run ended without one.
    Done(Run),
    /// The time was up first, or the call is held and the wait was [`Until::OutcomeOrHeld`];
    /// the run as last read.
    Pending(Option<Run>),
    /// The wait was abandoned first; the run as last read.
    Abandoned(Option<Run>),
}

impl Waited {
    /// The run as last read, if it was ever found.
    pub(crate) fn run(&self) -> Option<&Run> {
        match self {
            Waited::Done(run) => Some(run),
            Waited::Pending(run) | Waited::Abandoned(run) => run.as_ref(),
        }
    }
}

/// Waits at most `wait` for run `id` to answer its call (or, `until` held, to hold it), or
/// until `abandoned` completes (the client went away, the gateway stops).
pub(crate) async fn outcome(
    state: &AppState,
    id: &RunId,
    (wait, until): (Duration, Until),
    mut abandoned: Pin<&mut impl Future<Output = ()>>,
) -> Result<Waited, StoreError> {
    let started = Instant::now();
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    let subject = state.bus.names.run_events(id);
    let mut events = match state.bus.client.subscribe(subject).await {
        Ok(events) => Some(events),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the run's events; reading it every second");
            None
        }
    };
    let mut poll = tokio::time::interval_at(started + POLL, POLL);
    poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last = None;
    loop {
        match state.store.load(id).await? {
            Some(run) if answered(&run) => return Ok(Waited::Done(run)),
            Some(run) if until == Until::OutcomeOrHeld && held(&run) => {
                return Ok(Waited::Pending(Some(run)));
            }
            run => last = run.or(last),
        }
        tokio::select! {
            _ = &mut deadline => return Ok(Waited::Pending(last)),
            _ = &mut abandoned => return Ok(Waited::Abandoned(last)),
            came = next(&mut events) => {
                if came {
                    state.metrics.call_wait_wakeup("event");
                }
            }
            _ = poll.tick() => state.metrics.call_wait_wakeup("poll"),
        }
    }
}

/// Whether the run has its call's result, or has ended without one.
pub(crate) fn answered(run: &Run) -> bool {
    run.status.is_terminal() || one_call::result(&run.messages).is_some()
}

/// Whether the run's call waits for a person.
pub(crate) fn held(run: &Run) -> bool {
    run.status == RunStatus::AwaitingApproval
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
