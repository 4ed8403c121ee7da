//! After a decision in the inbox: the reviewer goes on to the next request waiting for them
//! (the queue once there is none), and that page says what was recorded. The page names the
//! decided call in its query (`recorded_run`, `recorded_call`) and says what the store holds
//! for it, so a hand-made address shows nothing that is not recorded.
//!
//! The way there names the note as its fragment (`#recorded`), and the page's script focuses
//! it. The note is near the top of the page, and its `scroll-margin-top` (half the window)
//! makes the browser show the page from its top: the heading of the next request, the note
//! under it, then the next request's action bar. A `Location` without a fragment inherits the one of the request it answers (RFC 9110
//! §10.2.2; HTML's navigation keeps it), and the request page's edit and reject forms post to
//! `#edit` and `#reject` (so that a form sent back with errors is shown at its errors): without
//! a fragment of its own, the next request would open scrolled to its own edit or reject form,
//! and a reviewer who thought the edit lost would decide another call.

use super::queue::{Filters, waiting};
use crate::error::ApiError;
use crate::pages::request_view::CallView;
use crate::state::AppState;
use countersign_model::authority::Principal;
use maud::{Markup, html};
use serde::{Deserialize, Serialize};

/// The call a reviewer has just decided, as the next page's query names it.
#[derive(Default, Deserialize, Serialize)]
pub(super) struct Recorded {
    recorded_run: Option<String>,
    recorded_call: Option<String>,
}

/// Where a reviewer goes once their decision on `run_id`'s `call_id` is recorded: the next
/// request, or the queue when they decided from it (`to_queue`) or nothing else waits.
pub(super) async fn after_decision(
    state: &AppState,
    principal: Principal<'_>,
    run_id: &str,
    call_id: &str,
    to_queue: bool,
) -> Result<String, ApiError> {
    let lines = if to_queue {
        Vec::new()
    } else {
        waiting(state, principal, &Filters::default()).await?
    };
    let next = lines
        .iter()
        .find(|l| !(l.run_id == run_id && l.call_id == call_id));
    let query = serde_urlencoded::to_string(Recorded {
        recorded_run: Some(run_id.to_string()),
        recorded_call: Some(call_id.to_string()),
    })
    .unwrap_or_default();
    Ok(match next {
        Some(l) => format!(
            "/inbox/runs/{}/calls/{}?{query}#{NOTE_ID}",
            l.run_id, l.call_id
        ),
        None => format!("/inbox?{query}#{NOTE_ID}"),
    })
}

/// The id of the note that says what was recorded, the fragment of the way to it.
const NOTE_ID: &str = "recorded";

/// Focuses the note that says what was recorded, when the page has one, so that it is what a
/// screen reader reads and where the keyboard starts (the fragment brought it into view).
pub(super) const FOCUS_NOTE: &str = r#"
(function () {
  var note = document.getElementById('recorded');
  if (note) note.focus();
})();
"#;

/// "Recorded: Refund $129 for order A-1001. Approved by rita via web at …", if the named
/// call was decided.
pub(super) async fn note(state: &AppState, recorded: &Recorded) -> Result<Markup, ApiError> {
    let (Some(run_id), Some(call_id)) = (&recorded.recorded_run, &recorded.recorded_call) else {
        return Ok(html! {});
    };
    let Some(view) = CallView::load(state, run_id, call_id).await? else {
        return Ok(html! {});
    };
    Ok(html! {
        @if let Some(outcome) = &view.outcome {
            p.recorded id=(NOTE_ID) role="status" tabindex="-1" {
                strong { "Recorded: " } (view.summary) ". " (outcome)
                " " a href=(format!("/inbox/runs/{run_id}/calls/{call_id}")) { "See it" }
            }
        }
    })
}
