//! Standing grants (see [`crate::grants`]):
//!
//! - `POST /v1/grants`: approve a held call and allow calls like it. It is a decision on that
//!   call, checked and recorded like any other (who may approve it may grant, the digest must
//!   be what was shown), carrying the grant's terms; the grant is made once the approval is
//!   recorded (for a call that needs several approvals, once each approver sent the same
//!   terms).
//! - `GET /v1/grants`: grants made and ended, newest first, with their uses and status; a
//!   requester key sees those it may read (`authority::may_read_grant`: made on a run it may
//!   read, or limited to one).
//! - `GET /v1/grants/{id}`: one grant, with the calls it approved (those of runs the caller
//!   may read).
//! - `POST /v1/grants/{id}/revoke`: no use is counted after the answer.

use crate::auth::error::AuthError;
use crate::auth::{Authenticated, Caller, Permission, QueryParams};
use crate::decide::{self, Decider, MAX_TEXT, Proposed};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use countersign_model::authority::{self, Principal};
use countersign_model::grant::{Grant, GrantStatus, GrantTerms, GrantTotal};
use countersign_model::now_ms;
use countersign_model::run::Action;
use countersign_model::span::Span;
use countersign_store::DecidedStatus;
use serde::Deserialize;
use serde_json::{Value, json};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/grants", post(make).get(list))
        .route("/v1/grants/{id}", get(show))
        .route("/v1/grants/{id}/revoke", post(revoke))
}

/// The most grants one listing shows.
const MAX_LIST: usize = 500;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MakeBody {
    run_id: String,
    call_id: String,
    /// The digest of the call as shown.
    digest: String,
    condition: String,
    #[serde(default)]
    same_requester: bool,
    max_uses: u32,
    expires_in: Span,
    /// A cap on what the calls it approves may add up to.
    total: Option<GrantTotal>,
    /// The person deciding, when the key belongs to a system deciding for them.
    decided_by: Option<String>,
}

#[tracing::instrument(skip_all, fields(run_id = %body.run_id))]
async fn make(
    State(state): State<AppState>,
    Authenticated { caller, body, .. }: Authenticated<MakeBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(Permission::Decide)?;
    let (principal, role) = caller.deciding_as(body.decided_by.as_deref(), &state.config)?;
    let by = Decider::api(&principal, role);
    let terms = GrantTerms {
        condition: body.condition,
        same_requester: body.same_requester,
        max_uses: body.max_uses,
        expires_in: body.expires_in,
        total: body.total,
    };
    let proposed = Proposed {
        call_id: body.call_id,
        digest: Some(body.digest),
        action: Action::Approve,
        input: None,
        note: None,
        reason: None,
        grant: Some(terms),
    };
    let call = decide::decide_one(&state, &body.run_id, proposed, &by).await?;
    let now = now_ms();
    let mut answer = json!({
        "run_id": body.run_id, "call_id": call.call_id, "decided_by": principal,
        "resumes": call.all_decided,
    });
    let status = match (&call.grant, call.status) {
        (Some(grant), _) => {
            answer["grant"] = view(&state, grant, now);
            StatusCode::CREATED
        }
        (None, DecidedStatus::ApprovalRecorded | DecidedStatus::AlreadyVoted) => {
            answer["approvals"] = json!(call.approvals);
            answer["quorum"] = json!(call.quorum);
            answer["message"] = json!(
                "your approval is counted; the grant is made once the call's quorum approves it with the same terms"
            );
            StatusCode::ACCEPTED
        }
        (None, _) => {
            answer["message"] = json!(
                "the call is approved, but no grant was made: its approvers did not all send the same terms"
            );
            StatusCode::OK
        }
    };
    Ok((status, Json(answer)))
}

/// A grant as the API shows it: as stored, with its status now.
fn view(state: &AppState, grant: &Grant, now: i64) -> Value {
    let mut value = json!(grant);
    value["status"] = json!(crate::grants::status(state, grant, now));
    value
}

/// Whether `caller` may read `grant` (the rule is `authority::may_read_grant`).
fn readable(caller: &Caller, grant: &Grant) -> bool {
    authority::may_read_grant(caller.as_principal(), &caller.speaks_for, grant)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// `active`, or `all` (the default).
    status: Option<String>,
    agent: Option<String>,
    tool: Option<String>,
    limit: Option<usize>,
}

async fn list(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Read)?;
    let active_only = super::active_only(query.status.as_deref())?;
    let limit = query.limit.unwrap_or(MAX_LIST);
    if !(1..=MAX_LIST).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_LIST}"
        )));
    }
    let now = now_ms();
    let grants: Vec<Value> = state
        .store
        .recent_grants(MAX_LIST)
        .await?
        .iter()
        .filter(|g| readable(&caller, g))
        .filter(|g| query.agent.as_ref().is_none_or(|a| *a == g.agent))
        .filter(|g| query.tool.as_ref().is_none_or(|t| *t == g.tool))
        .filter(|g| !active_only || crate::grants::status(&state, g, now) == GrantStatus::Active)
        .take(limit)
        .map(|g| view(&state, g, now))
        .collect();
    Ok(Json(json!({ "grants": grants })))
}

async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Read)?;
    let grant = state
        .store
        .grant(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no grant {id:?}")))?;
    if !readable(&caller, &grant) {
        return Err(AuthError::Forbidden(format!(
            "the key of {} may read only the grants made on runs it may read",
            caller.principal
        ))
        .into());
    }
    let mut answer = view(&state, &grant, now_ms());
    // The calls it approved, of the runs the caller may read (a requester's key does not
    // learn of another requester's runs through a grant they share).
    let mut used_by = Vec::new();
    for used in state.store.grant_uses(&id).await? {
        if run_readable(&state, &caller, &used.run_id).await? {
            used_by.push(used);
        }
    }
    answer["used_by"] = json!(used_by);
    Ok(Json(answer))
}

/// Whether `caller` may read run `run_id` (`authority::may_read`). A key that reads a run
/// asked for by nobody reads every run, without loading it; for another, a run no longer
/// kept is one it may not read.
async fn run_readable(state: &AppState, caller: &Caller, run_id: &str) -> Result<bool, ApiError> {
    if caller.reading(run_id, None).is_ok() {
        return Ok(true);
    }
    let run = state.run(run_id).await?;
    Ok(run.is_some_and(|r| caller.reading(run_id, r.requested_by.as_deref()).is_ok()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RevokeBody {
    reason: Option<String>,
    /// The person revoking, when the key belongs to a system acting for them.
    revoked_by: Option<String>,
}

async fn revoke(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Authenticated { caller, body, .. }: Authenticated<RevokeBody>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::Decide)?;
    if body.reason.as_ref().is_some_and(|r| r.len() > MAX_TEXT) {
        return Err(ApiError::bad_request(format!(
            "the reason is longer than {MAX_TEXT} bytes"
        )));
    }
    let (principal, role) = caller.deciding_as(body.revoked_by.as_deref(), &state.config)?;
    let revoked = crate::grants::revoke(
        &state,
        &id,
        Principal {
            id: &principal,
            role,
        },
        body.reason,
    )
    .await?;
    Ok(Json(view(&state, &revoked, now_ms())))
}
