//! Link tokens. A token is the run id, a dot, then 244 random bits (`{run_id}.{random}`), so
//! its grant is stored in the run's slot; only its SHA-256 is stored, bound to the reviewer,
//! the run, the call and the digest, and it expires. The decision script spends it in the
//! same step that records the decision.

use countersign_model::digest::sha256_hex;
use countersign_model::run::{Action, RunId};
use serde::{Deserialize, Serialize};

/// What one link token lets one person do.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Grant {
    pub(crate) run_id: RunId,
    pub(crate) call_id: String,
    pub(crate) digest: String,
    pub(crate) principal: String,
    pub(crate) action: Action,
}

/// A fresh token for a run's link: the run id, then 244 random bits from two UUIDv4s as hex.
pub(crate) fn new_token(run: &RunId) -> String {
    format!(
        "{run}.{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The run a link token belongs to, and the hash its grant is stored under.
pub(crate) fn parse_token(token: &str) -> Option<(RunId, String)> {
    let (run, _) = token.split_once('.')?;
    Some((RunId::parse(run)?, sha256_hex(token)))
}
