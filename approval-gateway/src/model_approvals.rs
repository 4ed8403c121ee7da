//! Held calls a reviewer model approved, live (see [`countersign_model::reviewer`]): the
//! worker stored the model's approval with the pause that holds the call, and each such call
//! is decided here before anyone is asked, through the decision script like any other, in
//! the model's name (`model:NAME@POLICY_VERSION`, door `reviewer`), with a receipt naming it.
//! What is decided is read from the run as stored, never from the message that announced it;
//! the script checks the approval again against the call's stored terms. A call the script
//! refuses (a person decided first, the run is being cancelled, its deadline passed) is left
//! as it stands: shown to people if it still waits.

use crate::config::Role;
use crate::decide::{self, DecideError, Decider, Proposed};
use crate::state::AppState;
use countersign_model::run::{HeldCall, Run};
use tracing::{info, warn};

/// Decides each of `calls` (held in `run`, both as stored) that carries a model's approval;
/// the ids of the calls so decided. An error of Redis leaves the rest for the event's next
/// delivery, where a decision already recorded is found again.
pub(crate) async fn apply(
    state: &AppState,
    run: &Run,
    calls: &[HeldCall],
) -> Result<Vec<String>, DecideError> {
    let mut decided = Vec::new();
    for call in calls {
        let Some(approval) = &call.model_approval else {
            continue;
        };
        let by = Decider {
            principal: &approval.by,
            role: Role::Reviewer,
            door: "reviewer",
            link: None,
            grant: None,
            delegation: None,
            model: true,
        };
        let proposed = Proposed::approval_of(call);
        match decide::decide_one(state, run.run_id.as_str(), proposed, &by).await {
            Ok(_) => {
                info!(run_id = %run.run_id, call_id = %call.call_id, by = %approval.by, "approved by its reviewer model");
                decided.push(call.call_id.clone());
            }
            Err(DecideError::Backend(e)) => return Err(DecideError::Backend(e)),
            Err(refused) => {
                warn!(run_id = %run.run_id, call_id = %call.call_id, error = %refused, "a reviewer model's approval was not recorded");
            }
        }
    }
    Ok(decided)
}
