//! The run's live events on the inbox's run and request pages: `GET
//! /inbox/runs/{run_id}/events` serves them as the API does (`crate::live`), to the signed-in
//! reviewer under the same reading rule, and the pages' script shows them with one
//! `EventSource`: the model's text as it is written, each call, result, pause, decision and
//! resume as a line in plain words, until the run ends. Each such event also brings the
//! page's own account of the run (its status, what waits, the audit trail) up to date
//! ([`refreshed`]), and on the request page has the page check the call at once
//! (`countersign:run-changed`), rather than at its next look.

use crate::auth::error::AuthError;
use crate::error::ApiError;
use crate::live;
use crate::pages::session::Session;
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

/// Follows the run: a `pre` per turn for the model's text, a line in plain words per other
/// event the stream sends (`words`, which is also the list of events followed). After each,
/// the parts of the page marked `data-refresh` (what [`refreshed`] wraps: the run's status,
/// what waits, the audit trail) are brought up to date from the page as the server renders it
/// now, so a run that ends while its page is open shows as ended; the live log, which the
/// page alone has, stays. A burst of events (the backlog sent when the page opens, a run that
/// resumes and ends at once) fetches the page at most twice: once, then once more after.
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
  var results = {
    executed: 'ran', approved: 'ran, approved', edited: 'ran with the reviewer’s changes',
    rejected: 'did not run, rejected', expired: 'did not run, nobody decided in time',
    cancelled: 'did not run, the run was cancelled', failed: 'failed', unknown: 'outcome unknown, a person should check'
  };
  var decisions = {approve: 'approved', edit: 'approved with changes', reject: 'rejected'};
  // Worded as the command line's `countersign show` words a closed call.
  var superseded = ': closed: its policy changed, so it is checked again';
  var words = {
    'tool.call': function (d) { return d.tool + ' ' + JSON.stringify(d.input) + (d.disposition === 'held' ? ': waits for a person' : d.disposition === 'refused' ? ': refused' : ': runs now'); },
    'tool.result': function (d) { return d.tool + ': ' + (results[d.outcome] || d.outcome) + ': ' + d.content; },
    'approval.requested': function (d) { return 'Paused for a person: ' + d.calls.map(function (c) { return c.summary || c.tool; }).join(', '); },
    'approval.decided': function (d) {
      if (d.superseded) return d.call_id + superseded;
      return d.call_id + ': ' + (decisions[d.action] || d.action) + ' by ' + d.decided_by + (d.door ? ' (' + d.door + ')' : '');
    },
    'approval.expired': function (d) { return d.call_id + ': nobody decided before its deadline'; },
    'approval.reminder': function (d) { return d.call.call_id + (d.escalated ? ': nobody decided in time, so more people are asked' : ': still waits, a reminder was sent'); },
    'approval.cancelled': function (d) { return d.call_id + ': closed, the run was cancelled'; },
    'run.resumed': function () { return 'Resumed'; },
    'run.policy_changed': function (d) {
      switch (d.outcome) {
        case 'superseded': return d.call_id + superseded;
        case 'released': return d.call_id + ': its policy changed and now lets it run without a person';
        case 'reheld': return d.call_id + ': its policy changed, so it is asked again as ' + d.new_call_id;
        case 'refused': return d.call_id + ': its policy changed and it cannot run: ' + d.detail;
        default: return d.call_id + ': its policy changed';
      }
    },
    'run.attention': function (d) { return (d.call_id ? d.tool + ' (' + d.call_id + ')' : 'The run') + ' needs a person to look: ' + d.reason; },
    'run.completed': function (d) { var n = (d.failed_calls || []).length; return 'Completed' + (n ? ', with ' + (n === 1 ? '1 call' : n + ' calls') + ' failed' : ''); },
    'run.failed': function (d) { return 'Failed: ' + d.error; },
    'run.cancelled': function (d) { return 'Cancelled by ' + d.cancelled_by + (d.reason ? ': ' + d.reason : ''); }
  };
  var fetching = false, stale = false;
  function refresh() {
    if (fetching) { stale = true; return; }
    fetching = true;
    fetch(location.href, {credentials: 'same-origin', cache: 'no-store'})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var now = new DOMParser().parseFromString(html, 'text/html');
        document.querySelectorAll('[data-refresh]').forEach(function (old) {
          var fresh = now.querySelector('[data-refresh="' + old.getAttribute('data-refresh') + '"]');
          if (!fresh) return;
          // A fold the reader opened stays open.
          var open = Array.prototype.map.call(old.querySelectorAll('details'), function (d) { return d.open; });
          fresh.querySelectorAll('details').forEach(function (d, i) { d.open = !!open[i]; });
          if (fresh.innerHTML !== old.innerHTML) old.replaceWith(document.adoptNode(fresh));
        });
      })
      .catch(function () {})
      .then(function () {
        fetching = false;
        if (stale) { stale = false; refresh(); }
      });
  }
  source.onopen = function () { state.textContent = 'Following the run as it happens.'; };
  source.onerror = function () { if (source.readyState !== 2) state.textContent = 'Connecting again…'; };
  source.addEventListener('turn.started', function (e) { turn(JSON.parse(e.data).turn).textContent = ''; });
  source.addEventListener('text.delta', function (e) {
    var d = JSON.parse(e.data);
    turn(d.turn).textContent += d.text;
  });
  // The server cut a page that read too slowly; the stream reconnects from its last event.
  source.addEventListener('stream.cut', function () { state.textContent = 'Catching up…'; });
  Object.keys(words).forEach(function (kind) {
    source.addEventListener(kind, function (e) {
      line(words[kind](JSON.parse(e.data)));
      document.dispatchEvent(new CustomEvent('countersign:run-changed'));
      refresh();
      if (kind === 'run.completed' || kind === 'run.failed' || kind === 'run.cancelled') {
        source.close();
        state.textContent = 'The run has ended.';
      }
    });
  });
})();
"#;

/// Marks `parts` as brought up to date by the live section's script: `name` tells them apart
/// from the page's other such parts.
pub(super) fn refreshed(name: &str, parts: Markup) -> Markup {
    html! { div data-refresh=(name) { (parts) } }
}
