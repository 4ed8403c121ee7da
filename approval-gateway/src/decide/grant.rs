//! Making a standing grant: the tail of an approval that carries grant terms, once the
//! decision script has recorded it (for a call that needs several approvals, once all of them
//! carry the same terms). Using and revoking grants is `crate::grants`.

use super::DecideError;
use crate::state::AppState;
use countersign_model::grant::{Grant, GrantTerms};
use countersign_model::run::{Action, Run};
use tracing::info;

/// Makes the grant that the recorded approval of `call_id` carries with `terms`, or answers
/// it if made before; None while a quorum is still short, or when its approvals did not all
/// carry the same terms (then no grant is made: each approver agreed to something else).
pub(super) async fn made(
    state: &AppState,
    run: &Run,
    call_id: &str,
    terms: &GrantTerms,
    door: &str,
) -> Result<Option<Grant>, DecideError> {
    let Some(held) = run.held_calls().find(|c| c.call_id == call_id) else {
        return Ok(None);
    };
    let decisions = state.store.decisions(&run.run_id).await?;
    let Some(decision) = decisions.get(call_id) else {
        return Ok(None);
    };
    if decision.action != Action::Approve || decision.grant.as_ref() != Some(terms) {
        return Ok(None);
    }
    let mut granted_by = if held.reviewers.quorum > 1 {
        let votes = state.store.votes(&run.run_id, call_id).await?;
        if votes.iter().any(|v| v.grant.as_ref() != Some(terms)) {
            return Ok(None);
        }
        votes.into_iter().map(|v| v.decided_by).collect()
    } else {
        vec![decision.decided_by.clone()]
    };
    granted_by.sort();
    let grant = Grant {
        id: Grant::id_for(run.run_id.as_str(), call_id),
        agent: run.agent.clone(),
        tool: held.tool.clone(),
        policy_version: held.policy_version.clone(),
        condition: terms.condition.trim().to_string(),
        requester: match terms.same_requester {
            true => run.requested_by.clone(),
            false => None,
        },
        max_uses: terms.max_uses,
        granted_by,
        channel: door.to_string(),
        run_id: run.run_id.to_string(),
        call_id: call_id.to_string(),
        run_requested_by: run.requested_by.clone(),
        created_at: 0,
        expires_at: 0,
        uses: 0,
        total: terms.total.clone(),
        spent: 0.0,
        revoked: None,
    };
    let (grant, created) = state
        .store
        .create_grant(&grant, terms.expires_in.duration)
        .await?;
    if created {
        state.metrics.grant("made");
        info!(grant = %grant.id, tool = %grant.tool, by = ?grant.granted_by, "standing grant made");
    }
    Ok(Some(grant))
}
