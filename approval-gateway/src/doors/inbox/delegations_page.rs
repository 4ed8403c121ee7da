//! `GET /inbox/delegations`: the delegations a reviewer made or received (all of them for an
//! admin), standing ones first, and a form to hand their approvals to someone for a while.
//! `POST /inbox/delegations` makes one and `POST /inbox/delegations/{id}/end` ends one,
//! through `crate::delegations` (the rule of who may is `authority::may_delegate` and
//! `may_touch_delegation`), after the same session, CSRF and same-origin checks as every inbox
//! form; each goes back to the page, which says what was done.

use crate::decide::MAX_TEXT;
use crate::error::ApiError;
use crate::pages::form_fields;
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
use countersign_model::authority;
use countersign_model::delegation::{Delegation, DelegationStatus, DelegationTerms};
use countersign_model::now_ms;
use maud::html;
use serde::{Deserialize, Serialize};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route(PATH, get(page).post(make))
        .route("/inbox/delegations/{id}/end", post(end))
}

/// The delegations page.
pub(super) const PATH: &str = "/inbox/delegations";

/// What the page was sent back with: the delegation just made or ended.
#[derive(Default, Deserialize, Serialize)]
struct Done {
    made: Option<String>,
    ended: Option<String>,
}

fn status_words(status: DelegationStatus) -> &'static str {
    match status {
        DelegationStatus::Active => "active",
        DelegationStatus::Ended => "ended",
        DelegationStatus::Expired => "expired",
    }
}

async fn page(
    State(state): State<AppState>,
    session: Session,
    Query(done): Query<Done>,
) -> Result<Response, PageError> {
    let now = now_ms();
    let who = session.principal();
    let mut listed: Vec<Delegation> = state
        .store
        .delegations()
        .await?
        .into_iter()
        .filter(|d| authority::may_touch_delegation(who, d))
        .collect();
    // Stable: newest first among the standing, then among the ended.
    listed.sort_by_key(|d| d.status(now) != DelegationStatus::Active);
    let others: Vec<&str> = state
        .config
        .people
        .iter()
        .map(|p| p.id.as_str())
        .filter(|p| *p != session.principal)
        .collect();
    let mut page = Page::new(StatusCode::OK, "Delegations");
    page.signed_in = Some((&session.principal, &session.csrf));
    Ok(page.render(html! {
        @if let Some(id) = &done.made {
            p.recorded role="status" { strong { "Delegated: " } "delegation " (id) " stands from now." }
        }
        @if let Some(id) = &done.ended {
            p.recorded role="status" { strong { "Ended: " } "nothing is decided under delegation " (id) " from now on." }
        }
        p {
            "Hand your approvals to someone for a while: they decide the calls held for you, \
             in both your names, never a run they asked for themselves, until the end you set \
             or until either of you ends it."
        }
        form #delegate .delegate method="post" action=(PATH) {
            input type="hidden" name="csrf" value=(session.csrf);
            label for="to" { "To" }
            select #to name="to" required {
                @for p in &others { option value=(p) { (p) } }
            }
            label for="for" { "For" }
            input #for type="text" name="for" value="7d" required placeholder="8h, 7d";
            label for="reason" { "Reason (optional)" }
            input #reason type="text" name="reason" maxlength=(MAX_TEXT);
            button.approve type="submit" { "Delegate" }
        }
        @if listed.is_empty() {
            p.empty #no-delegations { "You have made and received no delegations." }
        }
        ul #delegations .delegations {
            @for d in &listed {
                @let status = d.status(now);
                li.delegation data-delegation=(d.id) data-status=(status_words(status)) {
                    h2 { (d.to) " for " (d.from) }
                    dl.facts {
                        dt { "Status" }
                        dd.status {
                            (status_words(status))
                            @if let Some(e) = &d.ended {
                                " by " (e.by) " at " (readable(e.at))
                                @if let Some(reason) = &e.reason { ": " (reason) }
                            }
                        }
                        dt { "Ends" }
                        dd {
                            (readable(d.ends_at))
                            @if status == DelegationStatus::Active { " (" (time_left(d.ends_at, now)) ")" }
                        }
                        dt { "Made" } dd { "by " (d.created_by) " at " (readable(d.created_at)) }
                        @if let Some(reason) = &d.reason { dt { "Reason" } dd { (reason) } }
                    }
                    @if status == DelegationStatus::Active {
                        form.end method="post" action=(format!("/inbox/delegations/{}/end", d.id)) {
                            input type="hidden" name="csrf" value=(session.csrf);
                            button.reject type="submit" { "End" }
                        }
                    }
                }
            }
        }
    }))
}

async fn make(
    State(state): State<AppState>,
    session: Session,
    body: Bytes,
) -> Result<Response, PageError> {
    let fields = form_fields(&body);
    if let Err(refused) = session.check_csrf(&fields) {
        return Ok(refused.into_response());
    }
    let field = |name: &str| fields.get(name).map(|v| v.trim().to_string());
    let lasts = field("for")
        .unwrap_or_default()
        .parse()
        .map_err(|e| ApiError::bad_request(format!("For: {e}; nothing was delegated.")))?;
    let terms = DelegationTerms {
        from: None,
        to: field("to").unwrap_or_default(),
        lasts,
        reason: field("reason").filter(|r| !r.is_empty()),
    };
    let made = crate::delegations::make(&state, session.principal(), terms).await?;
    back(Done {
        made: Some(made.id),
        ended: None,
    })
}

async fn end(
    State(state): State<AppState>,
    session: Session,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, PageError> {
    let fields = form_fields(&body);
    if let Err(refused) = session.check_csrf(&fields) {
        return Ok(refused.into_response());
    }
    let ended = crate::delegations::end(&state, &id, session.principal(), None).await?;
    back(Done {
        made: None,
        ended: Some(ended.id),
    })
}

/// The page again, saying what was done.
fn back(done: Done) -> Result<Response, PageError> {
    let query = serde_urlencoded::to_string(done).unwrap_or_default();
    Ok(Redirect::to(&format!("{PATH}?{query}")).into_response())
}
