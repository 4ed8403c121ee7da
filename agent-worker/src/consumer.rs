//! The worker's consumers: `runs.start` and `approval.decided.*`, each one durable pull
//! consumer shared by all workers, so each message goes to one of them, taken by the work
//! loop of [`countersign_runtime::work`].
//!
//! A message is acked only once the run it concerns is durably paused, finished or handed
//! on (see [`Engine::process`]); until then progress acks keep JetStream from redelivering it
//! during long model and tool calls. A worker that dies mid-way stops sending them, the
//! message is redelivered to another worker, and that one takes the run over once the dead
//! worker's lease lapses.

use crate::engine::{Engine, Job};
use countersign_model::events::{Envelope, Event};
use countersign_runtime::names::Names;
use countersign_runtime::trace_context;
use countersign_runtime::work::{Durable, Handler, Outcome, Source, Taken};
use tracing::warn;

impl Source for Job {
    const ALL: &'static [Self] = &[Self::Start, Self::Decided];

    fn stream(self) -> &'static str {
        match self {
            Self::Start => "RUNS",
            Self::Decided => "APPROVALS",
        }
    }

    fn durable(self, names: &Names) -> Durable {
        match self {
            Self::Start => Durable {
                stream: names.runs_stream(),
                name: names.start_consumer(),
                subject: names.runs_start(),
            },
            Self::Decided => Durable {
                stream: names.approvals_stream(),
                name: names.decided_consumer(),
                subject: names.approval_decided_all(),
            },
        }
    }
}

impl Handler<Job> for Engine {
    async fn handle(&self, taken: &Taken<Job>) -> Outcome {
        let msg = &taken.msg;
        let envelope: Envelope = match serde_json::from_slice(&msg.payload) {
            Ok(envelope) => envelope,
            Err(e) => {
                warn!(subject = %msg.subject, error = %e, "unreadable message dropped");
                return Outcome::GiveUp;
            }
        };
        // Only the run id is read: the run itself is what the gateway stored.
        let (run_id, job) = match envelope.event {
            Event::RunStart { run_id, .. } => (run_id, Job::Start),
            Event::ApprovalDecided { run_id, .. } => (run_id, Job::Decided),
            _ => return Outcome::Ack,
        };
        let parent = trace_context::from_nats(msg.headers.as_ref());
        self.process(&run_id, job, taken.attempt, parent).await
    }
}
