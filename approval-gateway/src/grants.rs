//! Standing grants on the gateway, once made (see `decide/grant.rs`): each is used for each
//! later held call it covers, before
//! the call is shown to anyone: one use is counted on the grant (atomic with revocation, see
//! `store/src/grants.rs`), then the call is decided through the decision script like any
//! other, in the names of the grant's makers, each checked as if deciding it, with a receipt
//! naming the grant. A decision refused there gives its use back. A grant one of whose makers
//! the configuration no longer knows with a role that decides ([`stands`]) is not used at all:
//! it ends with its maker's key, as their sessions do, and is listed as `maker_gone`.

use crate::config::Role;
use crate::decide::{self, DecideError, Decider, Proposed};
use crate::state::AppState;
use countersign_model::authority::{self, Principal};
use countersign_model::condition::Condition;
use countersign_model::grant::{Grant, GrantStatus, GrantUse, Held, Revocation};
use countersign_model::run::{HeldCall, Run, RunId};
use countersign_store::UseOutcome;
use tracing::{info, warn};

/// Why a grant was not revoked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RevokeError {
    #[error("no grant {0:?}")]
    NoGrant(String),
    #[error(
        "{0} may not revoke grant {1}: only its makers, an admin, or someone who may decide its tool's calls may"
    )]
    NotAllowed(String, String),
    #[error(transparent)]
    Store(#[from] countersign_store::StoreError),
}

/// Revokes grant `id` as `who`: from the answer on, it approves nothing. Revoking one that
/// was revoked before answers it as it was revoked.
pub(crate) async fn revoke(
    state: &AppState,
    id: &str,
    who: Principal<'_>,
    reason: Option<String>,
) -> Result<Grant, RevokeError> {
    let grant = state
        .store
        .grant(id)
        .await?
        .ok_or_else(|| RevokeError::NoGrant(id.to_string()))?;
    if !may_revoke(state, &grant, who) {
        return Err(RevokeError::NotAllowed(who.id.to_string(), grant.id));
    }
    let revocation = Revocation {
        by: who.id.to_string(),
        at: 0,
        reason: reason.filter(|r| !r.trim().is_empty()),
    };
    let (revoked, now) = state
        .store
        .revoke_grant(id, &revocation)
        .await?
        .ok_or_else(|| RevokeError::NoGrant(id.to_string()))?;
    if now {
        state.metrics.grant("revoked");
        info!(grant = %id, by = who.id, "standing grant revoked");
    }
    Ok(revoked)
}

/// Whether `grant` still approves anything: [`authority::grant_stands`], each maker's role as
/// the configuration gives it now ([`crate::config::Config::person_role`]).
pub(crate) fn stands(state: &AppState, grant: &Grant) -> bool {
    authority::grant_stands(grant, |maker| state.config.person_role(maker))
}

/// How `grant` stands at `now` (ms), its makers checked against the configuration.
pub(crate) fn status(state: &AppState, grant: &Grant, now: i64) -> GrantStatus {
    grant.status(now, stands(state, grant))
}

/// Whether `who` may revoke `grant`: its makers, an admin, or someone who may decide the
/// calls of its tool as the tool's policy names them now (see [`authority::may_revoke`]).
/// Also who the inbox shows a grant to.
pub(crate) fn may_revoke(state: &AppState, grant: &Grant, who: Principal<'_>) -> bool {
    let approvers = state
        .catalog()
        .get(&grant.agent)
        .and_then(|a| a.tool(&grant.tool).map(|t| t.reviewers().approvers))
        .unwrap_or_default();
    let deciders = state.people.resolve(&approvers);
    authority::may_revoke(who, grant, deciders.as_deref())
}

/// Decides under a standing grant each of `calls` (held in `run`, both as stored) that one
/// covers; the ids of the calls so decided. The decision script checks the grant's terms
/// again against the call it decides; the condition, which needs CEL, is evaluated here on
/// the stored input, and the digest the script checks binds the decision to it. An error
/// leaves the rest for a later attempt: what was counted and decided is found again then.
pub(crate) async fn apply(
    state: &AppState,
    run: &Run,
    calls: &[HeldCall],
) -> Result<Vec<String>, DecideError> {
    let mut decided = Vec::new();
    for call in calls {
        let grants = state.store.grants_for(&run.agent, &call.tool).await?;
        let covering = grants.into_iter().filter_map(|g| {
            let covers = g.is_for(&Held {
                agent: &run.agent,
                run_id: run.run_id.as_str(),
                requester: run.requested_by.as_deref(),
                call_id: &call.call_id,
                tool: &call.tool,
                policy_version: &call.policy_version,
            }) && stands(state, &g)
                && Condition::compile(&g.condition).is_ok_and(|c| c.matches(&call.input));
            // What the call adds to a grant's total: one it cannot be read for is not covered.
            let amount = match &g.total {
                None => Some(0.0),
                Some(total) => Condition::compile(&total.sum)
                    .ok()
                    .and_then(|sum| sum.number(&call.input).ok()),
            };
            Some((g, amount?)).filter(|_| covers)
        });
        for (grant, amount) in covering {
            if decide_under(state, &run.run_id, call, (&grant, amount)).await? {
                decided.push(call.call_id.clone());
                break;
            }
        }
    }
    Ok(decided)
}

/// Takes a use of `grant` for `call` (adding `amount` to its total, with one) and decides the
/// call under it; false, with the use given back, when the grant has ended, its total has no
/// room for the call, or its makers may not decide this call.
async fn decide_under(
    state: &AppState,
    run_id: &RunId,
    call: &HeldCall,
    (grant, amount): (&Grant, f64),
) -> Result<bool, DecideError> {
    let used = GrantUse {
        run_id: run_id.to_string(),
        call_id: call.call_id.clone(),
        digest: call.digest.clone(),
        at: 0,
        amount,
    };
    let outcome = state.store.use_grant(&grant.id, &used).await?;
    if outcome == UseOutcome::Ended {
        return Ok(false);
    }
    let principal = grant.decided_by();
    // Its makers all hold a role that decides (`apply` used only a grant that `stands`); the
    // script checks each of them against this call's approvers and requester.
    let by = Decider {
        principal: &principal,
        role: Role::Reviewer,
        door: "grant",
        link: None,
        grant: Some(grant),
        delegation: None,
        model: false,
    };
    let proposed = Proposed::approval_of(call);
    match decide::decide_one(state, run_id.as_str(), proposed, &by).await {
        Ok(_) => {
            if outcome == UseOutcome::Counted {
                state.metrics.grant("used");
            }
            Ok(true)
        }
        Err(DecideError::Backend(e)) => Err(DecideError::Backend(e)),
        Err(refused) => {
            warn!(grant = %grant.id, call_id = %call.call_id, error = %refused, "a grant's call was not decided under it; its use is given back");
            state.store.release_grant_use(&grant.id, &used).await?;
            Ok(false)
        }
    }
}
