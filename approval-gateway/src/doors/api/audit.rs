//! `GET /v1/runs/{run_id}/audit`: a run's audit trail and whether its hash chain verifies,
//! with the latest refused decisions (kept apart and capped). It is served from the run's own
//! copy while the run is retained, then from the `AUDIT` stream, the long-term record. The
//! receipts execution entries keep are shown to admins only (see
//! `countersign_model::audit::withholding_receipt`).

use crate::auth::{Caller, Permission};
use crate::config::Role;
use crate::error::ApiError;
use crate::state::AppState;
use crate::view::Receipts;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use countersign_model::audit::{refusal_withholding_receipt, verify, withholding_receipt};
use countersign_model::run::RunId;
use serde_json::{Value, json};

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/v1/runs/{run_id}/audit", get(audit))
}

async fn audit(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Read)?;
    let missing = || ApiError::not_found(format!("no audit trail for run {run_id:?}"));
    let id = RunId::parse(&run_id).ok_or_else(missing)?;
    // The long-term record does not say whose a run was, so a requester, who reads only the
    // runs of those it speaks for, reads the trails of runs still retained.
    if caller.role == Role::Requester {
        let run = state.run(&run_id).await?.ok_or_else(missing)?;
        caller.reading(&run_id, run.requested_by.as_deref())?;
    }
    let elements = match state.store.audit_trail(&id).await? {
        Some(elements) => elements,
        None => state.bus.audit_chain(&id).await?,
    };
    if elements.is_empty() {
        return Err(missing());
    }
    let broken_at = verify(&elements).err();
    // Receipts the execution entries keep are bearer tokens: for admins only, and for anyone
    // else withheld in a form the chain still verifies in.
    let mut refusals = state.store.refusals(&id).await?;
    let elements: Vec<Value> = match Receipts::for_role(caller.role) {
        Receipts::Shown => elements,
        Receipts::Withheld => {
            refusals = refusals
                .into_iter()
                .map(refusal_withholding_receipt)
                .collect();
            elements.into_iter().map(withholding_receipt).collect()
        }
    };
    Ok(Json(json!({
        "run_id": id,
        "verified": broken_at.is_none(),
        "broken_at": broken_at,
        "entries": elements,
        "refusals": refusals,
    })))
}
