//! `POST /slack/interactions`: button clicks and modal submissions from Slack. The signature
//! is checked before anything in the body is read. Approve decides at once, and so does an
//! "Approve + allow similar" preset, whose approval carries a standing grant's terms (the
//! condition suggested for the call's input, the preset's uses and span); Reject and Edit
//! open a modal (within the trigger's three seconds), with errors shown in the modal. The
//! reject modal's submission decides; the edit modal's, once the edit passes the checks the
//! decision makes, pushes a view showing the change field by field, whose submission decides. A Slack user who is not a configured person is told so, privately.
//! A payload from another workspace or app than the configured ones (`team_id`,
//! `api_app_id`) is refused (403) before its user is looked up.

pub mod signature;

use crate::channels::slack::api;
use crate::channels::slack::blocks::{self, Target};

use crate::auth::error::AuthError;
use crate::config::SlackConfig;
use crate::decide::{self, Decider, Proposed, told};
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use countersign_model::authority::{self, Principal, RunFacts};
use countersign_model::condition;
use countersign_model::grant::GrantTerms;
use countersign_model::refusal::RefusalCode;
use countersign_model::run::Action;
use serde_json::{Value, json};
use std::collections::HashMap;

pub(crate) fn router() -> Router<AppState> {
    Router::new().route("/slack/interactions", post(interaction))
}

/// The channel Slack decisions are recorded as coming from.
const CHANNEL: &str = "slack";
const NOT_AN_APPROVER: &str =
    "You are not an approver in countersign, so you cannot decide this request.";

async fn interaction(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Some(slack) = &state.config.slack else {
        return Err(ApiError::not_found("Slack is not configured"));
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    signature::verify(
        slack.signing_secret.expose(),
        header("x-slack-request-timestamp"),
        header("x-slack-signature"),
        &body,
        chrono::Utc::now().timestamp(),
    )
    .map_err(|e| AuthError::Unauthorized(e.to_string()))?;
    let form: HashMap<String, String> = serde_urlencoded::from_bytes(&body)
        .map_err(|e| ApiError::bad_request(format!("not a form body: {e}")))?;
    let payload: Value = form
        .get("payload")
        .and_then(|p| serde_json::from_str(p).ok())
        .ok_or_else(|| ApiError::bad_request("the form has no JSON payload"))?;
    from_our_workspace(slack, &payload)?;
    let user = payload["user"]["id"].as_str().unwrap_or_default();
    let principal = state.people.by_slack_user(user).map(|p| p.id.clone());
    match payload["type"].as_str() {
        Some("block_actions") => block_action(&state, &payload, principal).await,
        Some("view_submission") => Ok(view_submission(&state, &payload, principal).await),
        _ => Ok(StatusCode::OK.into_response()),
    }
}

async fn block_action(
    state: &AppState,
    payload: &Value,
    principal: Option<String>,
) -> Result<Response, ApiError> {
    let action = &payload["actions"][0];
    let target: Target = action["value"]
        .as_str()
        .and_then(|v| serde_json::from_str(v).ok())
        .ok_or_else(|| ApiError::bad_request("the button carries no request"))?;
    let Some(principal) = principal else {
        ephemeral(state, payload, NOT_AN_APPROVER).await;
        return Ok(StatusCode::OK.into_response());
    };
    let trigger = payload["trigger_id"].as_str().unwrap_or_default();
    let slack = state.config.slack.as_ref().expect("checked by the caller");
    // A modal opens only for someone the rule lets take its action; the submission is
    // checked again by the decision script.
    let modal_action = match action["action_id"].as_str() {
        Some("reject") => Some(Action::Reject),
        Some("edit") => Some(Action::Edit),
        _ => None,
    };
    let mut held_input = Value::Null;
    if let Some(modal_action) = modal_action {
        match may_open(state, &target, &principal, modal_action).await? {
            Ok(input) => held_input = input,
            Err(refused) => {
                ephemeral(state, payload, &refused_words(refused, &principal)).await;
                return Ok(StatusCode::OK.into_response());
            }
        }
    }
    match action["action_id"].as_str() {
        Some("approve") => {
            let proposed = proposed(&target, Action::Approve, None, None, None);
            approve(state, payload, &target, proposed, &principal).await;
        }
        Some(id) if id.starts_with(blocks::APPROVE_GRANT) => {
            let proposed = grant_proposal(state, action, &target).await?;
            approve(state, payload, &target, proposed, &principal).await;
        }
        Some("reject") => {
            let view = blocks::reject_modal(trigger, &target);
            api::call(&state.http, slack, "views.open", &view)
                .await
                .map_err(ApiError::unavailable)?;
        }
        Some("edit") => {
            // Arguments too long for a text field get a modal that points to the API.
            let view = blocks::edit_modal(trigger, &target, &held_input);
            api::call(&state.http, slack, "views.open", &view)
                .await
                .map_err(ApiError::unavailable)?;
        }
        _ => {}
    }
    Ok(StatusCode::OK.into_response())
}

/// Whether `principal` may take `modal_action` on the call, as the rule says: its input
/// (null when it is no longer held), or the refusal.
async fn may_open(
    state: &AppState,
    target: &Target,
    principal: &str,
    modal_action: Action,
) -> Result<Result<Value, RefusalCode>, ApiError> {
    let role = state.person_role(principal);
    let run_id = &target.run_id;
    let run = state.run(run_id).await?;
    let run = run.ok_or_else(|| ApiError::not_found(format!("no run {run_id:?}")))?;
    let who = Principal {
        id: principal,
        role,
    };
    if let Some(call) = run.held_calls().find(|p| p.call_id == target.call_id) {
        let delegators = crate::decide::delegators(state, principal).await?;
        let run_facts = RunFacts::of(&run);
        if let Err(refused) =
            authority::deciding_for(who, &delegators, modal_action, call, run_facts)
        {
            return Ok(Err(refused));
        }
        return Ok(Ok(call.input.clone()));
    }
    Ok(Ok(Value::Null))
}

/// The approval an "approve and allow similar" button asks for, with a standing grant of
/// the button's preset for calls like the one held.
async fn grant_proposal(
    state: &AppState,
    action: &Value,
    target: &Target,
) -> Result<Proposed, ApiError> {
    let preset: blocks::GrantPreset = action["value"]
        .as_str()
        .and_then(|v| serde_json::from_str(v).ok())
        .ok_or_else(|| ApiError::bad_request("the button carries no grant"))?;
    let mut proposed = proposed(target, Action::Approve, None, None, None);
    // The grant covers calls like the one held; should it no longer be held, the
    // approval alone is sent, and refused as Approve would be.
    let run = state.run(&target.run_id).await?;
    let held = run
        .as_ref()
        .and_then(|r| r.held_calls().find(|c| c.call_id == target.call_id));
    if let Some(call) = held {
        proposed.grant = Some(GrantTerms {
            condition: condition::suggested(&call.input),
            same_requester: false,
            max_uses: preset.max_uses,
            expires_in: preset.expires_in,
            total: None,
        });
    }
    Ok(proposed)
}

/// Approves the call as `principal` (with the grant `proposed` may carry); a refusal is told
/// to the person who clicked, in the words the API would use.
async fn approve(
    state: &AppState,
    payload: &Value,
    target: &Target,
    proposed: Proposed,
    principal: &str,
) {
    let by = Decider {
        principal,
        role: state.person_role(principal),
        door: CHANNEL,
        link: None,
        grant: None,
        delegation: None,
        model: false,
    };
    if let Err(e) = decide::decide_one(state, &target.run_id, proposed, &by).await {
        ephemeral(state, payload, &ApiError::from(e).message).await;
    }
}

/// A modal was submitted: decide, or answer with errors shown under the modal's inputs. A
/// valid edit is not decided yet: the answer pushes a view showing its change, and that
/// view's submission decides.
async fn view_submission(state: &AppState, payload: &Value, principal: Option<String>) -> Response {
    let view = &payload["view"];
    let callback = view["callback_id"].as_str().unwrap_or_default();
    // Under the modal's first input; the confirmation has none, so it is updated to say why.
    let refuse = |message: &str| match callback {
        blocks::EDIT => form_errors(blocks::INPUT, message),
        blocks::REJECT => form_errors(blocks::REASON, message),
        _ => Json(blocks::not_recorded_view(message)).into_response(),
    };
    let Some(principal) = principal else {
        return refuse(NOT_AN_APPROVER);
    };
    let metadata = view["private_metadata"].as_str().unwrap_or_default();
    let lost = "this form lost track of its request; open it again";
    let (run_id, proposed) = match callback {
        blocks::CONFIRM_EDIT => {
            let Ok(edit) = serde_json::from_str::<blocks::EditToConfirm>(metadata) else {
                return refuse(lost);
            };
            let proposed = proposed(
                &edit.target,
                Action::Edit,
                Some(edit.input),
                Some(edit.note),
                None,
            );
            (edit.target.run_id, proposed)
        }
        blocks::REJECT | blocks::EDIT => {
            let Ok(target) = serde_json::from_str::<Target>(metadata) else {
                return refuse(lost);
            };
            if callback == blocks::REJECT {
                let reason = form_value(view, blocks::REASON);
                let proposed = proposed(&target, Action::Reject, None, None, reason);
                (target.run_id, proposed)
            } else {
                match edit_submitted(state, view, target).await {
                    Ok(decided) => decided,
                    Err(answer) => return answer,
                }
            }
        }
        _ => return StatusCode::OK.into_response(),
    };
    let by = Decider {
        principal: &principal,
        role: state.person_role(&principal),
        door: CHANNEL,
        link: None,
        grant: None,
        delegation: None,
        model: false,
    };
    match decide::decide_one(state, &run_id, proposed, &by).await {
        // The confirmation closes with the edit modal beneath it.
        Ok(_) if callback == blocks::CONFIRM_EDIT => {
            Json(json!({"response_action": "clear"})).into_response()
        }
        Ok(_) => StatusCode::OK.into_response(),
        Err(e) => refuse(&ApiError::from(e).explained()),
    }
}

/// The edit modal's submission: arguments that are JSON and a note saying why. Gives back
/// the decision to make now, or Slack's answer instead (the form's errors, or the
/// confirmation pushed over the modal).
async fn edit_submitted(
    state: &AppState,
    view: &Value,
    target: Target,
) -> Result<(String, Proposed), Response> {
    let text = form_value(view, blocks::INPUT).unwrap_or_default();
    let input: Value = match serde_json::from_str(&text) {
        Ok(input) => input,
        Err(e) => {
            return Err(form_errors(
                blocks::INPUT,
                &format!("This is not valid JSON: {e}"),
            ));
        }
    };
    let Some(note) = form_value(view, blocks::NOTE).filter(|n| !n.trim().is_empty()) else {
        return Err(form_errors(
            blocks::NOTE,
            "Say why you changed it; the agent is told.",
        ));
    };
    let edit = blocks::EditToConfirm {
        target: target.clone(),
        input,
        note,
    };
    let proposed = proposed(
        &target,
        Action::Edit,
        Some(edit.input.clone()),
        Some(edit.note.clone()),
        None,
    );
    match decide::edit_preview(state, &target.run_id, &proposed).await {
        Err(e) => return Err(form_errors(blocks::INPUT, &ApiError::from(e).explained())),
        Ok(Some(changes)) => {
            // An edit too long for the view's private_metadata (3,000
            // characters: long arguments and a long note) cannot be carried to
            // the confirmation, so it is decided at once, as it was checked.
            if let Some(push) = blocks::confirm_edit_view(&edit, &changes) {
                return Err(Json(push).into_response());
            }
        }
        // The call is no longer held as shown: deciding it says why.
        Ok(None) => {}
    }
    Ok((target.run_id, proposed))
}

/// The modal's answer that shows `message` under its input `block`.
fn form_errors(block: &str, message: &str) -> Response {
    Json(json!({"response_action": "errors", "errors": {block: message}})).into_response()
}

/// What the modal's input `block` holds.
fn form_value(view: &Value, block: &str) -> Option<String> {
    view["state"]["values"][block][block]["value"]
        .as_str()
        .map(str::to_string)
}

/// Why a click was not let through, for the person who clicked.
fn refused_words(refused: RefusalCode, principal: &str) -> String {
    let told = told(refused).unwrap_or("this request cannot be decided by you");
    format!("{principal}, {told}.")
}

/// Refuses a payload from another workspace or app than the configured ones: a Slack user id
/// names a person only within the workspace the directory was written for.
fn from_our_workspace(slack: &SlackConfig, payload: &Value) -> Result<(), AuthError> {
    let checks = [
        ("team.id", &slack.team_id, payload["team"]["id"].as_str()),
        (
            "api_app_id",
            &slack.api_app_id,
            payload["api_app_id"].as_str(),
        ),
    ];
    for (field, configured, sent) in checks {
        if let Some(configured) = configured
            && sent != Some(configured.as_str())
        {
            let sent = sent.unwrap_or("(none)");
            tracing::warn!(
                field,
                sent,
                "a Slack interaction from another workspace or app was refused"
            );
            return Err(AuthError::Forbidden(format!(
                "this gateway takes Slack interactions only from its own workspace and app, \
                 and {field} {sent:?} is not it"
            )));
        }
    }
    Ok(())
}

fn proposed(
    target: &Target,
    action: Action,
    input: Option<Value>,
    note: Option<String>,
    reason: Option<String>,
) -> Proposed {
    Proposed {
        call_id: target.call_id.clone(),
        digest: Some(target.digest.clone()),
        action,
        input,
        note,
        reason,
        grant: None,
    }
}

/// Tells only the clicking user something, in the channel of the message. The text may quote
/// what others wrote (a call id, say), so none of it is markup.
async fn ephemeral(state: &AppState, payload: &Value, text: &str) {
    let Some(slack) = &state.config.slack else {
        return;
    };
    let channel = payload["container"]["channel_id"]
        .as_str()
        .or_else(|| payload["channel"]["id"].as_str())
        .unwrap_or_default();
    let text = blocks::escaped(text, blocks::MAX_SECTION_TEXT);
    let body = json!({"channel": channel, "user": payload["user"]["id"], "text": text});
    if let Err(e) = api::call(&state.http, slack, "chat.postEphemeral", &body).await {
        tracing::warn!(error = %e, "could not answer a Slack user");
    }
}
