//! The first step of a delivery: an approval event becomes one delivery per channel target
//! (and, on channels that show each call on its own, per call), queued on DELIVERIES. The
//! event is matched here, once: webhooks get it whole, Slack and email per call.

use crate::channels::delivery::Delivery;
use crate::grants;
use crate::state::AppState;
use async_nats::jetstream::Message;
use countersign_model::agent::Channel;
use countersign_model::events::{Envelope, Event};
use countersign_runtime::work::Outcome;
use std::collections::BTreeSet;
use std::time::Duration;
use tracing::warn;

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

/// Queues the deliveries of one approval event; should one not be queued, the event is handed
/// back to come again (the deliveries' ids are stable, so those queued are not sent twice).
pub(super) async fn fan_out(state: &AppState, msg: &Message) -> Outcome {
    let mut envelope: Envelope = match serde_json::from_slice(&msg.payload) {
        Ok(envelope) => envelope,
        Err(e) => {
            warn!(error = %e, "unreadable approval event dropped");
            return Outcome::GiveUp;
        }
    };
    // Calls a standing grant covers are decided now, and nobody is asked about them.
    if let Event::ApprovalRequested {
        run_id,
        agent,
        calls,
        requested_by,
        ..
    } = &mut envelope.event
    {
        match grants::apply(state, run_id, agent, calls, requested_by.as_deref()).await {
            Ok(decided) => calls.retain(|c| !decided.contains(&c.call_id)),
            Err(e) => {
                warn!(error = %e, "could not look for standing grants; the event will come again");
                return Outcome::Retry(Duration::from_secs(1));
            }
        }
        if calls.is_empty() {
            return Outcome::Ack;
        }
    }
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
            let subject = state.bus.names.delivery(
                channel.kind(),
                &countersign_model::digest::sha256_hex(channel.to_string())[..16],
            );
            if let Err(e) = state
                .bus
                .publish_json(subject, &delivery.id, &delivery)
                .await
            {
                warn!(error = %e, "could not queue a delivery; the event will come again");
                return Outcome::Retry(Duration::from_secs(1));
            }
        }
    }
    Outcome::Ack
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
