//! Who may write what, in types. Each service holds the handle of what it does: the worker a
//! [`WorkerStore`] (claim, renew and release a run's lease, save its steps, the execution
//! records, the timers, the awaiting index, and closing calls whose deadline passed or whose
//! policy changed), the gateway a [`GatewayStore`] (create and cancel runs, record people's
//! decisions, grants, channel references, link tokens, idempotency keys, webhook ids,
//! sessions). Both see the [`Store`] itself through them: the reads (a run, its decisions,
//! its audit trail, the inbox's index, grants) and the outbox the relay drains. So a worker
//! cannot record a person's decision, nor a gateway save a step of a run it does not drive,
//! by mistake: the method is not there.

use crate::decide::{DecideOutcome, DecideRequest, DecisionSource, Proposal};
use crate::{Store, StoreError};
use countersign_model::run::RunId;
use std::ops::Deref;

/// What the worker may do to the store.
#[derive(Clone)]
pub struct WorkerStore(Store);

/// What the gateway may do to the store.
#[derive(Clone)]
pub struct GatewayStore(Store);

impl Store {
    /// The worker's handle.
    pub fn worker(self) -> WorkerStore {
        WorkerStore(self)
    }

    /// The gateway's handle.
    pub fn gateway(self) -> GatewayStore {
        GatewayStore(self)
    }
}

impl Deref for WorkerStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.0
    }
}

impl Deref for GatewayStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.0
    }
}

/// What closes a held call with nobody deciding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closing {
    /// Its deadline passed (Redis's clock): it expires.
    Deadline,
    /// Its policy changed while it waited: it is closed (`superseded`) to be checked again.
    Policy,
}

impl Closing {
    /// The door the closing is recorded as coming through.
    pub fn door(self) -> &'static str {
        match self {
            Closing::Deadline => "deadline",
            Closing::Policy => "policy",
        }
    }
}

impl WorkerStore {
    /// Closes held calls of the run as `by` says, through the decision script (no approver
    /// checks: nobody decides), `actor` named in the audit.
    pub async fn close(
        &self,
        id: &RunId,
        by: Closing,
        actor: &str,
        proposals: Vec<Proposal>,
    ) -> Result<DecideOutcome, StoreError> {
        let request = DecideRequest {
            principal: actor,
            door: by.door(),
            by: match by {
                Closing::Deadline => DecisionSource::Deadline,
                Closing::Policy => DecisionSource::Policy,
            },
            link: None,
            role_decides: true,
            receipts: false,
            grant: None,
            delegation: None,
            proposals,
        };
        self.0.decide(id, &request).await
    }
}

impl GatewayStore {
    /// Records people's decisions (or a standing grant's) through the decision script, which
    /// checks each against the held call and who may act.
    pub async fn decide(
        &self,
        id: &RunId,
        request: &DecideRequest<'_>,
    ) -> Result<DecideOutcome, StoreError> {
        self.0.decide(id, request).await
    }
}
