//! Notifications. Every approval event fans out to the channels that should hear of it: one
//! delivery message per channel target on the DELIVERIES work queue. Each delivery is sent on
//! its own and, when it fails, handed back to JetStream with a growing delay, so a slow or
//! failing channel holds up no other and a gateway restart loses no retry. Every gateway
//! runs both loops; the shared durable consumers split the work between them.
//!
//! The event is matched here, once: webhooks get it whole, and Slack and email are told
//! through the verbs of [`Deliver`]. On shutdown the loops stop pulling and the deliveries
//! in flight get a few seconds to finish; what is cut off is not acked, so JetStream sends
//! it again.

use crate::channels::delivery::{Ask, Deliver, Delivery, DeliveryError, Ending};
use crate::channels::email::Email;
use crate::channels::slack::Slack;
use crate::channels::webhook;
use crate::state::AppState;
use async_nats::jetstream::consumer::pull::MessagesError;
use async_nats::jetstream::{AckKind, Message};
use countersign_model::agent::Channel;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::events::{Envelope, Event};
use countersign_runtime::bus::ConsumerSettings;
use futures::StreamExt;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Deliveries sent at once by one gateway.
const CONCURRENT_DELIVERIES: usize = 32;

/// How long deliveries in flight may take to finish once the gateway stops.
const DRAIN: Duration = Duration::from_secs(10);

/// Runs the fan-out and the delivery loops until `shutdown`, then lets the deliveries in
/// flight finish within [`DRAIN`].
pub(crate) async fn run(state: AppState, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut incoming = pull(&state).await?;
    state.consumers.pulling();
    info!("notifier started");
    let permits = Arc::new(Semaphore::new(CONCURRENT_DELIVERIES));
    let mut in_flight = JoinSet::new();
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => break,
            next = incoming.next() => next,
        };
        // Finished deliveries are reaped as new ones come, so the set stays small.
        while in_flight.try_join_next().is_some() {}
        match next {
            // The consumers ended (NATS went away for longer than the client waits): pull
            // again once it is back, rather than never notifying again.
            None => {
                warn!("notification streams ended; pulling again once NATS answers");
                state.consumers.stopped();
                let again = async {
                    loop {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        match pull(&state).await {
                            Ok(streams) => return streams,
                            Err(e) => warn!(error = %e, "cannot pull notifications yet"),
                        }
                    }
                };
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    streams = again => incoming = streams,
                }
                state.consumers.pulling();
            }
            Some((_, Err(e))) => warn!(error = %e, "error pulling notifications"),
            Some((true, Ok(msg))) => fan_out(&state, msg).await,
            Some((false, Ok(msg))) => {
                let permit = permits.clone().acquire_owned().await?;
                let state = state.clone();
                in_flight.spawn(async move {
                    deliver(&state, msg).await;
                    drop(permit);
                });
            }
        }
    }
    let left = in_flight.len();
    if tokio::time::timeout(DRAIN, in_flight.join_all())
        .await
        .is_err()
    {
        warn!(
            left,
            "deliveries still running at shutdown were cut off; they will be sent again"
        );
    }
    Ok(())
}

/// Approval events (`true`) and deliveries (`false`), from the two shared consumers.
async fn pull(
    state: &AppState,
) -> anyhow::Result<impl futures::Stream<Item = (bool, Result<Message, MessagesError>)> + use<>> {
    let names = &state.bus.names;
    let settings = ConsumerSettings {
        ack_wait: Duration::from_secs(30),
        max_ack_pending: 10_000,
    };
    let events = state
        .bus
        .shared_consumer(
            &names.approvals_stream(),
            &names.notifier_consumer(),
            names.approval_all(),
            &settings,
        )
        .await?
        .messages()
        .await?;
    let deliveries = state
        .bus
        .shared_consumer(
            &names.deliveries_stream(),
            &names.deliverer_consumer(),
            names.deliver_all(),
            &settings,
        )
        .await?
        .messages()
        .await?;
    Ok(futures::stream::select(
        events.map(|m| (true, m)),
        deliveries.map(|m| (false, m)),
    ))
}

/// The channels an event goes to: those its calls name, and webhooks that take everything.
/// Events carry channels as the policy wrote them; they are read here, where they come in.
fn targets(state: &AppState, event: &Event) -> BTreeSet<Channel> {
    let named: Vec<&String> = match event {
        Event::ApprovalRequested { calls, .. } => {
            calls.iter().flat_map(|c| &c.reviewers.channels).collect()
        }
        Event::ApprovalDecided { channels, .. }
        | Event::ApprovalExpired { channels, .. }
        | Event::ApprovalCancelled { channels, .. } => channels.iter().collect(),
        Event::ApprovalReminder { call, .. } => call.reviewers.channels.iter().collect(),
        _ => Vec::new(),
    };
    let mut channels = BTreeSet::new();
    for text in named {
        match text.parse() {
            Ok(channel) => _ = channels.insert(channel),
            Err(e) => warn!(error = %e, "an event names no channel; skipped"),
        }
    }
    for hook in state.config.webhooks.iter().filter(|h| h.all_events) {
        channels.insert(Channel::Webhook(hook.name.clone()));
    }
    channels
}

async fn fan_out(state: &AppState, msg: Message) {
    let envelope: Envelope = match serde_json::from_slice(&msg.payload) {
        Ok(envelope) => envelope,
        Err(e) => {
            warn!(error = %e, "unreadable approval event dropped");
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
    };
    // The event's own message id (or stream position) makes each delivery's id stable when
    // this message is redelivered.
    let event_id = msg
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Msg-Id"))
        .map(|v| v.to_string())
        .or_else(|| msg.info().ok().map(|i| i.stream_sequence.to_string()))
        .unwrap_or_default();
    let timestamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    for channel in targets(state, &envelope.event) {
        for call_id in calls_shown_apart(&channel, &envelope.event) {
            let delivery = Delivery {
                id: format!(
                    "msg_{}",
                    countersign_model::digest::sha256_hex(format!(
                        "{event_id}|{channel}|{call_id:?}"
                    ))
                ),
                channel: channel.clone(),
                call_id,
                timestamp: timestamp.clone(),
                event: envelope.clone(),
            };
            // Channel names are not subject tokens; their hash is.
            let subject = state.bus.names.deliver(
                channel.kind(),
                &countersign_model::digest::sha256_hex(channel.to_string())[..16],
            );
            if let Err(e) = state
                .bus
                .publish_json(subject, &delivery.id, &delivery)
                .await
            {
                warn!(error = %e, "could not queue a delivery; the event will come again");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
                return;
            }
        }
    }
    let _ = msg.ack().await;
}

/// The deliveries one channel gets for an event: Slack and email show each call on its own
/// (`Some(call)` each), webhooks get the event whole (`None`).
fn calls_shown_apart(channel: &Channel, event: &Event) -> Vec<Option<String>> {
    if !channel.per_call() {
        return vec![None];
    }
    let named = channel.to_string();
    match event {
        Event::ApprovalRequested { calls, .. } => calls
            .iter()
            .filter(|c| c.reviewers.channels.contains(&named))
            .map(|c| Some(c.call_id.clone()))
            .collect(),
        Event::ApprovalDecided { call_id, .. }
        | Event::ApprovalExpired { call_id, .. }
        | Event::ApprovalCancelled { call_id, .. } => vec![Some(call_id.clone())],
        Event::ApprovalReminder { call, .. } => vec![Some(call.call_id.clone())],
        _ => Vec::new(),
    }
}

async fn deliver(state: &AppState, msg: Message) {
    let attempt = msg.info().map(|i| i.delivered as u32).unwrap_or(1);
    let delivery: Delivery = match serde_json::from_slice(&msg.payload) {
        Ok(d) => d,
        Err(e) => {
            warn!(error = %e, "unreadable delivery dropped");
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
    };
    let metrics = &state.metrics;
    if attempt > 1 {
        metrics.redelivered("DELIVERIES");
    }
    let result = send(state, &delivery).await;
    match &result {
        Ok(()) => audit_notified(state, &delivery).await,
        Err(_) => metrics.delivery_failed(delivery.channel.kind()),
    }
    let ack = match result {
        Ok(()) => msg.ack().await,
        Err(DeliveryError::Retry(why)) if attempt < state.config.delivery_max_attempts => {
            let delay = retry_delay(state.config.delivery_retry_base_ms, attempt);
            warn!(channel = %delivery.channel, attempt, ?delay, %why, "delivery failed; will retry");
            msg.ack_with(AckKind::Nak(Some(delay))).await
        }
        Err(DeliveryError::Retry(why) | DeliveryError::GiveUp(why)) => {
            warn!(channel = %delivery.channel, attempt, %why, "delivery given up");
            msg.ack_with(AckKind::Term).await
        }
    };
    if let Err(e) = ack {
        warn!(error = %e, "could not ack a delivery; it may be sent again");
    }
}

/// Sends one delivery to its channel.
async fn send(state: &AppState, delivery: &Delivery) -> Result<(), DeliveryError> {
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
        Event::ApprovalDecided {
            run_id,
            call_id,
            action,
            decided_by,
            ..
        } => {
            let ending = Ending::Decided {
                action: *action,
                by: decided_by,
            };
            to.ended(run_id, call_id, ending).await
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
            to.ended(run_id, call_id, ending).await
        }
        Event::ApprovalCancelled {
            run_id,
            call_id,
            cancelled_by,
            ..
        } => {
            let ending = Ending::Cancelled { by: cancelled_by };
            to.ended(run_id, call_id, ending).await
        }
        _ => Ok(()),
    }
}

/// Records that a channel was told of a request, per call it showed.
async fn audit_notified(state: &AppState, delivery: &Delivery) {
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
                    warn!(error = %e, "a notification's audit copy waits in the outbox");
                }
            }
            Err(e) => warn!(error = %e, "could not audit a notification"),
        }
    }
}

/// `base`, then twice that for each further attempt, at most an hour.
fn retry_delay(base_ms: u64, attempt: u32) -> Duration {
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
