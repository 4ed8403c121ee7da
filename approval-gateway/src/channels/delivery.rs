//! The contract between the deliveries and the channels: the delivery message that travels on
//! the DELIVERIES work queue, how a delivery fails, and the verbs a channel that shows each
//! call on its own (Slack, email) answers. Webhooks have no verbs: they forward the event whole.

use countersign_model::approval::Channel;
use countersign_model::events::{Envelope, Evidence};
use countersign_model::run::{Action, HeldCall, RunId};
use serde::{Deserialize, Serialize};

/// One delivery for one channel target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Delivery {
    /// `webhook:NAME`, `slack:#channel` or `email:ADDRESS` on the wire.
    pub(crate) channel: Channel,
    /// For channels that show each call on its own (Slack, email): which call.
    #[serde(default)]
    pub(crate) call_id: Option<String>,
    /// The same on every attempt, so the receiver can tell a retry from a new message.
    pub(crate) id: String,
    /// When the event was fanned out, RFC 3339.
    pub(crate) timestamp: String,
    pub(crate) event: Envelope,
}

/// Why a delivery failed.
#[derive(Debug)]
pub(crate) enum DeliveryError {
    /// Worth trying again later.
    Retry(String),
    /// Will never work (unknown target, endpoint gone).
    GiveUp(String),
}

impl From<crate::mail::MailError> for DeliveryError {
    fn from(e: crate::mail::MailError) -> Self {
        match e {
            crate::mail::MailError::Retry(why) => Self::Retry(why),
            crate::mail::MailError::GiveUp(why) => Self::GiveUp(why),
        }
    }
}

impl From<countersign_store::StoreError> for DeliveryError {
    fn from(e: countersign_store::StoreError) -> Self {
        Self::Retry(e.to_string())
    }
}

/// A person is asked to decide one held call: first when it is held, again when reminded or
/// escalated.
pub(crate) struct Ask<'a> {
    pub(crate) run_id: &'a RunId,
    pub(crate) agent: &'a str,
    /// The agent's words in the turn.
    pub(crate) text: &'a str,
    pub(crate) call: &'a HeldCall,
    /// The results of the turn's calls that needed nobody (none in a reminder).
    pub(crate) evidence: &'a [Evidence],
    pub(crate) requested_by: Option<&'a str>,
}

/// What happened to a call a channel showed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ending<'a> {
    Decided {
        action: Action,
        by: &'a str,
        /// The standing grant that decided it: then no channel showed the call before.
        under_grant: Option<&'a str>,
    },
    /// Nobody decided by `deadline` (ms since the epoch).
    Expired {
        deadline: i64,
    },
    Cancelled {
        by: &'a str,
    },
    /// Its tool's policy changed while it waited: it is checked again under the new one, and
    /// asked about anew if that still needs a person.
    Superseded,
}

/// A channel that shows each held call on its own. Every verb must be safe to repeat: a
/// delivery whose ack was lost comes again.
pub(crate) trait Deliver {
    /// Asks for a decision on a newly held call.
    async fn request(&self, ask: &Ask<'_>) -> Result<(), DeliveryError>;
    /// Asks again before the deadline, or, `escalated`, asks the people added.
    async fn remind(&self, ask: &Ask<'_>, escalated: bool) -> Result<(), DeliveryError>;
    /// Shows how the call ended.
    async fn ended(
        &self,
        run_id: &RunId,
        call_id: &str,
        ending: Ending<'_>,
    ) -> Result<(), DeliveryError>;
}
