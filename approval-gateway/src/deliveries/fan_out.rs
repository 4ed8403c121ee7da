//! The first step of a delivery: an approval event becomes one delivery per channel target
//! (and, on channels that show each call on its own, per call), queued on DELIVERIES. The
//! event is matched here, once: webhooks get it whole, Slack and email per call.

use crate::channels::delivery::Delivery;
use crate::grants;
use crate::model_approvals;
use crate::state::AppState;
use async_nats::jetstream::Message;
use countersign_model::approval::Channel;
use countersign_model::events::{Envelope, Event};
use countersign_model::run::{Run, RunId, RunStatus};
use countersign_runtime::work::Outcome;
use countersign_store::StoreError;
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
    // What waits is read from the stored run, never from the message: an event forged on
    // NATS, or one the run has moved past, shows nothing and decides nothing.
    let run = match as_stored(state, &mut envelope.event).await {
        Ok(Stored::Shown(run)) => Some(*run),
        Ok(Stored::Other) => None,
        Ok(Stored::Nothing) => return Outcome::Ack,
        Err(e) => {
            warn!(error = %e, "could not read the run of an approval event; it will come again");
            return Outcome::Retry(Duration::from_secs(1));
        }
    };
    // Rebuilt from the stored run, the event is as large as what the model said: cut to what
    // NATS takes, or the deliveries carrying it would be refused and the event tried forever.
    if run.is_some() && !envelope.event.fit(state.bus.event_limit()) {
        warn!(
            limit = state.bus.event_limit(),
            "an approval event does not fit the payload limit even cut"
        );
    }
    // Calls a standing grant covers, then those a reviewer model approved, are decided now,
    // and nobody is asked about them.
    if let (Some(run), Event::ApprovalRequested { calls, .. }) = (&run, &mut envelope.event) {
        match grants::apply(state, run, calls).await {
            Ok(decided) => calls.retain(|c| !decided.contains(&c.call_id)),
            Err(e) => {
                warn!(error = %e, "could not look for standing grants; the event will come again");
                return Outcome::Retry(Duration::from_secs(1));
            }
        }
        match model_approvals::apply(state, run, calls).await {
            Ok(decided) => calls.retain(|c| !decided.contains(&c.call_id)),
            Err(e) => {
                warn!(error = %e, "could not record a reviewer model's approvals; the event will come again");
                return Outcome::Retry(Duration::from_secs(1));
            }
        }
        if calls.is_empty() {
            return Outcome::Ack;
        }
    }
    queue_deliveries(state, msg, &envelope).await
}

/// Queues the event's deliveries: one per channel target, and per call on channels that
/// show each call on its own.
async fn queue_deliveries(state: &AppState, msg: &Message, envelope: &Envelope) -> Outcome {
    // The event's own message id (or stream position) makes each delivery's id stable when
    // this message is redelivered.
    let event_id = msg
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Msg-Id"))
        .map(std::string::ToString::to_string)
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

/// An approval event once checked against its stored run.
enum Stored {
    /// It asks about held calls: these, as stored, in the run as stored.
    Shown(Box<Run>),
    /// It does not show held calls (a decision, an expiry…): as it came.
    Other,
    /// None of the calls it names waits in the run's current turn: nothing to show.
    Nothing,
}

/// Replaces what an event asking about held calls says of them (their input, digest,
/// reviewers, the model's words, the agent, the requester) with the run as stored, keeping
/// only the calls it names that the run still waits on in that turn.
async fn as_stored(state: &AppState, event: &mut Event) -> Result<Stored, StoreError> {
    let (run_id, named): (&RunId, Vec<&str>) = match &*event {
        Event::ApprovalRequested { run_id, calls, .. } => {
            (run_id, calls.iter().map(|c| c.call_id.as_str()).collect())
        }
        Event::ApprovalReminder { run_id, call, .. } => (run_id, vec![call.call_id.as_str()]),
        _ => return Ok(Stored::Other),
    };
    let named: BTreeSet<String> = named.into_iter().map(str::to_string).collect();
    let Some(run) = state.store.load(run_id).await? else {
        return Ok(Stored::Nothing);
    };
    if run.status != RunStatus::AwaitingApproval {
        return Ok(Stored::Nothing);
    }
    let Event::ApprovalRequested {
        turn,
        text,
        mut calls,
        evidence,
        ..
    } = Event::approval_requested(&run)
    else {
        unreachable!("approval_requested makes an approval.requested")
    };
    calls.retain(|c| named.contains(&c.call_id));
    match event {
        Event::ApprovalRequested { turn: asked, .. } if *asked != turn || calls.is_empty() => {
            return Ok(Stored::Nothing);
        }
        Event::ApprovalRequested {
            agent,
            text: said,
            calls: shown,
            evidence: seen,
            requested_by,
            ..
        } => {
            (*agent, *said, *shown, *seen) = (run.agent.clone(), text, calls, evidence);
            requested_by.clone_from(&run.requested_by);
        }
        Event::ApprovalReminder {
            agent,
            text: said,
            call,
            requested_by,
            ..
        } => {
            let Some(held) = calls.pop() else {
                return Ok(Stored::Nothing);
            };
            (*agent, *said, **call) = (run.agent.clone(), text, held);
            requested_by.clone_from(&run.requested_by);
        }
        _ => {}
    }
    Ok(Stored::Shown(Box::new(run)))
}
