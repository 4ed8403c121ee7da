//! Following a run's live events (`live.<run>` on the `LIVE` stream) for one client of `GET
//! /v1/runs/{id}/events`: from the run's first event, numbered 1, 2, 3… in the stream's
//! order, skipping those the client already has (`Last-Event-ID`), then live until the run
//! ends.
//!
//! Every gateway numbers a run's events alike: it reads them from the start (an ordered
//! consumer of its own, which acks nothing and starts again where it was if it misses a
//! message) and counts each once. An announcement the outbox published again after
//! JetStream's duplicate window is stored twice under one `Nats-Msg-Id`, and counted once.
//!
//! Memory is bounded per client: the consumer fetches at most [`FETCH`] events ahead and
//! [`BUFFER`] wait to be written. A client that leaves them waiting longer than
//! `live_slow_reader_ms` is cut off: what is buffered is written, then a `stream.cut` event,
//! and the stream ends; it reconnects with `Last-Event-ID` to carry on.
//!
//! Streams are bounded too ([`Streams`]): at most `live_max_streams` open on this gateway,
//! `live_max_streams_per_principal` of one principal and `live_max_streams_per_run` of one
//! run; one more is answered `429 too_many_streams` with `Retry-After`. An admitted stream
//! gives its connection's place among `max_connections` back (`ConnectionSlot`) and closes
//! its connection when it ends, so a key that opens streams by the thousand holds at most its
//! share of this budget, and never the connections that probes and decisions need.

use crate::error::ApiError;
use crate::server::ConnectionSlot;
use crate::state::AppState;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use axum::http::header::CONNECTION;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use countersign_model::live::ENDINGS;
use countersign_model::run::{Run, RunId};
use countersign_runtime::bus::{Bus, BusError};
use countersign_runtime::metrics::Metrics;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Events the consumer fetches ahead of the client.
const FETCH: i64 = 16;
/// Events waiting to be written to the client.
const BUFFER: usize = 32;
/// What a client refused a stream is told to wait before it tries again, in seconds.
const RETRY_AFTER_SECS: u64 = 10;

pub(crate) mod streams;

use streams::Admitted;

/// Who follows a run: the principal its streams are counted against, and the place of its
/// connection among `max_connections`, given back once the stream is admitted.
pub(crate) struct Follower<'a> {
    pub(crate) principal: &'a str,
    pub(crate) slot: Option<ConnectionSlot>,
}

/// How many of the run's events a client has: its `Last-Event-ID`, else `after` (for clients
/// that cannot set the header), else none.
pub(crate) fn resume_point(headers: &HeaderMap, after: Option<&str>) -> Result<u64, ApiError> {
    let last_id = headers
        .get("last-event-id")
        .map(|v| v.to_str().unwrap_or("?"))
        .or(after);
    match last_id.map(str::trim) {
        None | Some("") => Ok(0),
        Some(id) => id.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "Last-Event-ID {id:?} is not an id of this stream (its ids are 1, 2, 3, …)"
            ))
        }),
    }
}

/// The answer to a client of the run's events that has the first `after`: server-sent events
/// with heartbeats, until the run ends or `stop` (the gateway is shutting down; the client
/// reconnects to another). A client that has every event of a run that ended is told `204 No
/// Content`, which stops an `EventSource` from reconnecting; one past a cap of [`Streams`],
/// `429 too_many_streams`.
pub(crate) async fn answer(
    state: &AppState,
    run: &Run,
    after: u64,
    follower: Follower<'_>,
    stop: CancellationToken,
) -> Result<Response, ApiError> {
    if run.status.is_terminal() && after > 0 && after >= stored(&state.bus, &run.run_id).await? {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let admitted = state
        .live_streams
        .admit(&state.config, follower.principal, run.run_id.as_str())
        .map_err(|streams::Full(full)| {
            state.metrics.live_stream("refused");
            ApiError::too_many_streams(
                format!("{full}; close one or try again later"),
                RETRY_AFTER_SECS,
            )
        })?;
    let from = Follow {
        after,
        patience: Duration::from_millis(state.config.live_slow_reader_ms),
        stop,
    };
    let events = follow(
        &state.bus,
        &run.run_id,
        from,
        admitted,
        state.metrics.clone(),
    )
    .await?;
    if let Some(slot) = follower.slot {
        slot.give_back();
    }
    let heartbeat = Duration::from_millis(state.config.live_heartbeat_ms);
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(heartbeat))
        .into_response();
    // Proxies that buffer answers (nginx's default) would hold the events back.
    response.headers_mut().insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    // The connection left the `max_connections` budget: it serves nothing after the stream.
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    Ok(response)
}

/// Where a client starts: how many of the run's events it already has.
struct Follow {
    after: u64,
    /// How long an event waits for room before the client is cut off.
    patience: Duration,
    stop: CancellationToken,
}

/// How many events the run's stream holds (a repeated announcement counted twice), as far
/// as the stream's retention reaches.
async fn stored(bus: &Bus, run: &RunId) -> Result<u64, BusError> {
    let stream = bus
        .js
        .get_stream_no_info(bus.names.live_stream())
        .await
        .map_err(err)?;
    let info = stream
        .info_with_subjects(bus.names.live_subject(run))
        .await
        .map_err(err)?;
    let count = futures::TryStreamExt::try_collect::<Vec<_>>(info)
        .await
        .map_err(err)?;
    Ok(count.into_iter().map(|(_, n)| n as u64).sum())
}

/// The run's events for one client, as server-sent events; the stream keeps its place in
/// [`Streams`] until it is dropped.
async fn follow(
    bus: &Bus,
    run: &RunId,
    from: Follow,
    admitted: Admitted,
    metrics: Metrics,
) -> Result<impl Stream<Item = Result<Event, Infallible>> + use<>, BusError> {
    let config = OrderedConfig {
        filter_subject: bus.names.live_subject(run),
        deliver_policy: DeliverPolicy::All,
        max_batch: FETCH,
        ..Default::default()
    };
    let consumer = bus
        .js
        .create_consumer_on_stream(config, bus.names.live_stream())
        .await
        .map_err(err)?;
    let messages = consumer.messages().await.map_err(err)?;
    let (tx, rx) = mpsc::channel(BUFFER);
    let cut = Arc::new(AtomicBool::new(false));
    metrics.live_stream("opened");
    tokio::spawn(forward(messages, tx, from, cut.clone(), metrics));
    let events = futures::stream::unfold((rx, admitted), |(mut rx, admitted)| async {
        rx.recv().await.map(|event| (event, (rx, admitted)))
    });
    // Once the buffer is written: the cut-off notice, if the client was cut off.
    let notice = futures::stream::once(async move {
        cut.load(Ordering::Acquire).then(|| {
            Ok(Event::default().event("stream.cut").data(
                json!({"reason": "the client read too slowly; reconnect with Last-Event-ID to carry on"})
                    .to_string(),
            ))
        })
    })
    .filter_map(std::future::ready);
    Ok(events.chain(notice))
}

async fn forward(
    mut messages: async_nats::jetstream::consumer::pull::Ordered,
    tx: mpsc::Sender<Result<Event, Infallible>>,
    Follow {
        after,
        patience,
        stop,
    }: Follow,
    cut: Arc<AtomicBool>,
    metrics: Metrics,
) {
    let mut seq = 0u64;
    let mut seen = HashSet::new();
    let ended = loop {
        let message = tokio::select! {
            _ = stop.cancelled() => break "left",
            _ = tx.closed() => break "left",
            message = messages.next() => message,
        };
        let message = match message {
            Some(Ok(message)) => message,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "a run's live events could not be read; the stream ends and the client reconnects");
                break "left";
            }
            None => break "left",
        };
        let repeated = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .is_some_and(|id| !seen.insert(id.to_string()));
        if repeated {
            continue;
        }
        seq += 1;
        let Ok(Value::Object(mut event)) = serde_json::from_slice::<Value>(&message.payload) else {
            tracing::warn!(seq, "a live event that is not a JSON object is passed over");
            continue;
        };
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message")
            .to_string();
        let last = ENDINGS.contains(&kind.as_str());
        if seq > after {
            event.insert("seq".into(), seq.into());
            let sse = Event::default()
                .id(seq.to_string())
                .event(event_name(&kind))
                .data(Value::Object(event).to_string());
            match tx.send_timeout(Ok(sse), patience).await {
                Ok(()) => {}
                Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                    cut.store(true, Ordering::Release);
                    break "cut";
                }
                Err(mpsc::error::SendTimeoutError::Closed(_)) => break "left",
            }
        }
        if last {
            break "ended";
        }
    };
    metrics.live_stream(ended);
}

/// The longest event name written; a longer type is cut.
const MAX_EVENT_NAME: usize = 64;

/// A live event's type as an SSE event name. Anything may be published on a run's live
/// subject, and a line break in the name would end the field (axum refuses it with a panic,
/// which would stop the run's stream at that event for every client, on every reconnect):
/// what is not a letter, digit, `.`, `_` or `-` becomes `_`. The event's data keeps its
/// `type` as it was, escaped as JSON.
fn event_name(kind: &str) -> String {
    let name: String = kind
        .chars()
        .take(MAX_EVENT_NAME)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '_',
        })
        .collect();
    if name.is_empty() {
        "message".into()
    } else {
        name
    }
}

fn err(e: impl std::fmt::Display) -> BusError {
    BusError::JetStream(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::event_name;

    #[test]
    fn an_event_name_holds_no_line_break() {
        assert_eq!(event_name("text.delta"), "text.delta");
        assert_eq!(
            event_name("text.delta\nevent: run.completed\r"),
            "text.delta_event__run.completed_"
        );
        assert_eq!(event_name(""), "message");
        assert_eq!(event_name(&"x".repeat(500)).len(), 64);
    }
}
