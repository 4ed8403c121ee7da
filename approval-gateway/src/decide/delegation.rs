//! Deciding in someone else's place (see `countersign_model::delegation`): for someone a held
//! call does not list, the delegation handing them the approvals of someone it does, one use
//! per call taken on it (atomic with ending it, see `store/src/delegations.rs`) before the
//! decision script records the decision in both people's names; a decision refused there
//! gives its uses back.

use crate::state::AppState;
use countersign_model::delegation::{Delegation, DelegationStatus, DelegationUse};
use countersign_model::now_ms;
use countersign_model::run::{Run, RunId};
use countersign_store::{StoreError, UseOutcome};

/// Who handed their approvals to `who` by a delegation active now: whose places they may take.
pub(crate) async fn delegators(state: &AppState, who: &str) -> Result<Vec<String>, StoreError> {
    Ok(active_to(state, who)
        .await?
        .into_iter()
        .map(|d| d.from)
        .collect())
}

/// The delegations handing approvals to `who`, active now.
async fn active_to(state: &AppState, who: &str) -> Result<Vec<Delegation>, StoreError> {
    let now = now_ms();
    Ok(state
        .store
        .delegations()
        .await?
        .into_iter()
        .filter(|d| d.to == who && d.status(now) == DelegationStatus::Active)
        .collect())
}

/// A delegation whose uses were taken for one request's calls.
pub(super) struct Taken {
    pub(super) delegation: Delegation,
    uses: Vec<DelegationUse>,
}

impl Taken {
    /// Gives the uses back: the decision they were taken for was refused.
    pub(super) async fn give_back(&self, state: &AppState) -> Result<(), StoreError> {
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
pub(super) async fn take(
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
    let found = active_to(state, principal)
        .await?
        .into_iter()
        .find(|d| deciders.contains(&d.from));
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
