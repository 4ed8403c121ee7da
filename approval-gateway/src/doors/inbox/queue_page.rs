//! `GET /inbox`: the calls waiting for this reviewer, nearest deadline first, filtered by
//! agent and tool; `GET /inbox/list` is the same list alone, which the page's script fetches
//! every few seconds to replace only the list (the filter form is left alone).
//!
//! Each row is meant to be decided from: the summary, the requester's own words, the input's
//! values, how long it has waited, the time left (highlighted when short), a short run id,
//! how many of the run's calls failed (linking to them on the run's page), and an Approve
//! button (a plain form, as the request page's, with a confirmation when the script runs).
//! Each row has a checkbox, and the form above the list approves the rows selected, or rejects them with one reason (see `super::batch`); "select all" selects every
//! row the filter lets through. While anything is selected the list is not refreshed, so what
//! is sent is what the page shows. The script adds the keyboard: j/k to move, Enter to open, a/e/r to approve
//! (after a confirmation), edit or reject, x to select, ? for help; it keeps the count in the heading and
//! the tab's title, and marks rows that arrived since the page was opened.
//!
//! A call is listed when the reviewer may approve it, by the rules the decision script
//! applies (see [`super::actions_for`]), so the requester of a run does not see it unless the
//! policy lets them approve their own request.

use super::batch;
use super::next::{self, Recorded};
use super::queue::{Filters, Line, waiting};
use crate::pages::layout::{Page, PageError, short_run_id};
use crate::pages::request_view::SHORT_TIME_LEFT_MS;
use crate::pages::session::Session;
use crate::state::AppState;
use crate::time::{time_left, waited};
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use countersign_model::now_ms;
use maud::{Markup, html};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/inbox", get(page))
        .route("/inbox/list", get(list))
}

/// The first line of what the person asked, cut to a row's length.
fn first_line(text: &str) -> String {
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    cut(line.trim(), 140)
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The input's top-level values that fit a row: `amount 129 · order_id A-1001`.
fn key_values(input: &serde_json::Value) -> String {
    let Some(fields) = input.as_object() else {
        return cut(&input.to_string(), 80);
    };
    fields
        .iter()
        .filter_map(|(name, value)| {
            let shown = match value {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(_) | serde_json::Value::Bool(_) => value.to_string(),
                _ => return None,
            };
            Some(format!("{name} {}", cut(&shown, 40)))
        })
        .take(4)
        .collect::<Vec<_>>()
        .join(" · ")
}

/// The heading, with the count the tab's title repeats.
fn heading(count: usize) -> String {
    format!("Waiting for you ({count})")
}

fn render_list(lines: &[Line], csrf: &str) -> Markup {
    let now = now_ms();
    html! {
        ul #requests .requests aria-live="polite" data-count=(lines.len()) data-heading=(heading(lines.len())) {
            @for line in lines {
                @let path = format!("/inbox/runs/{}/calls/{}", line.run_id, line.call_id);
                li.request data-run=(line.run_id) data-call=(line.call_id) {
                    input.pick type="checkbox" form="batch" name=(batch::PICK)
                        value=(batch::pick_value(&line.run_id, &line.digest, &line.call_id))
                        aria-label=(format!("Select: {}", line.summary));
                    div.row-main {
                        a.open href=(path) { span.summary { (line.summary) } }
                        @let asked = first_line(&line.asked);
                        @if !asked.is_empty() {
                            p.asked { "“" (asked) "” — " (line.requested_by) }
                        }
                        p.values { (key_values(&line.input)) }
                        div.meta {
                            @match line.deadline {
                                Some(d) => span.left.short[d - now < SHORT_TIME_LEFT_MS] { (time_left(d, now)) },
                                None => span.left { "no deadline" },
                            }
                            " · " (waited(line.paused_at, now))
                            " · " (line.agent) " · " (line.tool)
                            " · run " span.run-id title=(line.run_id) { "…" (short_run_id(&line.run_id)) }
                            @if line.failed > 0 {
                                " · " a.failed href=(format!("/inbox/runs/{}#failed-calls", line.run_id)) {
                                    (super::run_page::calls_failed(line.failed))
                                }
                            }
                        }
                    }
                    form.row-approve method="post" action=(path) {
                        input type="hidden" name="csrf" value=(csrf);
                        input type="hidden" name="digest" value=(line.digest);
                        input type="hidden" name="action" value="approve";
                        input type="hidden" name="then" value="queue";
                        button.approve type="submit" aria-label=(format!("Approve: {}", line.summary)) { "Approve" }
                    }
                }
            }
        }
        @if lines.is_empty() {
            p.empty #nothing { "Nothing is waiting for you." }
        }
    }
}

/// The batch actions on the rows selected: approve them, or reject them with one reason
/// (required, by the browser too: Approve skips the check). The rows' checkboxes belong to
/// this form (`form="batch"`), each carrying its run, call and the digest it was rendered
/// with. "Select all" needs the script, which shows it.
fn batch_form(filters: &Filters, count: usize, csrf: &str) -> Markup {
    let matching = if filters.any() {
        "matching the filter"
    } else {
        "waiting"
    };
    html! {
        form #batch .batch method="post" action=(batch::ACTION) hidden[count == 0] {
            input type="hidden" name="csrf" value=(csrf);
            @if let Some(agent) = filters.agent.as_deref().filter(|a| !a.is_empty()) {
                input type="hidden" name="agent" value=(agent);
            }
            @if let Some(tool) = filters.tool.as_deref().filter(|t| !t.is_empty()) {
                input type="hidden" name="tool" value=(tool);
            }
            label.select-all hidden {
                input #select-all type="checkbox";
                " Select all " span #matching { (count) } " " (matching)
            }
            label for="batch-reason" { "Reason, to reject the selected (the agents are told)" }
            textarea #batch-reason name="reason" rows="2" required {}
            div.buttons {
                button.approve type="submit" name="action" value="approve" formnovalidate { "Approve selected" }
                button.reject type="submit" name="action" value="reject" { "Reject selected" }
            }
        }
    }
}

/// Replaces the list (and its empty note) with a fresh copy every few seconds, keeping the
/// count in the heading and the title and marking rows that were not there before; forms on
/// the page are not touched. Adds the keyboard (see the module's comment).
const LIVE: &str = r#"
(function () {
  var url = '/inbox/list' + location.search;
  var seen = {}, fresh = {};
  var chosen = null;
  function key(row) { return row.getAttribute('data-run') + '/' + row.getAttribute('data-call'); }
  function rows() { return Array.prototype.slice.call(document.querySelectorAll('li.request')); }
  rows().forEach(function (row) { seen[key(row)] = true; });
  function counted() {
    var list = document.getElementById('requests');
    if (!list) return;
    var heading = list.getAttribute('data-heading');
    document.querySelector('main h1').textContent = heading;
    var count = list.getAttribute('data-count');
    var batch = document.getElementById('batch');
    if (batch) batch.hidden = count === '0';
    var matching = document.getElementById('matching');
    if (matching) matching.textContent = count;
    document.title = heading + ' · countersign';
  }
  function select(row) {
    rows().forEach(function (r) { r.classList.toggle('selected', r === row); });
    chosen = row ? key(row) : null;
    if (row) row.querySelector('a.open').focus();
  }
  function current() {
    return rows().filter(function (r) { return key(r) === chosen; })[0] || null;
  }
  function picks() { return Array.prototype.slice.call(document.querySelectorAll('#list input.pick')); }
  var selectAll = document.getElementById('select-all');
  if (selectAll) {
    selectAll.closest('label').hidden = false;
    selectAll.addEventListener('change', function () {
      picks().forEach(function (p) { p.checked = selectAll.checked; });
    });
  }
  document.addEventListener('change', function (e) {
    if (selectAll && e.target.matches && e.target.matches('input.pick')) {
      selectAll.checked = picks().every(function (p) { return p.checked; });
    }
  });
  function refresh() {
    // A selection is decided as the page showed it: the list stays until it is sent.
    if (picks().some(function (p) { return p.checked; })) return;
    fetch(url, {credentials: 'same-origin', cache: 'no-store'})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var box = document.getElementById('list');
        if (!box || box.innerHTML === html) return;
        var focused = document.activeElement && box.contains(document.activeElement);
        box.innerHTML = html;
        rows().forEach(function (row) {
          if (!seen[key(row)]) { seen[key(row)] = true; fresh[key(row)] = true; }
          if (!fresh[key(row)]) return;
          row.classList.add('new');
          var badge = document.createElement('span');
          badge.className = 'badge';
          badge.textContent = 'new';
          row.querySelector('a.open').before(badge);
        });
        var row = current();
        if (row) { row.classList.add('selected'); if (focused) row.querySelector('a.open').focus(); }
        counted();
      })
      .catch(function () {});
  }
  function approve(row) {
    var summary = row.querySelector('.summary').textContent;
    if (confirm('Approve “' + summary + '”?')) row.querySelector('form.row-approve').submit();
  }
  document.addEventListener('submit', function (e) {
    var row = e.target.closest && e.target.closest('li.request');
    if (row && e.target.matches('form.row-approve')) { e.preventDefault(); approve(row); }
  });
  document.addEventListener('keydown', function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.target.matches && e.target.matches('input, textarea, select')) return;
    var all = rows(), row = current(), at = all.indexOf(row);
    var open = row && row.querySelector('a.open').getAttribute('href');
    switch (e.key) {
      case 'j': select(all[Math.min(at + 1, all.length - 1)] || null); break;
      case 'k': select(all[Math.max(at - 1, 0)] || null); break;
      case 'Enter': if (!open) return; location.href = open; break;
      case 'a': if (row) approve(row); break;
      case 'x': if (row) { var pick = row.querySelector('input.pick'); pick.checked = !pick.checked; pick.dispatchEvent(new Event('change', {bubbles: true})); } break;
      case 'e': if (open) location.href = open + '#edit'; break;
      case 'r': if (open) location.href = open + '#reject'; break;
      case '?': var help = document.getElementById('keys'); help.hidden = !help.hidden; break;
      default: return;
    }
    e.preventDefault();
  });
  setInterval(refresh, 2500);
})();
"#;

async fn page(
    State(state): State<AppState>,
    session: Session,
    Query(filters): Query<Filters>,
    Query(recorded): Query<Recorded>,
) -> Result<Response, PageError> {
    let lines = waiting(&state, session.principal(), &filters).await?;
    let recorded = next::note(&state, &recorded).await?;
    let catalog = state.catalog();
    let agents: Vec<&str> = catalog.iter().map(|a| a.def.name.as_str()).collect();
    let mut tools: Vec<&str> = catalog
        .iter()
        .flat_map(|a| a.def.tools.iter().map(|t| t.name.as_str()))
        .collect();
    tools.sort_unstable();
    tools.dedup();
    let chosen = |f: &Option<String>, v: &str| f.as_deref() == Some(v);
    let title = heading(lines.len());
    let mut page = Page::new(StatusCode::OK, &title);
    page.signed_in = Some((&session.principal, &session.csrf));
    page.scripts.push(LIVE);
    page.scripts.push(next::FOCUS_NOTE);
    Ok(page.render(html! {
        (recorded)
        form #filters .filters method="get" action="/inbox" {
            label { "Agent "
                select name="agent" {
                    option value="" { "any" }
                    @for a in &agents { option value=(a) selected[chosen(&filters.agent, a)] { (a) } }
                }
            }
            label { "Tool "
                select name="tool" {
                    option value="" { "any" }
                    @for t in &tools { option value=(t) selected[chosen(&filters.tool, t)] { (t) } }
                }
            }
            button type="submit" { "Filter" }
        }
        p.keys-hint { "Keys: " kbd { "j" } " " kbd { "k" } " move, " kbd { "Enter" } " opens, " kbd { "a" } " approves, " kbd { "?" } " all keys." }
        div #keys .card hidden {
            h2 { "Keys" }
            dl {
                dt { kbd { "j" } " / " kbd { "k" } } dd { "next / previous request" }
                dt { kbd { "Enter" } } dd { "open it" }
                dt { kbd { "a" } } dd { "approve it as it is, after you confirm" }
                dt { kbd { "e" } } dd { "open its edit form" }
                dt { kbd { "r" } } dd { "open its reject form" }
                dt { kbd { "x" } } dd { "select it for Approve selected or Reject selected" }
                dt { kbd { "?" } } dd { "show or hide these keys" }
            }
        }
        (batch_form(&filters, lines.len(), &session.csrf))
        div #list { (render_list(&lines, &session.csrf)) }
    }))
}

async fn list(
    State(state): State<AppState>,
    session: Option<Session>,
    Query(filters): Query<Filters>,
) -> Result<Response, PageError> {
    let Some(session) = session else {
        return Ok((StatusCode::UNAUTHORIZED, "sign in again").into_response());
    };
    let lines = waiting(&state, session.principal(), &filters).await?;
    Ok((
        [(axum::http::header::CACHE_CONTROL, "no-store")],
        render_list(&lines, &session.csrf),
    )
        .into_response())
}
