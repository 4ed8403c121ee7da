//! Probes and failing fast: with Redis or NATS stopped, `/readyz` (gateway and worker) says
//! what is missing and API calls answer 503 at once instead of hanging, `/livez` stays 200,
//! and everything works again once the server is back.

use countersign_fake_model::refund_brain;
use countersign_tests::app::{ADMIN_KEY, PATIENCE, TestApp};
use countersign_tests::infra::Infra;
use countersign_tests::wait_for;
use reqwest::StatusCode;
use serde_json::Value;
use std::time::{Duration, Instant};

/// A request that has not been answered by then counts as hanging.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);

async fn app_on_restartable_servers() -> TestApp {
    let app = TestApp::builder(refund_brain)
        .on(Infra::start_restartable().await)
        .start()
        .await;
    // The worker has started (connected and pulling) before a test takes a server away.
    let worker = app.worker_probes_url(0).to_string();
    wait_for("the worker to be ready", PATIENCE, || async {
        let r = client().get(format!("{worker}/readyz")).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    app
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .build()
        .unwrap()
}

/// GETs `url`, failing the test if no answer comes within [`CLIENT_TIMEOUT`]; returns the
/// status, the body and how long the answer took.
async fn probe(url: &str, key: Option<&str>) -> (StatusCode, Value, Duration) {
    let started = Instant::now();
    let mut request = client().get(url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url} did not answer within {CLIENT_TIMEOUT:?}: {e:?}"));
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body, started.elapsed())
}

fn assert_not_ready(what: &str, body: &Value, failed: &str) {
    assert_eq!(body["error"]["code"], "not_ready", "{what}: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(failed), "{what} names {failed}: {body}");
    assert_ne!(
        body["error"]["details"]["checks"][failed], "ok",
        "{what}: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_requests_answer_503_at_once_and_all_recovers_when_it_is_back() {
    let app = app_on_restartable_servers().await;
    let gateway = app.gateway_url.clone();
    let worker = app.worker_probes_url(0).to_string();
    for url in [&gateway, &worker] {
        let (status, body, _) = probe(&format!("{url}/readyz"), None).await;
        assert_eq!(status, StatusCode::OK, "{url}: {body}");
        // Redis, NATS, the six streams and the consumers it pulls from.
        let checks = body["checks"].as_object().unwrap();
        assert_eq!(checks.len(), 9, "{body}");
        assert!(checks.values().all(|c| c == "ok"), "{body}");
    }

    app.infra.stop_redis().await;
    let (status, body, ready_took) = probe(&format!("{gateway}/readyz"), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_not_ready("the gateway", &body, "redis");
    assert_eq!(body["error"]["details"]["checks"]["nats"], "ok", "{body}");
    let (status, body, api_took) = probe(&format!("{gateway}/v1/approvals"), Some(ADMIN_KEY)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let (status, body, _) = probe(&format!("{worker}/readyz"), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_not_ready("the worker", &body, "redis");
    for url in [&gateway, &worker] {
        let (status, _, _) = probe(&format!("{url}/livez"), None).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{url}/livez does not depend on Redis"
        );
    }
    println!(
        "with Redis stopped: /readyz 503 after {ready_took:?}, /v1/approvals 503 after {api_took:?}"
    );

    app.infra.start_redis().await;
    for url in [&gateway, &worker] {
        wait_for("/readyz to be 200 again", PATIENCE, || async {
            let (status, _, _) = probe(&format!("{url}/readyz"), None).await;
            (status == StatusCode::OK).then_some(())
        })
        .await;
    }
    let run_id = app.start_run("Refund A-1001 please.").await;
    let run = app.wait_status(&run_id, "awaiting_approval").await;
    let (status, body) = app
        .approve(&run_id, "toolu_2", &run["pending"][0]["digest"])
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    app.wait_status(&run_id, "completed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nats_stopped_readyz_is_503_and_names_nats() {
    let app = app_on_restartable_servers().await;
    let gateway = app.gateway_url.clone();
    let worker = app.worker_probes_url(0).to_string();

    app.infra.stop_nats().await;
    for url in [&gateway, &worker] {
        // The client notices the lost connection on its own time; each probe still answers.
        let body = wait_for("/readyz to say NATS is away", PATIENCE, || async {
            let (status, body, _) = probe(&format!("{url}/readyz"), None).await;
            (status == StatusCode::SERVICE_UNAVAILABLE).then_some(body)
        })
        .await;
        assert_not_ready(url, &body, "nats");
        assert_eq!(body["error"]["details"]["checks"]["redis"], "ok", "{body}");
        let (status, _, _) = probe(&format!("{url}/livez"), None).await;
        assert_eq!(status, StatusCode::OK);
    }

    app.infra.start_nats().await;
    for url in [&gateway, &worker] {
        wait_for("/readyz to be 200 again", PATIENCE, || async {
            let (status, _, _) = probe(&format!("{url}/readyz"), None).await;
            (status == StatusCode::OK).then_some(())
        })
        .await;
    }
}
