//! Approvals in stages, through the door of external agents and the decision script: a deploy
//! needs the on-call engineer (carol), then a change manager (alice or bob). Later stages are
//! asked only once the earlier ones approved, a rejection at any stage ends it, an edit at
//! stage 2 sends the edited call back to stage 1, and the receipt names every stage.

use super::door::{ask_at, external, until_held};
use countersign_tests::app::{PATIENCE, REQUESTER_KEY, TestApp};
use countersign_tests::{receipt_claims, wait_for};
use reqwest::StatusCode;
use serde_json::{Value, json};

const AGENT: &str = "release";

const AGENT_FILE: &str = r#"name = "release"

[model]
provider = "external"

[[tools]]
name = "deploy"
input_schema = { type = "object", properties = { service = { type = "string" }, version = { type = "string" } }, required = ["service", "version"] }
[tools.approval]
reason = "deploys change production"
[[tools.approval.stages]]
name = "on-call"
approvers = ["carol"]
[[tools.approval.stages]]
name = "change manager"
approvers = ["alice", "bob"]
"#;

async fn app() -> TestApp {
    external(AGENT, AGENT_FILE).start().await
}

/// A deploy of `version` asked by rick at the door, once held at stage 1; its run's id.
async fn deploy(app: &TestApp, idem: &str, version: &str) -> String {
    let ask =
        json!({"tool": "deploy", "input": {"service": "api", "version": version}, "wait_secs": 0});
    let (status, asked) = ask_at(app, AGENT, REQUESTER_KEY, idem, ask).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{asked}");
    until_held(app, &asked).await["run_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The run's held call once it waits at stage `number`.
async fn at_stage(app: &TestApp, run: &str, number: u64) -> Value {
    wait_for("the call at its stage", PATIENCE, || async {
        let (_, state) = app.get(&format!("/v1/runs/{run}")).await;
        let held = state["pending"]
            .as_array()?
            .iter()
            .find(|c| c["decision"].is_null())?
            .clone();
        (state["status"] == "awaiting_approval" && held["stage"]["number"] == number)
            .then_some(held)
    })
    .await
}

async fn decide(
    app: &TestApp,
    person: &str,
    run: &str,
    held: &Value,
    edit: Option<&str>,
) -> (StatusCode, Value) {
    let mut decision =
        json!({"call_id": held["call_id"], "digest": held["digest"], "action": "approve"});
    if let Some(version) = edit {
        decision["action"] = json!("edit");
        decision["input"] = json!({"service": "api", "version": version});
        decision["note"] = json!("the fixed build");
    }
    app.decide_as(person, run, decision).await
}

/// The decision recorded on the run's call `call_id`, once there is one.
async fn decided(app: &TestApp, run: &str, call_id: &str) -> Value {
    wait_for("the decision", PATIENCE, || async {
        let (_, state) = app.get(&format!("/v1/runs/{run}")).await;
        let calls = state["pending"].as_array()?.clone();
        let call = calls.iter().find(|c| c["call_id"] == call_id)?;
        (!call["decision"].is_null()).then(|| call["decision"].clone())
    })
    .await
}

#[tokio::test]
async fn stages_are_asked_in_order_and_the_receipt_names_every_stage() {
    let app = app().await;
    let run = deploy(&app, "d-1", "1.2.0").await;
    let first = at_stage(&app, &run, 1).await;
    assert_eq!(first["deciders"], json!(["carol"]), "{first}");
    assert_eq!(
        first["reason"],
        "deploys change production. Approvals in order: stage 1 (on-call) of 2"
    );
    // The change managers are not asked yet.
    let (status, refused) = decide(&app, "alice", &run, &first, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(refused["error"]["refusal"], "not_approver");
    let (status, answer) = decide(&app, "carol", &run, &first, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // Stage 1's approval lets nothing run: no receipt.
    let stage_one = decided(&app, &run, first["call_id"].as_str().unwrap()).await;
    assert!(stage_one["receipt"].is_null(), "{stage_one}");

    let second = at_stage(&app, &run, 2).await;
    assert_eq!(second["deciders"], json!(["alice", "bob"]), "{second}");
    assert_ne!(second["call_id"], first["call_id"]);
    assert_eq!(second["digest"], first["digest"], "the same call, as shown");
    assert_eq!(
        second["reason"],
        "deploys change production. Approvals in order: stage 2 (change manager) of 2; stage 1 (on-call) approved by carol"
    );
    let (status, refused) = decide(&app, "carol", &run, &second, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    let (status, answer) = decide(&app, "bob", &run, &second, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let last = decided(&app, &run, second["call_id"].as_str().unwrap()).await;
    let claims = receipt_claims(&last["receipt"]);
    assert_eq!(claims["decided_by"], json!(["bob"]), "{claims}");
    assert_eq!(
        claims["stages"],
        json!([{"stage": 1, "decided_by": "carol"}]),
        "{claims}"
    );
    app.wait_status(&run, "completed").await;
}

#[tokio::test]
async fn a_rejection_at_the_second_stage_ends_it() {
    let app = app().await;
    let run = deploy(&app, "d-2", "1.2.0").await;
    let first = at_stage(&app, &run, 1).await;
    assert_eq!(
        decide(&app, "carol", &run, &first, None).await.0,
        StatusCode::OK
    );
    let second = at_stage(&app, &run, 2).await;
    let reject = json!({"call_id": second["call_id"], "digest": second["digest"],
                        "action": "reject", "reason": "freeze week"});
    let (status, answer) = app.decide_as("alice", &run, reject).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.wait_status(&run, "completed").await;
    // The agent's call ends rejected, with the stage 2 reviewer's reason, and nothing ran.
    let path = format!(
        "/v1/runs/{run}/calls/{}?wait_secs=0",
        first["call_id"].as_str().unwrap()
    );
    let (_, state) = app.get(&path).await;
    assert_eq!(state["status"], "rejected", "{state}");
    assert_eq!(state["decision"]["decided_by"], "alice", "{state}");
    assert_eq!(state["decision"]["reason"], "freeze week", "{state}");
}

#[tokio::test]
async fn an_edit_at_stage_two_goes_back_to_stage_one_and_an_edit_at_stage_one_goes_on() {
    let app = app().await;
    let run = deploy(&app, "d-3", "1.2.0").await;
    let first = at_stage(&app, &run, 1).await;
    // carol's edit at stage 1 is stage 1's approval of the edited call.
    let (status, answer) = decide(&app, "carol", &run, &first, Some("1.2.1")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let second = at_stage(&app, &run, 2).await;
    assert_eq!(second["input"]["version"], "1.2.1", "{second}");
    assert_ne!(second["digest"], first["digest"]);
    // alice's edit at stage 2 sends her edit back to carol.
    let (status, answer) = decide(&app, "alice", &run, &second, Some("1.2.2")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let again = at_stage(&app, &run, 1).await;
    assert_eq!(again["input"]["version"], "1.2.2", "{again}");
    assert_eq!(again["deciders"], json!(["carol"]));
    assert!(
        again["reason"].as_str().unwrap().ends_with(
            "stage 1 (on-call) of 2; sent back by alice's edit at stage 2 (change manager)"
        ),
        "{again}"
    );
    assert_eq!(
        decide(&app, "carol", &run, &again, None).await.0,
        StatusCode::OK
    );
    let last = at_stage(&app, &run, 2).await;
    assert_eq!(
        decide(&app, "bob", &run, &last, None).await.0,
        StatusCode::OK
    );
    let decision = decided(&app, &run, last["call_id"].as_str().unwrap()).await;
    let claims = receipt_claims(&decision["receipt"]);
    assert_eq!(
        claims["input_digest"],
        countersign_receipt::input_digest(&json!({"service": "api", "version": "1.2.2"}))
    );
    assert_eq!(
        claims["stages"],
        json!([{"stage": 1, "decided_by": "carol"}]),
        "{claims}"
    );
    app.wait_status(&run, "completed").await;
}
