//! `POST /inbox/batch`: the queue's batch form, approving or rejecting (with one reason) the
//! calls the reviewer selected. Each selected row sends its run, its call and the digest the
//! page was rendered with, so a call that changed since is refused by its run's script while
//! the others are recorded. The calls are decided as the API's batch decides them
//! ([`decide::decide_batch`]: each run by its own script step), as channel `web`; the answer
//! is a page saying what became of each.

use super::queue::Filters;
use crate::decide::{self, DecideError, Decider, Proposed, RunDecided};
use crate::error::ApiError;
use crate::pages::layout::short_run_id;
use crate::pages::layout::{Page, PageError};
use crate::pages::request_view::{CallView, refusal_words};
use crate::pages::session::Session;
use crate::state::AppState;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use countersign_model::run::Action;
use countersign_store::{CallDecided, DecidedStatus, RefusalCode};
use maud::{Markup, html};
use std::collections::HashMap;

pub(super) fn router() -> Router<AppState> {
    Router::new().route(ACTION, post(submit))
}

/// Where the queue's batch form posts.
pub(super) const ACTION: &str = "/inbox/batch";

/// The form field each selected row sends, and its value: `RUN DIGEST CALL` (a run id and a
/// digest hold no space; a call id, last, is taken whole).
pub(super) const PICK: &str = "call";

pub(super) fn pick_value(run_id: &str, digest: &str, call_id: &str) -> String {
    format!("{run_id} {digest} {call_id}")
}

fn read_pick(value: &str) -> Option<(String, String, String)> {
    let mut parts = value.splitn(3, ' ');
    let (run_id, digest, call_id) = (parts.next()?, parts.next()?, parts.next()?);
    (!run_id.is_empty() && !call_id.is_empty())
        .then(|| (run_id.to_string(), digest.to_string(), call_id.to_string()))
}

/// What became of one selected call.
struct Outcome {
    run_id: String,
    call_id: String,
    recorded: bool,
    words: String,
}

async fn submit(
    State(state): State<AppState>,
    session: Session,
    body: Bytes,
) -> Result<Response, PageError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let fields: HashMap<String, String> = pairs.iter().cloned().collect();
    if let Err(refused) = session.check_csrf(&fields) {
        return Ok(refused.into_response());
    }
    let filters = Filters {
        agent: fields.get("agent").cloned(),
        tool: fields.get("tool").cloned(),
    };
    let unsent = |message: &str| {
        let mut page = Page::new(StatusCode::UNPROCESSABLE_ENTITY, "Nothing was decided");
        page.signed_in = Some((&session.principal, &session.csrf));
        page.render(html! {
            p.error role="alert" { (message) }
            p { a href=(filters.queue_path()) { "Back to the queue" } }
        })
    };
    let action = match fields.get("action").map(String::as_str) {
        Some("approve") => Action::Approve,
        Some("reject") => Action::Reject,
        _ => return Ok(unsent("Choose Approve selected or Reject selected.")),
    };
    let reason = fields
        .get("reason")
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty());
    if action == Action::Reject && reason.is_none() {
        return Ok(unsent(
            "A rejection needs a reason, which the agents are told: write one and send again.",
        ));
    }
    // A reason typed before choosing Approve is not part of the approval.
    let reason = reason.filter(|_| action == Action::Reject);
    let decisions = picked(&pairs, action, reason.as_deref())?;
    if decisions.is_empty() {
        return Ok(unsent("Select the requests to decide first."));
    }
    if decisions.len() > decide::MAX_BATCH {
        return Ok(unsent(&format!(
            "Select at most {} requests at once.",
            decide::MAX_BATCH
        )));
    }
    let by = Decider {
        principal: &session.principal,
        role: session.role,
        door: super::CHANNEL,
        link: None,
        grant: None,
        delegation: None,
        model: false,
    };
    let runs = match decide::decide_batch(&state, decisions, &by).await {
        Ok(runs) => runs,
        Err(DecideError::BadInput(message)) => return Ok(unsent(&message)),
        Err(other) => return Err(other.into()),
    };
    results_page(&state, &session, &filters, runs, action).await
}

/// The decisions the selected rows (`PICK` fields) ask for, each with `action` and, for a
/// rejection, its `reason`.
fn picked(
    pairs: &[(String, String)],
    action: Action,
    reason: Option<&str>,
) -> Result<Vec<(String, Proposed)>, ApiError> {
    let mut decisions = Vec::new();
    for (name, value) in pairs {
        if name != PICK {
            continue;
        }
        let Some((run_id, digest, call_id)) = read_pick(value) else {
            return Err(ApiError::bad_request(format!("{value:?} names no call")));
        };
        let proposed = Proposed {
            call_id,
            digest: Some(digest),
            action,
            input: None,
            note: None,
            reason: reason.map(str::to_string),
            grant: None,
        };
        decisions.push((run_id, proposed));
    }
    Ok(decisions)
}

/// The page saying what became of each selected call, with its summary.
async fn results_page(
    state: &AppState,
    session: &Session,
    filters: &Filters,
    runs: Vec<RunDecided>,
    action: Action,
) -> Result<Response, PageError> {
    let done = match action {
        Action::Reject => "Rejected",
        _ => "Approved",
    };
    let outcomes: Vec<Outcome> = runs
        .into_iter()
        .flat_map(|run| outcomes(run, done))
        .collect();
    let recorded = outcomes.iter().filter(|o| o.recorded).count();
    let title = format!("{done} {recorded} of {}", outcomes.len());
    let mut shown = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        let view = CallView::load(state, &o.run_id, &o.call_id).await?;
        let summary = view.map_or_else(|| o.call_id.clone(), |v| v.summary);
        shown.push((o, summary));
    }
    let mut page = Page::new(StatusCode::OK, &title);
    page.signed_in = Some((&session.principal, &session.csrf));
    Ok(page.render(html! {
        @if recorded < shown.len() {
            p.notice role="status" { "Some were not decided: each says why below, and nothing was recorded for it." }
        }
        ul #batch-results .batch-results {
            @for (o, summary) in &shown { (result(o, summary)) }
        }
        p { a href=(filters.queue_path()) { "Back to the queue" } }
    }))
}

fn result(o: &Outcome, summary: &str) -> Markup {
    let status = if o.recorded { "recorded" } else { "refused" };
    html! {
        li.batch-result data-outcome=(status) data-run=(o.run_id) data-call=(o.call_id) {
            a href=(format!("/inbox/runs/{}/calls/{}", o.run_id, o.call_id)) { (summary) }
            " " span.run-id title=(o.run_id) { "run …" (short_run_id(&o.run_id)) }
            p { (o.words) }
        }
    }
}

/// Each call of one run's decisions, in a reviewer's words; `done` says what was recorded
/// ("Approved").
fn outcomes(run: RunDecided, done: &str) -> Vec<Outcome> {
    let outcome = |call_id: String, recorded, words| Outcome {
        run_id: run.run_id.clone(),
        call_id,
        recorded,
        words,
    };
    match &run.outcome {
        Ok(calls) => calls
            .iter()
            .map(|c| outcome(c.call_id.clone(), true, recorded_words(c, done)))
            .collect(),
        Err(refused) => {
            let mut words = refused_words(refused);
            if run.calls.len() > 1 {
                words.push_str(
                    " The requests of one run are decided together, so none of this run's was.",
                );
            }
            run.calls
                .iter()
                .map(|call_id| outcome(call_id.clone(), false, words.clone()))
                .collect()
        }
    }
}

fn recorded_words(c: &CallDecided, done: &str) -> String {
    match (c.status, c.approvals, c.quorum) {
        (DecidedStatus::ApprovalRecorded, Some(approvals), Some(quorum)) => {
            format!("Your approval is recorded: {approvals} of {quorum} needed.")
        }
        (DecidedStatus::AlreadyRecorded | DecidedStatus::AlreadyVoted, ..) => {
            "Recorded already: you had decided it so.".into()
        }
        _ if c.all_decided => format!("{done}: recorded. Its run resumes."),
        _ => format!("{done}: recorded."),
    }
}

/// Why a call was not decided, as the request page says it, but for a page that does not
/// show the call as it is now.
fn refused_words(refused: &DecideError) -> String {
    match refused {
        DecideError::Refused {
            code: RefusalCode::StaleDigest,
            ..
        } => "Nothing was recorded: this request changed since the queue showed it. Open it to \
              look at it as it is now."
            .into(),
        other => refusal_words(other).1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pick_reads_back_as_its_run_digest_and_whole_call_id() {
        let value = pick_value("run_1", "sha256:ab", "call with spaces");
        assert_eq!(
            read_pick(&value),
            Some((
                "run_1".into(),
                "sha256:ab".into(),
                "call with spaces".into()
            ))
        );
        for bad in ["", "run_1", "run_1 sha256:ab", " sha256:ab call"] {
            assert_eq!(read_pick(bad), None, "{bad:?}");
        }
    }
}
