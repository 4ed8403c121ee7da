//! Delegations on the gateway (see `countersign_model::delegation`): made by a person for
//! their own approvals or by an admin, ended early by either person or an admin, and taken by
//! `decide` for someone a held call does not list: one use per call, taken on the delegation
//! (atomic with ending it, see `store/src/delegations.rs`) before the decision script records
//! the decision in both people's names; a decision refused there gives its uses back.

use crate::auth::error::AuthError;
use crate::error::ApiError;
use crate::state::AppState;
use countersign_model::authority::{self, Principal};
use countersign_model::delegation::{
    self, Delegation, DelegationStatus, DelegationTerms, DelegationUse, Ended,
};
use countersign_model::now_ms;
use countersign_model::run::{Run, RunId};
use countersign_store::{StoreError, UseOutcome};
use tracing::info;

/// The delegations handing approvals to `who`, active now: whose places they may take.
pub(crate) async fn delegators(state: &AppState, who: &str) -> Result<Vec<String>, StoreError> {
    let now = now_ms();
    Ok(state
        .store
        .delegations()
        .await?
        .into_iter()
        .filter(|d| d.to == who && d.status(now) == DelegationStatus::Active)
        .map(|d| d.from)
        .collect())
}

/// A delegation whose uses were taken for one request's calls.
pub(crate) struct Taken {
    pub(crate) delegation: Delegation,
    uses: Vec<DelegationUse>,
}

impl Taken {
    /// Gives the uses back: the decision they were taken for was refused.
    pub(crate) async fn give_back(&self, state: &AppState) -> Result<(), StoreError> {
        for used in &self.uses {
            state
                .store
                .release_delegation_use(&self.delegation.id, used)
                .await?;
        }
        Ok(())
    }
}

/// The delegation `principal` decides `calls` of `run` under, its uses taken: when the first
/// call is held for listed people `principal` is not among, and one of them handed their
/// approvals to `principal` by a delegation still standing when its use is taken. None: they
/// decide as themselves (and the script refuses them if the call does not list them).
pub(crate) async fn take(
    state: &AppState,
    run: &Run,
    calls: &[&str],
    principal: &str,
) -> Result<Option<Taken>, StoreError> {
    let Some(deciders) = calls
        .first()
        .and_then(|first| run.held_calls().find(|c| c.call_id == *first))
        .and_then(|held| held.deciders.clone())
    else {
        return Ok(None);
    };
    if deciders.iter().any(|d| d == principal) {
        return Ok(None);
    }
    let now = now_ms();
    let found = state.store.delegations().await?.into_iter().find(|d| {
        d.to == principal && d.status(now) == DelegationStatus::Active && deciders.contains(&d.from)
    });
    let Some(delegation) = found else {
        return Ok(None);
    };
    let mut taken = Taken {
        delegation,
        uses: Vec::new(),
    };
    for call_id in calls {
        let used = use_for(&run.run_id, call_id);
        match state
            .store
            .use_delegation(&taken.delegation.id, &used)
            .await?
        {
            UseOutcome::Ended => {
                // Ended (or past its end) since it was read: nothing is decided under it.
                taken.give_back(state).await?;
                return Ok(None);
            }
            UseOutcome::Counted | UseOutcome::Again => taken.uses.push(used),
        }
    }
    Ok(Some(taken))
}

fn use_for(run_id: &RunId, call_id: &str) -> DelegationUse {
    DelegationUse {
        run_id: run_id.to_string(),
        call_id: call_id.to_string(),
        at: 0,
    }
}

/// Makes the delegation `terms` ask for, as `who`.
pub(crate) async fn make(
    state: &AppState,
    who: Principal<'_>,
    terms: DelegationTerms,
) -> Result<Delegation, ApiError> {
    let from = terms.from.unwrap_or_else(|| who.id.to_string());
    let to = terms.to.trim().to_string();
    authority::may_delegate(who, &from, &to, |p| state.config.person_role(p))
        .map_err(|e| AuthError::Forbidden(format!("{e}: nothing was delegated")))?;
    let lasts = terms.lasts.duration;
    if lasts.as_secs() > delegation::MAX_DURATION_SECS {
        return Err(ApiError::bad_request(format!(
            "a delegation lasts at most {} days",
            delegation::MAX_DURATION_SECS / 86400
        )));
    }
    let reason = terms.reason.filter(|r| !r.trim().is_empty());
    if reason
        .as_ref()
        .is_some_and(|r| r.len() > crate::decide::MAX_TEXT)
    {
        return Err(ApiError::bad_request(format!(
            "the reason is longer than {} bytes",
            crate::decide::MAX_TEXT
        )));
    }
    let delegation = Delegation {
        id: Delegation::new_id(),
        from,
        to,
        reason,
        created_by: who.id.to_string(),
        created_at: 0,
        ends_at: 0,
        ended: None,
    };
    let made = state.store.create_delegation(&delegation, lasts).await?;
    info!(delegation = %made.id, from = %made.from, to = %made.to, by = who.id, "delegation made");
    Ok(made)
}

/// Ends delegation `id` as `who`: from the answer on, nothing is decided under it. Ending one
/// that was ended before answers it as it was ended.
pub(crate) async fn end(
    state: &AppState,
    id: &str,
    who: Principal<'_>,
    reason: Option<String>,
) -> Result<Delegation, ApiError> {
    let missing = || ApiError::not_found(format!("no delegation {id:?}"));
    let delegation = state.store.delegation(id).await?.ok_or_else(missing)?;
    if !authority::may_touch_delegation(who, &delegation) {
        return Err(AuthError::Forbidden(format!(
            "{} may not end delegation {id}: only {}, {} or an admin may",
            who.id, delegation.from, delegation.to
        ))
        .into());
    }
    let ending = Ended {
        by: who.id.to_string(),
        at: 0,
        reason: reason.filter(|r| !r.trim().is_empty()),
    };
    let (ended, now) = state
        .store
        .end_delegation(id, &ending)
        .await?
        .ok_or_else(missing)?;
    if now {
        info!(delegation = %id, by = who.id, "delegation ended");
    }
    Ok(ended)
}
