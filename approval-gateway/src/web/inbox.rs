//! `GET /inbox`: the calls waiting for this reviewer, nearest deadline first, filtered by
//! agent and tool; `GET /inbox/list` is the same list alone, which the page's script fetches
//! every few seconds to replace only the list (the filter form is left alone).
//!
//! A call is listed when the reviewer may approve it, by the rules the decision script
//! applies (see [`super::actions_for`]), so the requester of a run does not see it unless the
//! policy lets them approve their own request.

use super::layout::{Page, PageError};
use super::next::{self, Recorded};
use super::session::Session;
use crate::error::ApiError;
use crate::runs;
use crate::state::AppState;
use crate::time::time_left;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use countersign_shared::authority::{self, Principal, RunFacts};
use countersign_shared::now_ms;
use countersign_shared::run::Action;
use maud::{Markup, html};
use serde::Deserialize;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/inbox", get(page))
        .route("/inbox/list", get(list))
}

/// At most this many paused runs are read for one inbox; the oldest come first.
const MAX_RUNS: usize = 1000;
const BATCH: usize = 200;

#[derive(Default, Deserialize)]
pub(super) struct Filters {
    agent: Option<String>,
    tool: Option<String>,
}

impl Filters {
    fn keeps(&self, agent: &str, tool: &str) -> bool {
        let matches = |filter: &Option<String>, value: &str| {
            filter.as_deref().is_none_or(|f| f.is_empty() || f == value)
        };
        matches(&self.agent, agent) && matches(&self.tool, tool)
    }
}

/// One line of the inbox.
pub(super) struct Line {
    pub(super) run_id: String,
    pub(super) call_id: String,
    summary: String,
    agent: String,
    tool: String,
    requested_by: String,
    deadline: Option<i64>,
    paused_at: i64,
}

/// The calls `principal` may approve now, nearest deadline first (none last), then oldest.
pub(super) async fn waiting(
    state: &AppState,
    principal: Principal<'_>,
    filters: &Filters,
) -> Result<Vec<Line>, ApiError> {
    let mut lines = Vec::new();
    let mut after = None;
    let mut read = 0;
    loop {
        let batch = state.store.awaiting(after.as_ref(), BATCH).await?;
        let exhausted = batch.len() < BATCH;
        read += batch.len();
        for at in &batch {
            let Some((run, calls)) = runs::awaiting_decision(state, &at.run_id).await? else {
                continue;
            };
            for call in calls {
                let may = authority::actions_for(principal, &call, RunFacts::of(&run));
                if !may.contains(&Action::Approve) || !filters.keeps(&run.agent, &call.tool) {
                    continue;
                }
                lines.push(Line {
                    run_id: run.run_id.to_string(),
                    call_id: call.call_id,
                    summary: call.summary,
                    agent: run.agent.clone(),
                    tool: call.tool,
                    requested_by: run.requested_by.clone().unwrap_or_else(|| "unknown".into()),
                    deadline: call.deadline,
                    paused_at: at.since_ms,
                });
            }
        }
        after = batch.last().cloned();
        if exhausted || read >= MAX_RUNS {
            break;
        }
    }
    lines.sort_by_key(|l| (l.deadline.is_none(), l.deadline, l.paused_at));
    Ok(lines)
}

fn render_list(lines: &[Line]) -> Markup {
    let now = now_ms();
    html! {
        ul #requests .requests aria-live="polite" {
            @for line in lines {
                li.request data-run=(line.run_id) data-call=(line.call_id) {
                    a.open href=(format!("/inbox/runs/{}/calls/{}", line.run_id, line.call_id)) {
                        span.summary { (line.summary) }
                    }
                    div.meta {
                        (line.agent) " · " (line.tool) " · asked by " (line.requested_by) " · "
                        span.left {
                            @match line.deadline {
                                Some(d) => (time_left(d, now)),
                                None => "no deadline",
                            }
                        }
                    }
                }
            }
        }
        @if lines.is_empty() {
            p.empty #nothing { "Nothing is waiting for you." }
        }
    }
}

/// Replaces the list (and its empty note) with a fresh copy every few seconds; forms on the
/// page are not touched.
const LIVE: &str = r#"
(function () {
  var url = '/inbox/list' + location.search;
  function refresh() {
    fetch(url, {credentials: 'same-origin', cache: 'no-store'})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var box = document.getElementById('list');
        if (box && box.innerHTML !== html) box.innerHTML = html;
      })
      .catch(function () {});
  }
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
    let agents: Vec<&str> = state.catalog.iter().map(|a| a.def.name.as_str()).collect();
    let mut tools: Vec<&str> = state
        .catalog
        .iter()
        .flat_map(|a| a.def.tools.iter().map(|t| t.name.as_str()))
        .collect();
    tools.sort_unstable();
    tools.dedup();
    let chosen = |f: &Option<String>, v: &str| f.as_deref() == Some(v);
    let mut page = Page::new(StatusCode::OK, "Waiting for you");
    page.signed_in = Some((&session.principal, &session.csrf));
    page.script = Some(LIVE);
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
        div #list { (render_list(&lines)) }
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
        render_list(&lines),
    )
        .into_response())
}
