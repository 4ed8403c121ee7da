//! Delegations on the gateway (see `countersign_model::delegation`): made by a person for
//! their own approvals or by an admin, and ended early by either person or an admin. `decide`
//! takes them for someone a held call does not list (`decide/delegation.rs`).

use crate::auth::error::AuthError;
use crate::error::ApiError;
use crate::state::AppState;
use countersign_model::authority::{self, Principal};
use countersign_model::delegation::{self, Delegation, DelegationTerms, Ended};
use tracing::info;

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
