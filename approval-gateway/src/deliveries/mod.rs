//! Deliveries: how approval events reach the channels. Every approval event fans out to the
//! channels that should hear of it: one delivery per channel target on the DELIVERIES work
//! queue ([`fan_out`]). Each delivery is sent on its own ([`send`]) and, when it fails, handed
//! back to JetStream with a growing delay, so a slow or failing channel holds up no other and
//! a gateway restart loses no retry. Every gateway takes both steps in one work loop (see
//! [`countersign_runtime::work`]); the shared durable consumers split the work between them.
//!
//! Nothing holds a message past its ack wait: a send that hangs is delivered again after 30
//! seconds. On shutdown the loop stops pulling and the deliveries in flight get a few seconds
//! to finish; what is cut off is not acked, so JetStream sends it again.

mod fan_out;
mod send;

use crate::state::AppState;
use countersign_runtime::bus::ConsumerSettings;
use countersign_runtime::names::Names;
use countersign_runtime::work::{
    self, Durable, Handler, InProgress, Outcome, Source, Taken, WorkLoop,
};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Messages handled at once by one gateway.
const CONCURRENT: usize = 32;

/// How long deliveries in flight may take to finish once the gateway stops.
const DRAIN: Duration = Duration::from_secs(10);

/// The two steps of a delivery, each the work of one shared consumer.
#[derive(Clone, Copy)]
pub(crate) enum Step {
    /// An approval event (APPROVALS), fanned out into deliveries.
    FanOut,
    /// One delivery (DELIVERIES), sent to its channel.
    Send,
}

impl Source for Step {
    const ALL: &'static [Self] = &[Self::FanOut, Self::Send];

    fn stream(self) -> &'static str {
        match self {
            Self::FanOut => "APPROVALS",
            Self::Send => "DELIVERIES",
        }
    }

    fn durable(self, names: &Names) -> Durable {
        match self {
            Self::FanOut => Durable {
                stream: names.approvals_stream(),
                name: names.fan_out_consumer(),
                subject: names.approval_all(),
            },
            Self::Send => Durable {
                stream: names.deliveries_stream(),
                name: names.deliveries_consumer(),
                subject: names.delivery_all(),
            },
        }
    }
}

/// The gateway's state, as the handler of both steps.
struct Deliveries(AppState);

impl Handler<Step> for Deliveries {
    async fn handle(&self, taken: &Taken<Step>) -> Outcome {
        match taken.source {
            Step::FanOut => fan_out::fan_out(&self.0, &taken.msg).await,
            Step::Send => send::send(&self.0, &taken.msg, taken.attempt).await,
        }
    }
}

/// Fans out and sends until `shutdown`, then lets the deliveries in flight finish within
/// [`DRAIN`]. Fails only when its consumers cannot be used.
pub(crate) async fn run(state: AppState, shutdown: CancellationToken) -> anyhow::Result<()> {
    let work = WorkLoop::pull(
        state.bus.clone(),
        work::Settings {
            consumer: ConsumerSettings {
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 10_000,
            },
            in_progress: InProgress::Lapse,
            concurrency: CONCURRENT,
            grace: DRAIN,
        },
        state.consumers.clone(),
        state.metrics.clone(),
        Arc::new(Deliveries(state)),
    )
    .await?;
    info!("deliveries started");
    work.run(&shutdown).await;
    Ok(())
}
