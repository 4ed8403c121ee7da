//! One run is one trace: from `POST /v1/runs` (joining the caller's trace), through the
//! worker's steps, model and tool calls and the pause, to the decision and the resume, carried
//! across NATS by `traceparent` headers and across the wait by the run's stored context.

use countersign_fake_model::refund_brain;
use countersign_runtime::telemetry::{self, Endpoint, Telemetry};
use countersign_tests::app::{PATIENCE, REQUESTER_KEY, TestApp};
use countersign_tests::otlp_receiver::{OtlpReceiver, ReceivedSpan};
use countersign_tests::wait_for;
use serde_json::{Value, json};
use std::sync::Arc;

const CALLER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER_SPAN: &str = "b7ad6b7169203331";

/// Exports this process's spans to a receiver of its own. Each test is its own process, so
/// this is the process's only subscriber.
async fn exporting() -> (OtlpReceiver, Arc<Telemetry>) {
    let receiver = OtlpReceiver::start().await;
    let telemetry = telemetry::init_with(
        "countersign-test",
        Some(Endpoint::Url(receiver.url.clone())),
    );
    (receiver, Arc::new(telemetry))
}

/// Starts a refund run from a request in the caller's trace, and waits until it pauses.
async fn traced_run(app: &TestApp) -> (String, Value) {
    let response = app
        .http
        .post(format!("{}/v1/runs", app.gateway_url))
        .bearer_auth(REQUESTER_KEY)
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .json(&json!({"agent": "refunds", "input": "Refund A-1001 please."}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.unwrap();
    let run = body["run_id"].as_str().unwrap().to_string();
    let paused = app.wait_status(&run, "awaiting_approval").await;
    (run, paused["pending"][0]["digest"].clone())
}

/// The caller's trace as received, once it holds two worker steps (start and resume).
async fn both_steps(receiver: &OtlpReceiver, telemetry: &Arc<Telemetry>) -> Vec<ReceivedSpan> {
    wait_for("the run's spans", PATIENCE, || {
        let (telemetry, receiver) = (telemetry.clone(), receiver.clone());
        async move {
            tokio::task::spawn_blocking(move || telemetry.flush())
                .await
                .unwrap();
            let spans = receiver.trace(CALLER_TRACE);
            let resumed =
                named(&spans, "run.step").len() >= 2 && named(&spans, "model.call").len() >= 2;
            resumed.then_some(spans)
        }
    })
    .await
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn children<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a str> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .map(|s| s.name.as_str())
        .collect()
}

/// The one `run.start` span, a child of the caller's span.
fn start_span(spans: &[ReceivedSpan]) -> &ReceivedSpan {
    let start = named(spans, "run.start");
    assert_eq!(start.len(), 1, "{spans:#?}");
    assert_eq!(
        start[0].parent_span_id, CALLER_SPAN,
        "the caller's span is the parent"
    );
    start[0]
}

#[tokio::test]
async fn a_run_is_one_trace_from_its_request_to_its_resume() {
    let (receiver, telemetry) = exporting().await;
    let app = TestApp::spawn(refund_brain).await;
    let (run, digest) = traced_run(&app).await;
    let (status, _) = app.approve(&run, "toolu_2", &digest).await;
    assert_eq!(status, 200);
    app.wait_status(&run, "completed").await;

    // The announcements on NATS carry the trace in their headers.
    let js = app.infra.jetstream().await;
    let approvals = js
        .get_stream(format!("{}_APPROVALS", app.namespace))
        .await
        .unwrap();
    for event in ["requested", "decided"] {
        let subject = format!("{}.approval.{event}.{run}", app.namespace);
        let message = approvals
            .get_last_raw_message_by_subject(&subject)
            .await
            .unwrap();
        let traceparent = message
            .headers
            .get("traceparent")
            .map(async_nats::HeaderValue::as_str);
        assert!(
            traceparent.is_some_and(|t| t.starts_with(&format!("00-{CALLER_TRACE}-"))),
            "{subject}: {traceparent:?}"
        );
    }

    // run.start ─┬─ run.step (runs.start's header) ── model.call, tool.call, run.pause
    //            └─ decision (the run's stored context) ── run.step (approval.decided's
    //               header) ── tool.call, model.call
    let spans = both_steps(&receiver, &telemetry).await;
    let start = start_span(&spans);
    let decision = named(&spans, "decision");
    assert_eq!(decision.len(), 1, "{spans:#?}");
    let mut under_start = children(&spans, start);
    under_start.sort();
    assert_eq!(under_start, ["decision", "run.step"], "{spans:#?}");
    assert_eq!(children(&spans, decision[0]), ["run.step"], "{spans:#?}");
    let first_step = spans
        .iter()
        .find(|s| s.name == "run.step" && s.parent_span_id == start.span_id)
        .unwrap();
    let mut first = children(&spans, first_step);
    first.sort();
    assert_eq!(
        first,
        ["model.call", "run.pause", "tool.call"],
        "get_order ran; {spans:#?}"
    );
    let resume = named(&spans, "run.step")
        .into_iter()
        .find(|s| s.parent_span_id == decision[0].span_id)
        .unwrap();
    let mut resumed = children(&spans, resume);
    resumed.sort();
    assert_eq!(
        resumed,
        ["model.call", "tool.call"],
        "issue_refund ran; {spans:#?}"
    );
}

#[tokio::test]
async fn a_decision_published_late_by_an_outbox_sweeper_stays_in_the_run_trace() {
    let (receiver, telemetry) = exporting().await;
    let app = TestApp::spawn(refund_brain).await;
    let (run, digest) = traced_run(&app).await;
    // Stored outside any span and never published: only a sweeper announces it.
    app.approve_without_announcing(&run, "toolu_2", &digest)
        .await;
    app.wait_status(&run, "completed").await;

    let spans = both_steps(&receiver, &telemetry).await;
    let start = start_span(&spans);
    let resumed_by_sweeper = named(&spans, "outbox.sweep").into_iter().any(|sweep| {
        sweep.parent_span_id == start.span_id && children(&spans, sweep).contains(&"run.step")
    });
    assert!(resumed_by_sweeper, "{spans:#?}");
}

#[tokio::test]
async fn a_worker_process_exports_its_spans_where_otel_exporter_otlp_endpoint_says() {
    let receiver = OtlpReceiver::start().await;
    let app = TestApp::builder(refund_brain).workers(0).start().await;
    let (_dir, config) = super::chaos::worker_process_config(&app);
    // The standard variable is a base URL: the exporter adds `/v1/traces`.
    let base = receiver.url.trim_end_matches("/v1/traces");
    let _worker = super::chaos::worker_command(&config)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", base)
        .spawn()
        .expect("start a worker process");
    let run = app.start_run("Refund A-1001 please.").await;
    app.wait_status(&run, "awaiting_approval").await;
    // This process exports nothing, so the worker's step is the root of a trace of its own.
    wait_for("the worker process's spans", PATIENCE, || async {
        let names = receiver.names();
        (names.contains(&"run.step".to_string()) && names.contains(&"model.call".to_string()))
            .then_some(())
    })
    .await;
}
