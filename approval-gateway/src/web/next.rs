//! After a decision in the inbox: the reviewer goes on to the next request waiting for them
//! (the queue once there is none), and that page says what was recorded. The page names the
//! decided call in its query (`recorded_run`, `recorded_call`) and says what the store holds
//! for it, so a hand-made address shows nothing that is not recorded.

use super::queue::{Filters, waiting};
use super::request_view::CallView;
use crate::error::ApiError;
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
        Some(l) => format!("/inbox/runs/{}/calls/{}?{query}", l.run_id, l.call_id),
        None => format!("/inbox?{query}"),
    })
}

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
            p.recorded role="status" {
                strong { "Recorded: " } (view.summary) ". " (outcome)
                " " a href=(format!("/inbox/runs/{run_id}/calls/{call_id}")) { "See it" }
            }
        }
    })
}
