//! The run's live events on the inbox's run and request pages: `GET
//! /inbox/runs/{run_id}/events` serves them as the API does (`crate::live`), to the signed-in
//! reviewer under the same reading rule, and the pages' script shows them with one
//! `EventSource`: the model's text as it is written, each call, result, pause, decision and
//! resume as a line, until the run ends. On the request page, an event about the run also
//! has the page check the call at once (`countersign:run-changed`), rather than at its next
//! look.

use super::session::Session;
use crate::auth::error::AuthError;
use crate::error::ApiError;
use crate::live;
use crate::server::ConnectionSlot;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use maud::{Markup, html};
use tokio_util::sync::CancellationToken;

pub(super) fn router(stop: CancellationToken) -> Router<AppState> {
    Router::new().route(
        "/inbox/runs/{run_id}/events",
        get(move |state, session, slot, path, headers| {
            events(state, session, slot, path, headers, stop)
        }),
    )
}

/// The stream from its start, so that a page shows the run's story from the beginning; an
/// `EventSource` that reconnects sends `Last-Event-ID` itself and carries on from there.
async fn events(
    State(state): State<AppState>,
    session: Session,
    slot: Option<Extension<ConnectionSlot>>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    stop: CancellationToken,
) -> Result<Response, ApiError> {
    let run = state
        .run(&run_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run {run_id:?}")))?;
    if !countersign_model::authority::may_read(
        session.principal(),
        &[],
        run.requested_by.as_deref(),
    ) {
        let refusal = format!("{} may not read run {run_id:?}", session.principal);
        return Err(AuthError::Forbidden(refusal).into());
    }
    let follower = live::Follower {
        principal: &session.principal,
        slot: slot.map(|Extension(slot)| slot),
    };
    let after = live::resume_point(&headers, None)?;
    live::answer(&state, &run, after, follower, stop).await
}

/// Where the page shows the run live; without JavaScript it stays as rendered.
pub(super) fn section(run_id: &str) -> Markup {
    html! {
        section #live data-events=(format!("/inbox/runs/{run_id}/events")) {
            h2 { "Live" }
            p.live-state aria-live="polite" { "Shown as it happens when scripts run." }
            div #live-log {}
        }
    }
}

/// Follows the run: a `pre` per turn for the model's text, a line per other event.
pub(super) const SCRIPT: &str = r#"
(function () {
  var box = document.getElementById('live');
  if (!box || !window.EventSource) return;
  var log = document.getElementById('live-log');
  var state = box.querySelector('.live-state');
  var turns = {};
  var source = new EventSource(box.getAttribute('data-events'));
  function line(text) {
    var p = document.createElement('p');
    p.className = 'happening';
    p.textContent = text;
    log.appendChild(p);
  }
  function turn(n) {
    if (!turns[n]) {
      turns[n] = document.createElement('pre');
      turns[n].className = 'turn';
      log.appendChild(turns[n]);
    }
    return turns[n];
  }
  function said(kind, d) {
    switch (kind) {
      case 'tool.call': return d.tool + ' ' + JSON.stringify(d.input) + (d.disposition === 'held' ? ': waits for a person' : d.disposition === 'refused' ? ': refused' : ': runs now');
      case 'tool.result': return d.tool + ': ' + d.outcome + ': ' + d.content;
      case 'approval.requested': return 'Paused for a person: ' + d.calls.map(function (c) { return c.summary || c.tool; }).join(', ');
      case 'approval.decided': return d.call_id + ': ' + d.action + ' by ' + d.decided_by + (d.door ? ' (' + d.door + ')' : '');
      case 'approval.expired': return d.call_id + ': nobody decided before its deadline';
      case 'approval.reminder': return d.call.call_id + (d.escalated ? ': escalated' : ': reminder sent');
      case 'approval.cancelled': return d.call_id + ': closed, the run was cancelled';
      case 'run.resumed': return 'Resumed';
      case 'run.completed': return 'Completed';
      case 'run.failed': return 'Failed: ' + d.error;
      case 'run.cancelled': return 'Cancelled by ' + d.cancelled_by;
      default: return kind;
    }
  }
  source.onopen = function () { state.textContent = 'Following the run as it happens.'; };
  source.onerror = function () { if (source.readyState !== 2) state.textContent = 'Connecting again…'; };
  source.addEventListener('turn.started', function (e) { turn(JSON.parse(e.data).turn).textContent = ''; });
  source.addEventListener('text.delta', function (e) {
    var d = JSON.parse(e.data);
    turn(d.turn).textContent += d.text;
  });
  ['tool.call', 'tool.result', 'approval.requested', 'approval.decided', 'approval.expired',
   'approval.reminder', 'approval.cancelled', 'run.resumed', 'run.attention', 'run.policy_changed',
   'run.completed', 'run.failed', 'run.cancelled'].forEach(function (kind) {
    source.addEventListener(kind, function (e) {
      line(said(kind, JSON.parse(e.data)));
      document.dispatchEvent(new CustomEvent('countersign:run-changed'));
      if (kind === 'run.completed' || kind === 'run.failed' || kind === 'run.cancelled') {
        source.close();
        state.textContent = 'The run has ended.';
      }
    });
  });
})();
"#;
