//! A request's page: `GET /inbox/runs/{run_id}/calls/{call_id}` shows the call (see
//! [`CallView`]) with the forms the reviewer may use; `POST` to the same path decides through
//! `crate::decide`, as channel `web`, quoting the digest the page was rendered from, so a
//! call that changed in between is refused, never approved blind. A decision recorded is
//! answered 303 to the next request waiting for the reviewer (see `super::next`), which says
//! what was recorded. `…/state` tells the page's script whether the call was decided
//! elsewhere meanwhile, and who else has it open (a presence note in Redis that lapses within
//! seconds of a page closing).

use super::CHANNEL;
use super::allow_similar;
use super::live_view::refreshed;
use super::next::{self, Recorded};
use crate::decide::{self, DecideError, Decider};
use crate::error::ApiError;
use crate::pages::form_fields;
use crate::pages::forms::{self, FieldErrors, Forms, Typed};
use crate::pages::layout::{Page, PageError};
use crate::pages::request_view::{CallView, refusal_words};
use crate::pages::session::Session;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Json, Router};
use countersign_model::authority::{self, RunFacts};
use countersign_model::run::{Action, RunId};
use maud::{Markup, html};
use serde_json::json;
use std::time::Duration;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/inbox/runs/{run_id}/calls/{call_id}",
            get(show).post(submit),
        )
        .route(
            "/inbox/runs/{run_id}/calls/{call_id}/state",
            get(call_state),
        )
}

/// Every few seconds, and at once when the run's live events say something happened, asks
/// whether the call is still open; once it is not, says how it ended
/// in the action bar's live region (beside the buttons, announced to screen readers), hides
/// the bar's buttons and links and disables the forms below, leaving what was typed in place.
/// Keeps the presence note current, and says under the edit form what its fields change
/// (`amount: 129 → 50`).
///
/// One question at a time: a burst of events (a run that resumes and ends at once, or a page
/// that catches up on them) asks once more after the answer in flight rather than once per
/// event, and the page is marked decided once, so its notes are never written twice.
const LIVE: &str = r#"
(function () {
  var main = document.querySelector('main');
  var shown = main.getAttribute('data-digest');
  var status = document.getElementById('status');
  if (!status || !document.querySelector('form.decide')) return;
  var asking = false, again = false, settled = false;
  var timer = setInterval(check, 2500);
  // The run's live events (the live section's script) say at once that something happened.
  document.addEventListener('countersign:run-changed', check);
  function check() {
    if (settled) return;
    if (asking) { again = true; return; }
    asking = true;
    fetch(location.pathname + '/state', {credentials: 'same-origin', cache: 'no-store'})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) {
        var presence = document.getElementById('presence');
        if (s && presence) {
          var text = s.others && s.others.length ? 'Also looking at this: ' + s.others.join(', ') : '';
          if (presence.textContent !== text) presence.textContent = text;
        }
        if (!s || (s.open && s.digest === shown)) return;
        settle(s.open
          ? 'This request changed since this page was opened. Reload the page to see it as it is now.'
          : s.outcome);
      })
      .catch(function () {})
      .then(function () {
        asking = false;
        if (again) { again = false; check(); }
      });
  }
  function settle(said) {
    settled = true;
    clearInterval(timer);
    document.removeEventListener('countersign:run-changed', check);
    var note = document.createElement('p');
    note.className = 'outcome';
    note.textContent = said;
    status.replaceChildren(note);
    // The bar keeps only the note: its Approve and the links to the forms below are gone.
    document.querySelectorAll('nav.actions .buttons').forEach(function (b) { b.hidden = true; });
    document.querySelectorAll('form.decide input, form.decide textarea, form.decide select, form.decide button')
      .forEach(function (el) { el.disabled = true; });
    document.querySelectorAll('form.decide').forEach(function (f) {
      if (f.closest('nav.actions')) return;
      var copy = document.createElement('p');
      copy.className = 'outcome';
      copy.textContent = said;
      f.insertBefore(copy, f.firstChild);
    });
  }
})();
(function () {
  var edit = document.getElementById('edit');
  var change = document.getElementById('change');
  if (!edit || !change || !edit.getAttribute('data-before')) return;
  var before = JSON.parse(edit.getAttribute('data-before'));
  function show() {
    var lines = [];
    Object.keys(before).forEach(function (name) {
      var field = edit.elements['input.' + name];
      if (!field) return;
      var now = field.type === 'checkbox' ? String(field.checked) : field.value.trim();
      if (now !== before[name]) {
        lines.push(name + ': ' + (before[name] || '(none)') + ' → ' + (now || '(none)'));
      }
    });
    change.textContent = lines.length ? 'Your change: ' + lines.join('; ') : '';
  }
  edit.addEventListener('input', show);
  edit.addEventListener('change', show);
  show();
})();
"#;

/// The page, built around the decision: the action bar first (at the top on a wide screen,
/// fixed at the bottom of a phone's), then what the decision needs, the edit and reject
/// forms, and the evidence folded below; `error` above the forms, field errors beside their
/// fields, what was typed kept; `recorded` says what the reviewer's last decision was.
fn render(
    state: &AppState,
    (session, delegators): (&Session, &[String]),
    view: &CallView,
    status: StatusCode,
    typed: &Typed,
    errors: &FieldErrors,
    recorded: Markup,
) -> Response {
    let actions = actions_of(session, delegators, view);
    let offer = allow_similar::offer(state, view, &actions);
    // Without the form, what was wrong with its terms (sent by hand) is said above the others.
    let errors = &match offer {
        Some(_) => errors.clone(),
        None => errors
            .iter()
            .map(
                |(field, e)| match field.starts_with(allow_similar::ERRORS) {
                    true => ("form".to_string(), e.clone()),
                    false => (field.clone(), e.clone()),
                },
            )
            .collect(),
    };
    let mut page = Page::new(status, &view.summary);
    page.signed_in = Some((&session.principal, &session.csrf));
    page.digest = Some(&view.digest);
    if view.open.is_some() {
        page.scripts.push(LIVE);
    }
    page.scripts.push(super::live_view::SCRIPT);
    page.scripts.push(next::FOCUS_NOTE);
    let schema = view.schema(state);
    let forms = Forms {
        csrf: Some(&session.csrf),
        digest: &view.digest,
        actions: &actions,
        schema: schema.as_ref(),
        input: &view.input,
        typed,
        errors,
    };
    let said = html! {
        div #status aria-live="polite" {
            @if let Some(outcome) = &view.outcome { p.outcome { (outcome) } }
            @else if actions.is_empty() {
                p.notice { "You are not among the approvers of this request, so you can only look." }
            } @else if !actions.contains(&Action::Approve) {
                p.notice { "You asked for this run, so you may reject it but not approve it." }
            }
        }
    };
    page.render(html! {
        (recorded)
        // With the forms, the page's script says in the bar when the call is decided; without,
        // the live section's script brings `said` up to date, as it does the facts.
        @if view.open.is_some() && !actions.is_empty() {
            (forms.bar(html! { @if let Some(o) = &offer { (o.link()) } }, said))
        } @else { (refreshed("status", said)) }
        (refreshed("facts", view.facts(true)))
        @if view.open.is_some() {
            (forms.below(html! {
                @if let Some(o) = &offer { (o.render(&session.csrf, &view.digest, typed, errors)) }
            }))
        }
        (view.evidence())
        (super::live_view::section(&view.run_id))
    })
}

/// What the reviewer (in the place of `delegators`, who handed them their approvals) may do
/// with the call: nothing once it is no longer open.
fn actions_of(session: &Session, delegators: &[String], view: &CallView) -> Vec<Action> {
    match &view.open {
        // A call is open only while its run waits and nobody asked to cancel it.
        Some(call) => authority::actions_for_delegate(
            session.principal(),
            delegators,
            call,
            RunFacts {
                requested_by: view.requested_by.as_deref(),
                cancelling: false,
            },
        ),
        None => Vec::new(),
    }
}

/// A refused decision as the page shows it: its status, its words, and the field they go
/// beside (the allow-similar form's terms when the refusal is about them).
fn refusal_shown(refused: DecideError, with_grant: bool) -> (StatusCode, String, &'static str) {
    match with_grant {
        true => match allow_similar::refused(refused) {
            (status, message, true) => (status, message, allow_similar::ERRORS),
            (status, message, false) => (status, message, "form"),
        },
        false => {
            let (status, message) = refusal_words(&refused);
            let status = status.unwrap_or_else(|| ApiError::from(refused).status);
            (status, message, "form")
        }
    }
}

/// How long a reviewer counts as looking at a request after their page last asked: a few
/// of the page's polls.
const PRESENCE_TTL: Duration = Duration::from_secs(15);

/// Notes `session`'s reviewer on the call's page and returns who else has it open; nobody
/// once it is decided (it matters only while it is open).
async fn others_looking(
    state: &AppState,
    session: &Session,
    view: &CallView,
) -> Result<Vec<String>, ApiError> {
    let Some(run_id) = RunId::parse(&view.run_id).filter(|_| view.open.is_some()) else {
        return Ok(Vec::new());
    };
    Ok(state
        .store
        .present(&run_id, &view.call_id, &session.principal, PRESENCE_TTL)
        .await?)
}

/// "Also looking at this: alice, bob", in a live region the page's script keeps current.
fn presence(others: &[String]) -> Markup {
    html! {
        p #presence .presence aria-live="polite" {
            @if !others.is_empty() { "Also looking at this: " (others.join(", ")) }
        }
    }
}

/// The call a page is about; a 404 page if there is no such call.
async fn view_of(state: &AppState, run_id: &str, call_id: &str) -> Result<CallView, PageError> {
    CallView::load(state, run_id, call_id)
        .await?
        .ok_or_else(|| {
            PageError(ApiError::not_found(format!(
                "There is no request {call_id} in run {run_id}."
            )))
        })
}

async fn show(
    State(state): State<AppState>,
    session: Session,
    Path((run_id, call_id)): Path<(String, String)>,
    Query(recorded): Query<Recorded>,
) -> Result<Response, PageError> {
    let view = view_of(&state, &run_id, &call_id).await?;
    let delegators = decide::delegators(&state, &session.principal).await?;
    let mut recorded = next::note(&state, &recorded).await?;
    if view.open.is_some() {
        let others = others_looking(&state, &session, &view).await?;
        recorded = html! { (recorded) (presence(&others)) };
    }
    Ok(render(
        &state,
        (&session, &delegators),
        &view,
        StatusCode::OK,
        &Typed::new(),
        &FieldErrors::new(),
        recorded,
    ))
}

async fn submit(
    State(state): State<AppState>,
    session: Session,
    Path((run_id, call_id)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, PageError> {
    let typed = form_fields(&body);
    if let Err(refused) = session.check_csrf(&typed) {
        return Ok(refused.into_response());
    }
    let view = view_of(&state, &run_id, &call_id).await?;
    let delegators = decide::delegators(&state, &session.principal).await?;
    let again = |status, errors: FieldErrors| {
        let who = (&session, delegators.as_slice());
        render(&state, who, &view, status, &typed, &errors, html! {})
    };
    if view.open.is_none() {
        // Decided meanwhile: the page says how, and nothing is recorded.
        return Ok(again(StatusCode::CONFLICT, FieldErrors::new()));
    }
    let digest = typed.get("digest").cloned().unwrap_or_default();
    let read = match typed.get("action").map(String::as_str) {
        Some(allow_similar::ACTION) => allow_similar::grant_from_form(&view, &typed, &digest)
            .map_err(|errors| (StatusCode::BAD_REQUEST, errors)),
        _ => forms::decision_from_form(&state, &view, &typed, &digest)
            .map_err(|errors| (StatusCode::UNPROCESSABLE_ENTITY, errors)),
    };
    let proposed = match read {
        Ok(proposed) => proposed,
        Err((status, errors)) => return Ok(again(status, errors)),
    };
    let terms = proposed.grant.clone();
    let by = Decider {
        principal: &session.principal,
        role: session.role,
        door: CHANNEL,
        link: None,
        grant: None,
        delegation: None,
        model: false,
    };
    let refused = match (
        decide::decide_one(&state, &run_id, proposed, &by).await,
        &terms,
    ) {
        (Ok(call), Some(terms)) => {
            let next =
                next::after_decision(&state, session.principal(), &run_id, &call_id, false).await?;
            return Ok(allow_similar::answered(
                &state, &session, &view, &call, terms, &next,
            ));
        }
        (Ok(_), None) => {
            let to_queue = typed.get("then").is_some_and(|t| t == "queue");
            let next =
                next::after_decision(&state, session.principal(), &run_id, &call_id, to_queue)
                    .await?;
            return Ok(Redirect::to(&next).into_response());
        }
        (Err(e), _) => e,
    };
    let (status, message, field) = refusal_shown(refused, terms.is_some());
    // Shown as the call is now: a changed call with its new digest, a decided one with its
    // outcome and no forms.
    let view = view_of(&state, &run_id, &call_id).await?;
    Ok(render(
        &state,
        (&session, &delegators),
        &view,
        status,
        &typed,
        &FieldErrors::from([(field.to_string(), vec![message])]),
        html! {},
    ))
}

/// Whether the call is still open, with the digest it is held with, or how it ended; and
/// who else has its page open (the asking page's reviewer is noted as looking).
async fn call_state(
    State(state): State<AppState>,
    session: Option<Session>,
    Path((run_id, call_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let Some(session) = session else {
        return Err(ApiError::for_status(
            StatusCode::UNAUTHORIZED,
            "sign in again",
        ));
    };
    let view = CallView::load(&state, &run_id, &call_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no call {call_id:?} in run {run_id:?}")))?;
    let others = others_looking(&state, &session, &view).await?;
    Ok(Json(json!({
        "open": view.open.is_some(),
        "digest": view.digest,
        "outcome": view.outcome,
        "others": others,
    }))
    .into_response())
}
