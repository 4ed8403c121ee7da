//! `GET /inbox/grants`: the standing grants a reviewer may act on, which are the grants they
//! may revoke (`crate::grants::may_revoke`): their own, and everyone's on tools whose calls
//! they may decide (all of them for an admin). Active ones first, then those ended (used up,
//! expired, revoked; the store keeps ended grants listed for seven days), newest first in
//! each, each with what it covers, its uses, its expiry, its makers and the call it was made
//! on. `POST /inbox/grants/{id}/revoke` (an active grant's Revoke button, with an optional
//! reason) revokes it through `crate::grants::revoke`, after the same session, CSRF and
//! same-origin checks as every inbox form, and goes back to the page, which says so.

use crate::decide::MAX_TEXT;
use crate::error::ApiError;
use crate::pages::form_fields;
use crate::pages::layout::short_run_id;
use crate::pages::layout::{Page, PageError};
use crate::pages::session::Session;
use crate::state::AppState;
use crate::time::{readable, time_left};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use countersign_model::grant::{Grant, GrantStatus};
use countersign_model::now_ms;
use maud::{Markup, html};
use serde::{Deserialize, Serialize};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route(PATH, get(page))
        .route("/inbox/grants/{id}/revoke", post(revoke))
}

/// The grants page.
pub(super) const PATH: &str = "/inbox/grants";

/// The most grants the page reads, newest first.
const MAX_LISTED: usize = 500;

/// The grant just revoked from the page, as the page's query names it: the page says so
/// only if the store holds it revoked.
#[derive(Default, Deserialize, Serialize)]
struct Revoked {
    revoked: Option<String>,
}

/// A grant's status in words.
fn status_words(status: GrantStatus) -> &'static str {
    match status {
        GrantStatus::Active => "active",
        GrantStatus::UsedUp => "used up",
        GrantStatus::Expired => "expired",
        GrantStatus::Revoked => "revoked",
        GrantStatus::MakerGone => "maker gone",
    }
}

/// What a grant is and how it stands, as the grants page and the page answering the form
/// that made it show it, standing as `status`.
pub(super) fn facts(grant: &Grant, status: GrantStatus, now: i64) -> Markup {
    html! {
        dl.facts {
            dt { "Status" }
            dd.status {
                (status_words(status))
                @if let Some(r) = &grant.revoked {
                    " by " (r.by) " at " (readable(r.at))
                    @if let Some(reason) = &r.reason { ": " (reason) }
                }
            }
            dt { "Covers" }
            dd {
                code { (grant.tool) } " calls of " (grant.agent) " whose input satisfies "
                code.condition { (grant.condition) }
                @if let Some(requester) = &grant.requester { ", in runs requested by " (requester) }
            }
            dt { "Uses" } dd.uses { (grant.uses) " of " (grant.max_uses) }
            @if let Some(total) = &grant.total {
                dt { "Total" }
                dd.total { (grant.spent) " of " (total.max) ", the sum of " code { (total.sum) } }
            }
            dt { @if status == GrantStatus::Expired { "Expired" } @else { "Expires" } }
            dd {
                (readable(grant.expires_at))
                @if status == GrantStatus::Active { " (" (time_left(grant.expires_at, now)) ")" }
            }
            dt { "Made by" }
            dd { (grant.granted_by.join(", ")) " via " (grant.channel) " at " (readable(grant.created_at)) }
            dt { "Made on" }
            dd {
                a href=(format!("/inbox/runs/{}/calls/{}", grant.run_id, grant.call_id)) {
                    "call " (grant.call_id) " of run …" (short_run_id(&grant.run_id))
                }
            }
        }
    }
}

async fn page(
    State(state): State<AppState>,
    session: Session,
    Query(revoked): Query<Revoked>,
) -> Result<Response, PageError> {
    let now = now_ms();
    let mut grants: Vec<Grant> = state
        .store
        .recent_grants(MAX_LISTED)
        .await?
        .into_iter()
        .filter(|g| crate::grants::may_revoke(&state, g, session.principal()))
        .collect();
    // Stable: newest first among the active, then among the ended.
    grants.sort_by_key(|g| crate::grants::status(&state, g, now) != GrantStatus::Active);
    let just_revoked = revoked
        .revoked
        .and_then(|id| grants.iter().find(|g| g.id == id && g.revoked.is_some()));
    let mut page = Page::new(StatusCode::OK, "Standing grants");
    page.signed_in = Some((&session.principal, &session.csrf));
    Ok(page.render(html! {
        @if let Some(g) = just_revoked {
            p.recorded role="status" {
                strong { "Revoked: " } "grant " (g.id) " approves nothing from now on."
            }
        }
        p {
            "Calls approved in advance: each grant approves the calls it covers, in its makers' \
             names, until it is used up, expires or is revoked. Listed: your grants, and those \
             on tools whose calls you may decide."
        }
        @if grants.is_empty() {
            p.empty #no-grants { "There are no grants for you to see." }
        }
        ul #grants .grants {
            @for g in &grants {
                @let status = crate::grants::status(&state, g, now);
                li.grant data-grant=(g.id) data-status=(status_words(status)) {
                    h2 { "Grant " span.grant-id { (g.id) } }
                    (facts(g, status, now))
                    // One whose maker is gone would approve again were they restored.
                    @if matches!(status, GrantStatus::Active | GrantStatus::MakerGone) {
                        form.revoke method="post" action=(format!("/inbox/grants/{}/revoke", g.id)) {
                            input type="hidden" name="csrf" value=(session.csrf);
                            @let reason = format!("reason-{}", g.id);
                            label for=(reason) { "Reason (optional)" }
                            input id=(reason) type="text" name="reason" maxlength=(MAX_TEXT);
                            button.reject type="submit" { "Revoke" }
                        }
                    }
                }
            }
        }
    }))
}

async fn revoke(
    State(state): State<AppState>,
    session: Session,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, PageError> {
    let fields = form_fields(&body);
    if let Err(refused) = session.check_csrf(&fields) {
        return Ok(refused.into_response());
    }
    let reason = fields
        .get("reason")
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty());
    if reason.as_ref().is_some_and(|r| r.len() > MAX_TEXT) {
        return Err(ApiError::bad_request(format!(
            "The reason is longer than {MAX_TEXT} bytes: nothing was revoked."
        ))
        .into());
    }
    let revoked = crate::grants::revoke(&state, &id, session.principal(), reason).await?;
    let query = serde_urlencoded::to_string(Revoked {
        revoked: Some(revoked.id),
    })
    .unwrap_or_default();
    Ok(Redirect::to(&format!("{PATH}?{query}")).into_response())
}
