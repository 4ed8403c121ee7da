//! Slack: approval requests are posted to channels (`slack:#channel`) with Approve, Reject
//! and Edit buttons; clicks and modal submissions come back to `POST /slack/interactions`
//! (see `routes::slack`), and every decision, from any channel, updates the message.
//!
//! What is posted is built in `blocks`, where nothing others wrote becomes markup and every
//! text fits Slack's limits. Should Slack still refuse a request's blocks, a short message
//! (summary, run id, buttons) is posted instead, so the call can be decided from Slack all
//! the same. A rate limit (HTTP 429) is waited out as Slack asks when that is short, and
//! otherwise handed back to the delivery queue's backoff.

pub mod api;
pub mod blocks;
pub mod signature;

use crate::notify::{Delivery, DeliveryError};
use crate::state::AppState;
use api::SlackError;
use blocks::{Request, Target};
use countersign_shared::events::Event;
use countersign_shared::run::Action;
use serde_json::json;
use tracing::warn;

impl From<SlackError> for DeliveryError {
    fn from(e: SlackError) -> Self {
        match e {
            SlackError::Unavailable(why) => DeliveryError::Retry(why),
            SlackError::RateLimited { .. } => DeliveryError::Retry(e.to_string()),
            SlackError::Refused { .. } => DeliveryError::GiveUp(e.to_string()),
        }
    }
}

/// Rewrites a call's message to say how it ended, without buttons.
async fn show_outcome(
    state: &AppState,
    run_id: &countersign_shared::run::RunId,
    call_id: &str,
    channel: &str,
    outcome: &str,
) -> Result<(), DeliveryError> {
    let slack = state.config.slack.as_ref().expect("checked by deliver");
    let reference = posted(state, run_id, call_id, channel).await?;
    let outcome = if reference["escalated"] == true {
        format!("{outcome} It had been escalated.")
    } else {
        outcome.to_string()
    };
    let message = blocks::decided_message(
        reference["channel"].as_str().unwrap_or_default(),
        reference["ts"].as_str().unwrap_or_default(),
        reference["summary"].as_str().unwrap_or_default(),
        &outcome,
    );
    api::call_patiently(&state.http, slack, "chat.update", &message).await?;
    Ok(())
}

/// Posts a request, or updates its message once decided or expired.
pub async fn deliver(
    state: &AppState,
    name: &str,
    delivery: &Delivery,
) -> Result<(), DeliveryError> {
    let Some(slack) = &state.config.slack else {
        return Err(DeliveryError::GiveUp("no [slack] is configured".into()));
    };
    let store_err = |e: countersign_shared::store::StoreError| DeliveryError::Retry(e.to_string());
    let call_id = delivery.call_id.as_deref().unwrap_or_default();
    match &delivery.event.event {
        Event::ApprovalRequested {
            run_id,
            agent,
            text,
            calls,
            evidence,
            requested_by,
            ..
        } => {
            let Some(call) = calls.iter().find(|c| c.call_id == call_id) else {
                return Err(DeliveryError::GiveUp(format!(
                    "no call {call_id} in the request"
                )));
            };
            // Posted before, and the ack was lost: post nothing twice.
            if state
                .store
                .channel_ref(run_id, call_id, &delivery.channel)
                .await
                .map_err(store_err)?
                .is_some()
            {
                return Ok(());
            }
            let target = Target {
                run_id: run_id.to_string(),
                call_id: call.call_id.clone(),
                digest: call.digest.clone(),
            };
            let message = blocks::request_message(&Request {
                channel: name,
                agent,
                requested_by: requested_by.as_deref(),
                text,
                call,
                evidence,
                target: &target,
            });
            let post =
                |message| api::call_patiently(&state.http, slack, "chat.postMessage", message);
            let answer = match post(&message).await {
                Ok(answer) => answer,
                Err(e) => {
                    let Some(why) = e.refused_content() else {
                        return Err(e.into());
                    };
                    warn!(%run_id, call_id, error = %e, "Slack refused the request; posting it in short");
                    post(&blocks::short_request_message(
                        name,
                        &call.summary,
                        &target,
                        why,
                    ))
                    .await?
                }
            };
            let reference = json!({
                "channel": answer["channel"], "ts": answer["ts"], "summary": call.summary,
            });
            state
                .store
                .set_channel_ref(run_id, call_id, &delivery.channel, &reference.to_string())
                .await
                .map_err(store_err)?;
            Ok(())
        }
        Event::ApprovalDecided {
            run_id,
            call_id,
            action,
            decided_by,
            ..
        } => {
            let verb = match action {
                Action::Approve => "Approved",
                Action::Edit => "Approved with edits",
                Action::Reject => "Rejected",
            };
            let when = blocks::slack_date(chrono::Utc::now().timestamp_millis());
            let outcome = format!(
                "{verb} by {} at {when}.",
                blocks::escaped(decided_by, blocks::NAME_CHARS)
            );
            show_outcome(state, run_id, call_id, &delivery.channel, &outcome).await
        }
        Event::ApprovalExpired {
            run_id,
            call_id,
            deadline,
            ..
        } => {
            let when = blocks::slack_date(*deadline);
            let outcome = format!("Expired: nobody decided by {when}, so it did not run.");
            show_outcome(state, run_id, call_id, &delivery.channel, &outcome).await
        }
        Event::ApprovalCancelled {
            run_id,
            call_id,
            cancelled_by,
            ..
        } => {
            let outcome = format!(
                "Cancelled: {} stopped the run, so it did not run.",
                blocks::escaped(cancelled_by, blocks::NAME_CHARS)
            );
            show_outcome(state, run_id, call_id, &delivery.channel, &outcome).await
        }
        Event::ApprovalReminder {
            run_id,
            call,
            escalated,
            ..
        } => {
            let deadline = blocks::deadline(call);
            let text = if *escalated {
                let mentions: Vec<String> = call
                    .reviewers
                    .escalate_to
                    .iter()
                    .map(|who| {
                        match state
                            .people
                            .person(who)
                            .and_then(|p| p.slack_user.as_deref())
                        {
                            // Configured Slack users: the one mention meant to ping.
                            Some(user) => format!("<@{user}>"),
                            None => blocks::escaped(who, blocks::NAME_CHARS),
                        }
                    })
                    .collect();
                format!(
                    "Escalated: nobody decided in time, so {} may now decide too; {deadline}.",
                    mentions.join(", ")
                )
            } else {
                format!("Reminder: this still waits for a decision; {deadline}.")
            };
            // Marked first: marking again is harmless, replying twice is not.
            if *escalated {
                mark_escalated(state, run_id, &call.call_id, &delivery.channel).await?;
            }
            reply_in_thread(state, run_id, &call.call_id, &delivery.channel, &text).await
        }
        _ => Ok(()),
    }
}

/// Answers under a call's message.
async fn reply_in_thread(
    state: &AppState,
    run_id: &countersign_shared::run::RunId,
    call_id: &str,
    channel: &str,
    text: &str,
) -> Result<(), DeliveryError> {
    let slack = state.config.slack.as_ref().expect("checked by deliver");
    let reference = posted(state, run_id, call_id, channel).await?;
    let message =
        json!({"channel": reference["channel"], "thread_ts": reference["ts"], "text": text});
    api::call_patiently(&state.http, slack, "chat.postMessage", &message).await?;
    Ok(())
}

/// Notes on the call's message reference that it was escalated, for its final update.
async fn mark_escalated(
    state: &AppState,
    run_id: &countersign_shared::run::RunId,
    call_id: &str,
    channel: &str,
) -> Result<(), DeliveryError> {
    let mut reference = posted(state, run_id, call_id, channel).await?;
    reference["escalated"] = true.into();
    state
        .store
        .set_channel_ref(run_id, call_id, channel, &reference.to_string())
        .await
        .map_err(|e| DeliveryError::Retry(e.to_string()))
}

/// Where the call's message was posted; a retry until it has been.
async fn posted(
    state: &AppState,
    run_id: &countersign_shared::run::RunId,
    call_id: &str,
    channel: &str,
) -> Result<serde_json::Value, DeliveryError> {
    let reference = state
        .store
        .channel_ref(run_id, call_id, channel)
        .await
        .map_err(|e| DeliveryError::Retry(e.to_string()))?
        .ok_or_else(|| DeliveryError::Retry("the request is not posted yet".into()))?;
    serde_json::from_str(&reference).map_err(|e| DeliveryError::GiveUp(e.to_string()))
}
