//! A run's place in its trace, as a W3C `traceparent`. The gateway keeps the one of the
//! request that started the run in the run's document, so a decision made days later on any
//! gateway joins the same trace; every NATS message carries the one of the span that
//! published it in its `traceparent` header, so the worker that takes the message continues
//! from there. Without an exporter (see [`crate::telemetry`]) spans have no trace ids and
//! nothing is carried.

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::collections::HashMap;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header, HTTP or NATS, that carries it.
pub const HEADER: &str = "traceparent";

/// The `traceparent` of `span`, if it belongs to an exported trace. Starts the span, so a
/// parent must be given ([`adopt`]) before.
pub fn of(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove(HEADER)
}

/// The `traceparent` of the current span, if it belongs to an exported trace. Every publish
/// asks, so without an exporter it answers from one flag.
pub fn current() -> Option<String> {
    if !crate::telemetry::exporting() {
        return None;
    }
    of(&tracing::Span::current())
}

/// Makes `span`, not yet entered, a child of the span `traceparent` names; a missing or
/// malformed one leaves it a root.
pub fn adopt(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    let carrier = HashMap::from([(HEADER.to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        // Fails only without an exporter, when there is no trace to join.
        let _ = span.set_parent(cx);
    }
}

/// The `traceparent` header of a NATS message, if it has one.
pub fn from_nats(headers: Option<&async_nats::HeaderMap>) -> Option<&str> {
    headers?.get(HEADER).map(async_nats::HeaderValue::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_exporter_nothing_is_carried() {
        let span = tracing::info_span!("step");
        adopt(
            &span,
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        assert_eq!(of(&span), None);
        assert_eq!(from_nats(None), None);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            HEADER,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
        assert_eq!(
            from_nats(Some(&headers)),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
    }
}
