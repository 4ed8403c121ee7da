//! The run's live events as the worker drives it (see `countersign_model::live`): published
//! on the worker's one NATS connection, so they arrive in the order the run made them, and
//! before the announcements its next save queues, which go out on the same connection.

use super::Engine;
use countersign_model::live::LiveEvent;
use countersign_model::run::RunId;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::debug;

impl Engine {
    /// Publishes one live event. A follower may miss it in a NATS outage, but the run does
    /// not depend on it, so a failure is only logged.
    pub(super) async fn live(&self, run: &RunId, event: LiveEvent) {
        if let Err(e) = self.bus.publish_live(run, event.to_json()).await {
            debug!(run_id = %run, error = %e, "a live event was not published");
        }
    }

    /// Publishes the model's text for turn `turn` as it arrives on `deltas`, until the model
    /// call ends. What arrived while the last one was being published goes out as one event,
    /// so a slow connection gets fewer, larger pieces rather than a queue.
    pub(super) async fn live_text(
        &self,
        run: &RunId,
        turn: u32,
        mut deltas: UnboundedReceiver<String>,
    ) {
        while let Some(mut text) = deltas.recv().await {
            while let Ok(more) = deltas.try_recv() {
                text.push_str(&more);
            }
            let event = LiveEvent::TextDelta {
                run_id: run.clone(),
                turn,
                text,
            };
            self.live(run, event).await;
        }
    }
}
