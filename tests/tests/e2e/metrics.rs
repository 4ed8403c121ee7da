//! `/metrics` on the gateway and on a worker's health port: after one refund cycle and one
//! refused decision, each shows what it did (and only that: each service counts its own).
//! Behind a bearer token, or on an address of its own, as operators choose.

use countersign_fake_model::refund_brain;
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::infra::free_port;
use countersign_tests::metric_value as value;
use countersign_tests::wait_for;
use futures::FutureExt;
use serde_json::json;
use std::panic::AssertUnwindSafe;

async fn scrape(app: &TestApp, url: &str) -> String {
    let response = app.http.get(url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    response.text().await.unwrap()
}

#[tokio::test]
async fn the_gateway_and_a_worker_count_and_time_what_they_did() {
    let app = TestApp::spawn(refund_brain).await;
    let run = app.start_run("Refund A-1001 please.").await;
    let paused = app.wait_status(&run, "awaiting_approval").await;
    let stale = json!([{"call_id": "toolu_2", "digest": format!("sha256:{}", "0".repeat(64)), "action": "approve"}]);
    let (status, body) = app.decide(&run, stale).await;
    assert_eq!(status, 409);
    // One name for the refusal: the API's `refusal` is the metric's `outcome` below.
    assert_eq!(body["error"]["code"], "stale_digest", "{body}");
    assert_eq!(body["error"]["refusal"], "stale_digest", "{body}");
    let (status, _) = app
        .approve(&run, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    app.wait_status(&run, "completed").await;

    let gateway = scrape(&app, &format!("{}/metrics", app.gateway_url)).await;
    for (series, expected) in [
        (r#"countersign_runs_total{event="started"}"#, 1.0),
        (
            r#"countersign_decisions_total{door="api",outcome="recorded"}"#,
            1.0,
        ),
        (
            r#"countersign_decisions_total{door="api",outcome="stale_digest"}"#,
            1.0,
        ),
        ("countersign_decision_seconds_count", 1.0),
    ] {
        assert_eq!(
            value(&gateway, series),
            Some(expected),
            "{series} in\n{gateway}"
        );
    }
    // Scripts, and the pipelines that read a run with its decisions (each `GET` of a run).
    for command in ["EVALSHA", "PIPELINE"] {
        let series = format!(r#"countersign_redis_command_seconds_count{{command="{command}"}}"#);
        assert!(
            value(&gateway, &series) > Some(0.0),
            "{series} in
{gateway}"
        );
    }
    assert_eq!(
        value(&gateway, r#"countersign_runs_total{event="paused"}"#),
        None,
        "a worker's count"
    );

    // The worker sees the completion a moment after the API shows it: its save comes first.
    let url = format!("{}/metrics", app.worker_probes_url(0));
    let worker = wait_for("the worker to count the completion", PATIENCE, || async {
        let text = scrape(&app, &url).await;
        value(&text, r#"countersign_runs_total{event="completed"}"#).map(|_| text)
    })
    .await;
    for (series, expected) in [
        (r#"countersign_runs_total{event="paused"}"#, 1.0),
        (r#"countersign_runs_total{event="resumed"}"#, 1.0),
        (r#"countersign_runs_total{event="completed"}"#, 1.0),
        (r#"countersign_calls_total{event="held"}"#, 1.0),
        (r#"countersign_calls_total{event="resolved"}"#, 1.0),
        ("countersign_pause_seconds_count", 1.0),
        ("countersign_resume_seconds_count", 1.0),
        (
            r#"countersign_model_call_seconds_count{provider="anthropic"}"#,
            2.0,
        ),
        // The fake counts 10 tokens in and 10 out per answer, as the API's usage says.
        (
            r#"countersign_model_tokens_total{provider="anthropic",kind="input"}"#,
            20.0,
        ),
        (
            r#"countersign_model_tokens_total{provider="anthropic",kind="output"}"#,
            20.0,
        ),
        (
            r#"countersign_tool_call_seconds_count{tool="get_order"}"#,
            1.0,
        ),
        (
            r#"countersign_tool_call_seconds_count{tool="issue_refund"}"#,
            1.0,
        ),
    ] {
        assert_eq!(
            value(&worker, series),
            Some(expected),
            "{series} in\n{worker}"
        );
    }
    assert!(
        value(&worker, "countersign_jetstream_publish_seconds_count") > Some(0.0),
        "{worker}"
    );
    assert_eq!(
        value(&worker, r#"countersign_runs_total{event="started"}"#),
        None,
        "the gateway's count"
    );
}

#[tokio::test]
async fn a_model_refusing_with_overloaded_is_asked_again_and_the_redelivery_is_counted() {
    let app = TestApp::spawn(refund_brain).await;
    app.model.overload_next(1);
    let input = "Refund A-1001 please.";
    let run = app.start_run(input).await;
    app.wait_status(&run, "awaiting_approval").await;
    assert_eq!(
        app.model.requests_for(input).len(),
        2,
        "refused once, answered the second time"
    );
    let worker = scrape(&app, &format!("{}/metrics", app.worker_probes_url(0))).await;
    let series = r#"countersign_jetstream_redeliveries_total{stream="RUNS"}"#;
    assert_eq!(value(&worker, series), Some(1.0), "{worker}");
}

const METRICS_TOKEN: &str = "prometheus-scrape-token-0123";

/// The status and body of a GET, with `token` as a bearer token if given.
async fn get(app: &TestApp, url: &str, token: Option<&str>) -> (u16, String) {
    let mut request = app.http.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test]
async fn with_a_metrics_token_metrics_answer_only_its_bearer() {
    let app = TestApp::builder(refund_brain)
        .gateway(|c| c.metrics_token = Some(METRICS_TOKEN.into()))
        .worker(|c| c.metrics_token = Some(METRICS_TOKEN.into()))
        .start()
        .await;
    app.refund_cycle().await;
    let worker = app.worker_probes_url(0).to_string();
    for base in [app.gateway_url.clone(), worker.clone()] {
        let url = format!("{base}/metrics");
        for refused in [
            None,
            Some("prometheus-scrape-token-0124"),
            Some("test-admin-key-0123456789"),
        ] {
            let (status, body) = get(&app, &url, refused).await;
            assert_eq!(status, 401, "{url} with {refused:?}: {body}");
            assert!(!body.contains("countersign_"), "{body}");
        }
        let (status, body) = get(&app, &url, Some(METRICS_TOKEN)).await;
        assert_eq!(status, 200, "{url}: {body}");
        assert!(body.contains("countersign_runs_total"), "{body}");
    }
    // The probes stay open: the orchestrator that calls them has no token.
    assert_eq!(get(&app, &format!("{worker}/readyz"), None).await.0, 200);
    assert_eq!(
        get(&app, &format!("{}/readyz", app.gateway_url), None)
            .await
            .0,
        200
    );
}

#[tokio::test]
async fn with_a_metrics_listen_address_metrics_are_served_there_alone() {
    // A port found free may be taken by another test before the services bind it: then the
    // app does not start, and is started again on other ports (a few times at most).
    let mut attempts = 0;
    let (app, gateway_metrics, worker_metrics) = loop {
        attempts += 1;
        let gateway_metrics = format!("127.0.0.1:{}", free_port());
        let worker_metrics = format!("127.0.0.1:{}", free_port());
        let (gateway, worker) = (gateway_metrics.clone(), worker_metrics.clone());
        let starting = TestApp::builder(refund_brain)
            .gateway(|c| c.metrics_listen = Some(gateway))
            .worker(move |c| c.metrics_listen = Some(worker.clone()))
            .start();
        match AssertUnwindSafe(starting).catch_unwind().await {
            Ok(app) => break (app, gateway_metrics, worker_metrics),
            Err(_) if attempts < 3 => println!("the app did not start; again, on other ports"),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    };
    app.refund_cycle().await;
    let worker = app.worker_probes_url(0).to_string();
    for (main, apart) in [
        (app.gateway_url.clone(), gateway_metrics),
        (worker, worker_metrics),
    ] {
        let (status, body) = get(&app, &format!("{main}/metrics"), None).await;
        assert_eq!(status, 404, "{main}: {body}");
        assert!(!body.contains("countersign_"), "{body}");
        let apart = format!("http://{apart}");
        let (status, body) = wait_for("the metrics listener", PATIENCE, || async {
            let answer = get(&app, &format!("{apart}/metrics"), None).await;
            (answer.0 == 200).then_some(answer)
        })
        .await;
        assert_eq!(status, 200);
        assert!(body.contains("countersign_runs_total"), "{body}");
        // Only /metrics there.
        assert_eq!(get(&app, &format!("{apart}/readyz"), None).await.0, 404);
        assert_eq!(get(&app, &format!("{apart}/v1/runs"), None).await.0, 404);
    }
}
