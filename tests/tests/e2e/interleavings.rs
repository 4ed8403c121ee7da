//! A run cut where nobody planned it: a worker killed while a call that needs nobody is in
//! flight, a cancel accepted while the model thinks, a cancel landing while an approved call
//! runs, with or without a crash. Each was a hole a model-based test found: a free call ran
//! twice under new call ids, tools ran after a cancel was accepted, and calls that ran were
//! missing from the trail of a cancelled run.
//!
//! The model gives fresh call ids on every request, as real models do, so a worker that asks
//! the model a stored turn again gets other calls: the tools' own log shows it.

use countersign_fake_model::Brain;
use countersign_fake_model::{anthropic_text, anthropic_tool_use, turn};
use countersign_tests::app::{PATIENCE, REQUESTER_KEY, TestApp};
use countersign_tests::held_tools::{HeldTools, Received};
use countersign_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

/// A call the model asks for: its tool and its input.
type Asked = (&'static str, fn() -> Value);

/// A brain whose first turn asks for `calls` under ids of its own making, new at each
/// request, and whose next turn answers.
fn fresh_ids(calls: &'static [Asked]) -> Brain {
    Brain::from(move |request: &Value| match turn(request) {
        0 => {
            let ids: Vec<String> = calls
                .iter()
                .map(|_| format!("toolu_{}", uuid::Uuid::new_v4().simple()))
                .collect();
            let asked: Vec<(&str, &str, Value)> = calls
                .iter()
                .zip(&ids)
                .map(|((tool, input), id)| (id.as_str(), *tool, input()))
                .collect();
            anthropic_tool_use("Let me see to it.", &asked)
        }
        _ => anthropic_text("Done."),
    })
}

fn lookup() -> Value {
    json!({"order_id": "A-1002"})
}

/// Under the policy's $20: runs without a person.
fn small_refund() -> Value {
    json!({"order_id": "A-1002", "amount": 12, "reason": "late"})
}

/// Over the policy's $20: held for a person.
fn large_refund() -> Value {
    json!({"order_id": "A-1002", "amount": 150, "reason": "broken"})
}

/// An app whose agent calls a [`HeldTools`] service holding `held` paths, with one worker.
async fn with_held_tools(brain: Brain, held: &[&str]) -> (TestApp, HeldTools) {
    let mut app = TestApp::builder(brain).workers(0).start().await;
    let tools = HeldTools::start(held).await;
    app.rewrite_agent(|agent| agent.replace(&app.tools.base_url, &tools.base_url));
    app.spawn_worker();
    (app, tools)
}

/// Waits until `path` has received a request, and returns the first.
async fn in_flight(tools: &HeldTools, path: &str) -> Received {
    wait_for(&format!("a request to {path}"), PATIENCE, || async {
        tools.received(path).into_iter().next()
    })
    .await
}

async fn cancel(app: &TestApp, run_id: &str) {
    let (status, body) = app
        .request(
            Method::POST,
            &format!("/v1/runs/{run_id}/cancel"),
            Some(REQUESTER_KEY),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

/// Approves the run's held refund once it waits, and waits until the refund is in flight;
/// its call id.
async fn approved_in_flight(app: &TestApp, tools: &HeldTools, run_id: &str) -> String {
    let paused = app.wait_status(run_id, "awaiting_approval").await;
    let call = &paused["pending"][0];
    let call_id = call["call_id"].as_str().unwrap();
    let (status, body) = app.approve(run_id, call_id, &call["digest"]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    in_flight(tools, "/refunds").await;
    call_id.to_string()
}

/// Waits for the run to end cancelled, with the refund sent once; the run and its trail.
async fn cancelled_with_one_refund(
    app: &TestApp,
    tools: &HeldTools,
    run_id: &str,
) -> (Value, Vec<Value>) {
    let run = app.wait_status(run_id, "cancelled").await;
    assert_eq!(tools.received("/refunds").len(), 1);
    (run, app.audit_entries(run_id).await)
}

/// The trail's `executed` entries for `call_id`.
fn executions<'a>(trail: &'a [Value], call_id: &str) -> Vec<&'a Value> {
    trail
        .iter()
        .filter(|e| e["kind"] == "executed" && e["call_id"] == call_id)
        .collect()
}

/// The results the run's record gives the model's calls: call id to result text.
fn recorded_results(run: &Value) -> Vec<(String, String)> {
    run["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| {
            let id = b["tool_use_id"].as_str().unwrap().to_string();
            (id, b["content"].to_string())
        })
        .collect()
}

#[tokio::test]
async fn a_free_call_cut_off_by_a_crash_is_reported_unknown_and_not_run_again_under_new_ids() {
    let brain = fresh_ids(&[("get_order", lookup), ("issue_refund", small_refund)]);
    let (mut app, tools) = with_held_tools(brain, &["/refunds"]).await;
    let run_id = app.start_run("Refund $12 for A-1002.").await;
    let first = in_flight(&tools, "/refunds").await;
    app.kill_worker(0).await;
    tools.release();
    app.spawn_worker();

    let run = app.wait_status(&run_id, "completed").await;
    let refunds = tools.received("/refunds");
    assert_eq!(refunds.len(), 1, "the refund was sent once: {refunds:?}");
    // The worker that took over played the stored turn: the model was asked each turn once.
    assert_eq!(app.model.requests().len(), 2);
    let trail = app.audit_entries(&run_id).await;
    let refund = executions(&trail, first.call_id());
    assert_eq!(refund.len(), 1, "{trail:?}");
    assert_eq!(refund[0]["detail"]["outcome"], "unknown", "{trail:?}");
    let lookups = tools.received("/orders/lookup");
    assert_eq!(lookups.len(), 1, "{lookups:?}");
    assert_eq!(executions(&trail, lookups[0].call_id()).len(), 1);
    let results = recorded_results(&run);
    assert!(
        results
            .iter()
            .any(|(id, text)| id == first.call_id() && text.contains("unknown")),
        "{results:?}"
    );
}

#[tokio::test]
async fn no_call_starts_after_a_cancel_accepted_while_the_model_thinks() {
    let brain = fresh_ids(&[("get_order", lookup), ("issue_refund", small_refund)]);
    let (app, tools) = with_held_tools(brain, &[]).await;
    app.model.set_latency(Duration::from_millis(1500));
    let run_id = app.start_run("Refund $12 for A-1002.").await;
    app.wait_status(&run_id, "running").await;
    cancel(&app, &run_id).await;

    app.wait_status(&run_id, "cancelled").await;
    assert!(tools.received("/orders/lookup").is_empty());
    assert!(tools.received("/refunds").is_empty());
    let trail = app.audit_entries(&run_id).await;
    assert!(trail.iter().all(|e| e["kind"] != "executed"), "{trail:?}");
}

#[tokio::test]
async fn a_call_running_when_a_cancel_lands_during_the_resume_is_in_the_trail_and_the_record() {
    let brain = fresh_ids(&[("issue_refund", large_refund)]);
    let (app, tools) = with_held_tools(brain, &["/refunds"]).await;
    let run_id = app.start_run("Refund $150 for A-1002.").await;
    let call_id = &approved_in_flight(&app, &tools, &run_id).await;
    cancel(&app, &run_id).await;
    tools.release();

    let (run, trail) = cancelled_with_one_refund(&app, &tools, &run_id).await;
    let refund = executions(&trail, call_id);
    assert_eq!(refund.len(), 1, "{trail:?}");
    assert_eq!(refund[0]["detail"]["outcome"], "approved", "{trail:?}");
    let results = recorded_results(&run);
    assert!(
        results
            .iter()
            .any(|(id, text)| id == call_id && text.contains("refunded")),
        "{results:?}"
    );
}

#[tokio::test]
async fn calls_started_before_a_crash_and_a_cancel_are_in_the_trail_and_the_record() {
    let brain = fresh_ids(&[("get_order", lookup), ("issue_refund", large_refund)]);
    let (mut app, tools) = with_held_tools(brain, &["/refunds"]).await;
    let run_id = app.start_run("Look A-1002 up and refund $150.").await;
    let call_id = &approved_in_flight(&app, &tools, &run_id).await;
    app.kill_worker(0).await;
    cancel(&app, &run_id).await;
    tools.release();
    app.spawn_worker();

    let (run, trail) = cancelled_with_one_refund(&app, &tools, &run_id).await;
    let refund = executions(&trail, call_id);
    assert_eq!(refund.len(), 1, "{trail:?}");
    assert_eq!(refund[0]["detail"]["outcome"], "unknown", "{trail:?}");
    // The free lookup that ran before the pause is in both too.
    let lookup = in_flight(&tools, "/orders/lookup").await;
    assert_eq!(executions(&trail, lookup.call_id()).len(), 1, "{trail:?}");
    let results = recorded_results(&run);
    let answered: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert!(answered.contains(&call_id.as_str()), "{results:?}");
    assert!(answered.contains(&lookup.call_id()), "{results:?}");
}

#[tokio::test]
async fn a_call_a_policy_change_released_and_a_cancel_cut_short_keeps_its_release_in_the_trail() {
    let brain = fresh_ids(&[("issue_refund", large_refund)]);
    let (app, tools) = with_held_tools(brain, &["/refunds"]).await;
    let run_id = app.start_run("Refund $150 for A-1002.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let call_id = paused["pending"][0]["call_id"].as_str().unwrap();
    // The limit rises over the waiting refund: the worker closes it and releases it.
    app.rewrite_agent(|agent| agent.replace("input.amount > 20.0", "input.amount > 200.0"));
    in_flight(&tools, "/refunds").await;
    cancel(&app, &run_id).await;
    tools.release();

    let (_, trail) = cancelled_with_one_refund(&app, &tools, &run_id).await;
    let released = trail.iter().any(|e| {
        e["kind"] == "policy_changed"
            && e["call_id"] == call_id
            && e["detail"]["outcome"] == "released"
    });
    assert!(released, "{trail:?}");
    assert_eq!(executions(&trail, call_id).len(), 1, "{trail:?}");
}
