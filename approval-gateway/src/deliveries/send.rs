//! The second step of a delivery: it is sent to its channel. A failure worth retrying hands
//! it back with a growing delay, up to `delivery_max_attempts`; then, or when it can never
//! work, it is given up. Slack and email are told through the verbs of [`Deliver`].

use crate::channels::delivery::{Ask, Deliver, Delivery, DeliveryError, Ending};
use crate::channels::email::Email;
use crate::channels::slack::Slack;
use crate::channels::webhook;
use crate::state::AppState;
use async_nats::jetstream::Message;
use countersign_model::approval::Channel;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::events::Event;
use countersign_model::run::RunId;
use countersign_runtime::work::Outcome;
use std::time::Duration;
use tracing::warn;

/// Sends one delivery, this being its `attempt`th time, and says what becomes of it.
pub(super) async fn send(state: &AppState, msg: &Message, attempt: u64) -> Outcome {
    let delivery: Delivery = match serde_json::from_slice(&msg.payload) {
        Ok(d) => d,
        Err(e) => {
            warn!(error = %e, "unreadable delivery dropped");
            return Outcome::GiveUp;
        }
    };
    let result = to_channel(state, &delivery).await;
    match &result {
        Ok(()) => audit_sent(state, &delivery).await,
        Err(_) => state.metrics.delivery_failed(delivery.channel.kind()),
    }
    match result {
        Ok(()) => Outcome::Ack,
        Err(DeliveryError::Retry(why))
            if attempt < u64::from(state.config.delivery_max_attempts) =>
        {
            let delay = retry_delay(state.config.delivery_retry_base_ms, attempt);
            warn!(channel = %delivery.channel, attempt, ?delay, %why, "delivery failed; will retry");
            Outcome::Retry(delay)
        }
        Err(DeliveryError::Retry(why) | DeliveryError::GiveUp(why)) => {
            warn!(channel = %delivery.channel, attempt, %why, "delivery given up");
            Outcome::GiveUp
        }
    }
}

/// Sends one delivery to its channel.
async fn to_channel(state: &AppState, delivery: &Delivery) -> Result<(), DeliveryError> {
    let channel = &delivery.channel;
    match channel {
        Channel::Webhook(name) => webhook::forward(state, name, delivery).await,
        Channel::Slack(name) => tell(&Slack::open(state, name, channel)?, delivery).await,
        Channel::Email(address) => tell(&Email::open(state, address, channel)?, delivery).await,
    }
}

/// Tells a channel that shows each call on its own what the event means for the call of
/// this delivery.
async fn tell(to: &impl Deliver, delivery: &Delivery) -> Result<(), DeliveryError> {
    if let Some((run_id, call_id, ending)) = ending_of(&delivery.event.event) {
        return to.ended(run_id, call_id, ending).await;
    }
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
            let ask = Ask {
                run_id,
                agent,
                text,
                call,
                evidence,
                requested_by: requested_by.as_deref(),
            };
            to.request(&ask).await
        }
        Event::ApprovalReminder {
            run_id,
            agent,
            text,
            call,
            escalated,
            requested_by,
        } => {
            let ask = Ask {
                run_id,
                agent,
                text,
                call,
                evidence: &[],
                requested_by: requested_by.as_deref(),
            };
            to.remind(&ask, *escalated).await
        }
        _ => Ok(()),
    }
}

/// How the call an event is about ended, for the events that end one.
fn ending_of(event: &Event) -> Option<(&RunId, &str, Ending<'_>)> {
    match event {
        Event::ApprovalDecided {
            run_id,
            call_id,
            superseded: true,
            ..
        } => Some((run_id, call_id.as_str(), Ending::Superseded)),
        Event::ApprovalDecided {
            run_id,
            call_id,
            action,
            decided_by,
            under_grant,
            ..
        } => {
            let ending = Ending::Decided {
                action: *action,
                by: decided_by,
                under_grant: under_grant.as_deref(),
            };
            Some((run_id, call_id.as_str(), ending))
        }
        Event::ApprovalExpired {
            run_id,
            call_id,
            deadline,
            ..
        } => {
            let ending = Ending::Expired {
                deadline: *deadline,
            };
            Some((run_id, call_id.as_str(), ending))
        }
        Event::ApprovalCancelled {
            run_id,
            call_id,
            cancelled_by,
            ..
        } => {
            let ending = Ending::Cancelled { by: cancelled_by };
            Some((run_id, call_id.as_str(), ending))
        }
        _ => None,
    }
}

/// Records (as `notified`) that a channel was told of a request, per call it showed.
async fn audit_sent(state: &AppState, delivery: &Delivery) {
    let Event::ApprovalRequested { run_id, calls, .. } = &delivery.event.event else {
        return;
    };
    let shown = calls
        .iter()
        .filter(|c| delivery.call_id.as_ref().is_none_or(|id| *id == c.call_id));
    for call in shown {
        let mut entry = AuditEntry::new(run_id, AuditKind::Notified);
        entry.call_id = Some(call.call_id.clone());
        entry.via = Some(delivery.channel.to_string());
        entry.digest = Some(call.digest.clone());
        entry.detail = serde_json::json!({"delivery_id": delivery.id});
        match state.store.audit(&entry).await {
            Ok(queued) => {
                if let Err(e) = state.outbox.publish(run_id, &queued).await {
                    warn!(error = %e, "a delivery's audit copy waits in the outbox");
                }
            }
            Err(e) => warn!(error = %e, "could not audit a delivery"),
        }
    }
}

/// `base`, then twice that for each further attempt, at most an hour.
fn retry_delay(base_ms: u64, attempt: u64) -> Duration {
    let factor = 1u64 << attempt.saturating_sub(1).min(20);
    Duration::from_millis(base_ms.saturating_mul(factor)).min(Duration::from_secs(3600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_and_stop_growing_at_an_hour() {
        assert_eq!(retry_delay(5000, 1), Duration::from_secs(5));
        assert_eq!(retry_delay(5000, 3), Duration::from_secs(20));
        assert_eq!(retry_delay(5000, 30), Duration::from_secs(3600));
    }
}
