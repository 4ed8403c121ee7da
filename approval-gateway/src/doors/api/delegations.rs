//! Delegations (see [`crate::delegations`]):
//!
//! - `POST /v1/delegations`: `{"to", "for", "reason"?, "from"?, "by"?}` hands `from`'s
//!   approvals (default: the person making it) to `to` for a period (`8h`, `14d`, at most
//!   90 days); a person makes their own, an admin anyone's. `by` names the person making it
//!   when the key speaks for people.
//! - `GET /v1/delegations`: those the caller (or `?person=`, someone it speaks for) made,
//!   received or, for an admin, all; `?status=active` for those standing now.
//! - `GET /v1/delegations/{id}`: one, with the calls decided under it.
//! - `POST /v1/delegations/{id}/end`: nothing is decided under it from the answer on.

use crate::auth::error::AuthError;
use crate::auth::{Authenticated, Caller, Permission, QueryParams};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use countersign_model::authority::{self, Principal, Role};
use countersign_model::delegation::{Delegation, DelegationStatus, DelegationTerms};
use countersign_model::now_ms;
use countersign_model::span::Span;
use serde::Deserialize;
use serde_json::{Value, json};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/delegations", post(make).get(list))
        .route("/v1/delegations/{id}", get(show))
        .route("/v1/delegations/{id}/end", post(end))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MakeBody {
    from: Option<String>,
    to: String,
    #[serde(rename = "for")]
    lasts: Span,
    reason: Option<String>,
    /// The person making it, when the key speaks for people.
    by: Option<String>,
}

/// A delegation as the API shows it: as stored, with its status now.
fn view(delegation: &Delegation, now: i64) -> Value {
    let mut value = json!(delegation);
    value["status"] = json!(delegation.status(now));
    value
}

/// Who is acting: the caller, or the person `named` it speaks for, with their role.
fn acting(
    caller: &Caller,
    named: Option<&str>,
    state: &AppState,
) -> Result<(String, Role), ApiError> {
    Ok(caller.deciding_as(named, &state.config)?)
}

async fn make(
    State(state): State<AppState>,
    Authenticated { caller, body, .. }: Authenticated<MakeBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(Permission::Decide)?;
    let (id, role) = acting(&caller, body.by.as_deref(), &state)?;
    let terms = DelegationTerms {
        from: body.from,
        to: body.to,
        lasts: body.lasts,
        reason: body.reason,
    };
    let made = crate::delegations::make(&state, Principal { id: &id, role }, terms).await?;
    Ok((StatusCode::CREATED, Json(view(&made, now_ms()))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// `active`, or `all` (the default).
    status: Option<String>,
    /// The person whose delegations to list, when the key speaks for people.
    person: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Read)?;
    let active_only = super::active_only(query.status.as_deref())?;
    let (id, role) = acting(&caller, query.person.as_deref(), &state)?;
    let who = Principal { id: &id, role };
    let now = now_ms();
    let listed: Vec<Value> = state
        .store
        .delegations()
        .await?
        .iter()
        .filter(|d| authority::may_touch_delegation(who, d))
        .filter(|d| !active_only || d.status(now) == DelegationStatus::Active)
        .map(|d| view(d, now))
        .collect();
    Ok(Json(json!({ "delegations": listed })))
}

async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Read)?;
    let delegation = state
        .store
        .delegation(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no delegation {id:?}")))?;
    if !authority::may_touch_delegation(caller.as_principal(), &delegation) {
        return Err(AuthError::Forbidden(format!(
            "only {}, {} or an admin may read delegation {id}",
            delegation.from, delegation.to
        ))
        .into());
    }
    let mut answer = view(&delegation, now_ms());
    answer["used_by"] = json!(state.store.delegation_uses(&id).await?);
    Ok(Json(answer))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndBody {
    reason: Option<String>,
    /// The person ending it, when the key speaks for people.
    by: Option<String>,
}

async fn end(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Authenticated { caller, body, .. }: Authenticated<EndBody>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Decide)?;
    if body
        .reason
        .as_ref()
        .is_some_and(|r| r.len() > crate::decide::MAX_TEXT)
    {
        return Err(ApiError::bad_request(format!(
            "the reason is longer than {} bytes",
            crate::decide::MAX_TEXT
        )));
    }
    let (who, role) = acting(&caller, body.by.as_deref(), &state)?;
    let ended =
        crate::delegations::end(&state, &id, Principal { id: &who, role }, body.reason).await?;
    Ok(Json(view(&ended, now_ms())))
}
