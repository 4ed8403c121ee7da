//! The pages behind email links. `GET` (and `HEAD`) only shows what the link would do, with
//! a form; only the form's `POST` decides, and the decision script spends the token in the
//! same step that records the decision, so a form filled in wrong or a failure on the way
//! leaves the link working. A used, expired or superseded link shows a page saying so and
//! changes nothing. No script runs on these pages,
//! and they are neither cached nor sent as a referrer, since the token is in the URL.

use super::grant::{Grant, parse_token};
use super::html::escape;
use crate::decide::{self, DecideError, Decider, Proposed};
use crate::error::ApiError;
use crate::state::AppState;
use crate::time::rfc3339;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use countersign_shared::run::{Action, Run, RunStatus};
use countersign_shared::store::RefusalCode;
use serde_json::Value;
use std::collections::HashMap;

pub(crate) fn router() -> Router<AppState> {
    Router::new().route("/approvals/email/{token}", get(show).post(submit))
}

/// The channel email decisions are recorded as coming from.
const CHANNEL: &str = "email";

fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t}</title></head><body><h1>{t}</h1>{body}</body></html>",
        t = escape(title)
    );
    (
        status,
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        Html(html),
    )
        .into_response()
}

fn gone() -> Response {
    page(
        StatusCode::GONE,
        "This link no longer works",
        "<p>It was already used, or it expired. Nothing was changed.</p>",
    )
}

/// Why the call can no longer be decided through this link, if it cannot.
async fn superseded(state: &AppState, grant: &Grant) -> Result<Option<String>, ApiError> {
    let Some(run) = state.store.load(&grant.run_id).await? else {
        return Ok(Some("The request no longer exists.".into()));
    };
    if let Some(d) = state
        .store
        .decisions(&grant.run_id)
        .await?
        .get(&grant.call_id)
    {
        return Ok(Some(format!(
            "This request was already decided: {} by {} at {}.",
            decide::action_name(d.action),
            d.decided_by,
            rfc3339(d.decided_at)
        )));
    }
    let pending = run.pending().find(|p| p.call_id == grant.call_id);
    if run.status != RunStatus::AwaitingApproval || pending.is_none_or(|p| p.digest != grant.digest)
    {
        return Ok(Some(format!(
            "This request is no longer waiting (the run is {}).",
            run.status.as_str()
        )));
    }
    Ok(None)
}

fn form(run: &Run, grant: &Grant, error: Option<&str>, typed: &HashMap<String, String>) -> String {
    let Some(call) = run.pending().find(|p| p.call_id == grant.call_id) else {
        return String::new();
    };
    let mut html = format!(
        "<p><strong>{}</strong></p><p>Why: {}</p>",
        escape(&call.summary),
        escape(&call.reason)
    );
    let said = run.held_turn_text();
    if !said.is_empty() {
        html += &format!("<p>The agent said: {}</p>", escape(&said));
    }
    html += &format!(
        "<p>Arguments:</p><pre>{}</pre><p>You are deciding as {}.</p>",
        escape(&serde_json::to_string_pretty(&call.input).unwrap_or_default()),
        escape(&grant.principal)
    );
    if let Some(error) = error {
        html += &format!("<p role=\"alert\"><strong>{}</strong></p>", escape(error));
    }
    html += "<form method=\"post\">";
    let field = |name: &str| escape(typed.get(name).map(String::as_str).unwrap_or_default());
    match grant.action {
        Action::Approve => html += "<button type=\"submit\">Approve</button>",
        Action::Reject => {
            html += &format!(
                "<label>Reason (the agent is told)<br><textarea name=\"reason\" required>{}</textarea></label><br><button type=\"submit\">Reject</button>",
                field("reason")
            )
        }
        Action::Edit => {
            let input = typed
                .get("input")
                .cloned()
                .unwrap_or_else(|| serde_json::to_string_pretty(&call.input).unwrap_or_default());
            html += &format!(
                "<label>Arguments (JSON)<br><textarea name=\"input\" rows=\"10\" cols=\"60\" required>{}</textarea></label><br>\
                 <label>Note (the agent is told)<br><textarea name=\"note\" required>{}</textarea></label><br>\
                 <button type=\"submit\">Approve with these arguments</button>",
                escape(&input),
                field("note")
            )
        }
    }
    html + "</form>"
}

fn title(action: Action) -> &'static str {
    match action {
        Action::Approve => "Approve this request?",
        Action::Reject => "Reject this request?",
        Action::Edit => "Edit and approve this request?",
    }
}

/// The link's grant, with the token's run and hash, if the link still works.
async fn grant_of(
    state: &AppState,
    token: &str,
) -> Result<Option<(Grant, String, String)>, ApiError> {
    let Some((run, hash)) = parse_token(token) else {
        return Ok(None);
    };
    let Some(raw) = state.store.peek_link_token(&run, &hash).await? else {
        return Ok(None);
    };
    let grant: Grant = serde_json::from_str(&raw).map_err(ApiError::unavailable)?;
    Ok(Some((grant, hash, raw)))
}

async fn show(
    State(state): State<AppState>,
    Path(token): Path<String>,
) -> Result<Response, ApiError> {
    let Some((grant, _, _)) = grant_of(&state, &token).await? else {
        return Ok(gone());
    };
    if let Some(why) = superseded(&state, &grant).await? {
        return Ok(page(
            StatusCode::CONFLICT,
            "Already decided",
            &format!("<p>{}</p>", escape(&why)),
        ));
    }
    let run = load_run(&state, &grant).await?;
    Ok(page(
        StatusCode::OK,
        title(grant.action),
        &form(&run, &grant, None, &HashMap::new()),
    ))
}

async fn submit(
    State(state): State<AppState>,
    Path(token): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Some((grant, hash, raw)) = grant_of(&state, &token).await? else {
        return Ok(gone());
    };
    let typed: HashMap<String, String> = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let text = |name: &str| typed.get(name).filter(|v| !v.trim().is_empty()).cloned();
    let input = match grant.action {
        Action::Edit => match serde_json::from_str::<Value>(&text("input").unwrap_or_default()) {
            Ok(input) => Some(input),
            Err(e) => {
                let error = format!("The arguments are not valid JSON: {e}");
                return again(&state, &grant, &error, &typed).await;
            }
        },
        _ => None,
    };
    if grant.action == Action::Edit && text("note").is_none() {
        let error = "Say why you changed it; the agent is told.";
        return again(&state, &grant, error, &typed).await;
    }
    let proposed = Proposed {
        call_id: grant.call_id.clone(),
        digest: Some(grant.digest.clone()),
        action: grant.action,
        input,
        note: text("note"),
        reason: text("reason"),
    };
    let by = Decider {
        principal: &grant.principal,
        channel: CHANNEL,
        link: Some((&hash, &raw)),
    };
    match decide::decide_one(&state, grant.run_id.as_str(), proposed, &by).await {
        Ok(_) => Ok(page(
            StatusCode::OK,
            "Thank you",
            &format!(
                "<p>Your decision ({}) was recorded.</p>",
                decide::action_name(grant.action)
            ),
        )),
        Err(DecideError::Refused {
            code: RefusalCode::LinkUsed,
            ..
        }) => Ok(gone()),
        // The form was wrong: the link still works and the form comes back with the error.
        Err(e) if e.is_bad_input() => {
            let error = ApiError::from(e).explained();
            again(&state, &grant, &error, &typed).await
        }
        Err(e) => {
            let e = ApiError::from(e);
            let text = format!("<p>{}</p>", escape(&e.message));
            Ok(page(e.status, "Not recorded", &text))
        }
    }
}

/// The run a link decides on.
async fn load_run(state: &AppState, grant: &Grant) -> Result<Run, ApiError> {
    let id = &grant.run_id;
    state
        .store
        .load(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run {:?}", id.as_str())))
}

/// Shows the form again with what went wrong; the link was not used.
async fn again(
    state: &AppState,
    grant: &Grant,
    error: &str,
    typed: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let run = load_run(state, grant).await?;
    Ok(page(
        StatusCode::UNPROCESSABLE_ENTITY,
        title(grant.action),
        &form(&run, grant, Some(error), typed),
    ))
}
