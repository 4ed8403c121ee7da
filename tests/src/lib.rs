//! Test harness: real NATS and Redis in containers built from Debian's binaries, the fake LLM
//! API of `countersign-fake-model`, the demo tools service, and the two services started
//! in-process on port 0 with a namespace of their own.

// Support code for its own tests and binaries, read beside its uses: never a library for others.
#![allow(missing_docs)]

pub mod app;
pub mod browser;
pub mod fake_slack;
pub mod held_tools;
pub mod images;
pub mod infra;
pub mod live;
pub mod logs;
pub mod mcp_server;
pub mod model_check;
pub mod otlp_receiver;
pub mod pki;
pub mod redis_deployments;
pub mod smtp_sink;
pub mod webhook_receiver;

use std::time::Duration;

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The kinds of an audit trail's entries (`GET /v1/runs/{id}/audit`), in order.
pub fn audit_kinds(trail: &serde_json::Value) -> Vec<String> {
    trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["entry"]["kind"].as_str().unwrap().to_string())
        .collect()
}

/// Runs `command` to its end and returns what it printed; panics with its error output if it
/// failed.
pub fn output_of(command: &mut std::process::Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of one series (`name{labels}` exactly as exposed) in Prometheus text, if there.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

/// Starts a refund run of `agent` on the gateway at `base` with `key` (which must start runs) and waits,
/// within `timeout`, until a worker has paused it; the run's id. `what` names the wait.
pub async fn start_until_paused(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    agent: &str,
    what: &str,
    timeout: Duration,
) -> String {
    let started = http
        .post(format!("{base}/v1/runs"))
        .bearer_auth(key)
        .json(&serde_json::json!({"agent": agent, "input": "Refund order A-1001."}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202, "{what}: the run starts");
    let run: serde_json::Value = started.json().await.unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_string();
    wait_for(
        &format!("{what}: run {run_id} to pause"),
        timeout,
        || async {
            let run: serde_json::Value = http
                .get(format!("{base}/v1/runs/{run_id}"))
                .bearer_auth(key)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (run["status"] == "awaiting_approval").then_some(())
        },
    )
    .await;
    run_id
}

/// The claims of a receipt (a compact JWS), read without checking its signature: what a test
/// compares with what the deciders were shown.
pub fn receipt_claims(token: &serde_json::Value) -> serde_json::Value {
    use base64::Engine;
    let token = token.as_str().expect("a receipt");
    let payload = token.split('.').nth(1).expect("a compact JWS");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url");
    serde_json::from_slice(&bytes).expect("JSON claims")
}
