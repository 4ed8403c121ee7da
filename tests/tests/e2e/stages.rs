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

/// Where a generated history's deploy stands, in the reference model.
#[derive(Debug)]
struct Expected {
    stage: u64,
    version: String,
    /// Who approved stage 1 of the call as it stands, when it is at stage 2.
    first: Option<&'static str>,
}

/// Generated histories (seeded, `MODEL_CHECK_SEED` replays): four deploys at once, each
/// decided by a drawn sequence of approvals, edits, a rejection, a person of the other stage
/// trying, and a late click on the call of a stage already passed, checked step by step
/// against a reference model of the stages: the stage the call waits at, its input, who the
/// reason says approved stage 1; a wrong person and a late click change nothing; the call
/// runs at most once, only after stage 2's approval, with a receipt naming both stages and
/// binding the input as last edited.
#[tokio::test]
async fn generated_histories_of_stage_decisions_follow_the_reference_model() {
    let seed = std::env::var("MODEL_CHECK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
    println!("stage histories: seed {seed} (MODEL_CHECK_SEED={seed} plays them again)");
    let mut rng = countersign_tests::model_check::rng::Rng::new(seed);
    let histories: Vec<Vec<u64>> = (0..4)
        .map(|_| (0..8).map(|_| rng.below(10)).collect())
        .collect();
    let app = app().await;
    let played = futures::future::join_all(histories.iter().enumerate().map(|(i, draws)| {
        let app = &app;
        async move { play(app, i, draws).await }
    }))
    .await;
    for (draws, log) in histories.iter().zip(played) {
        println!("{draws:?}: {log}");
    }
}

/// Plays one history, checking each step; what happened, in words.
async fn play(app: &TestApp, i: usize, draws: &[u64]) -> String {
    let run = deploy(app, &format!("history-{i}"), "1.0.0").await;
    let mut expected = Expected {
        stage: 1,
        version: "1.0.0".into(),
        first: None,
    };
    let mut log = Vec::new();
    let mut passed: Option<Value> = None;
    let mut edits = 0;
    // The history, then approvals until it ends.
    for draw in draws.iter().copied().chain(std::iter::repeat(0)) {
        let held = at_stage(app, &run, expected.stage).await;
        assert_eq!(
            held["input"]["version"],
            expected.version.as_str(),
            "{held}"
        );
        let reason = held["reason"].as_str().unwrap();
        match expected.first {
            Some(who) => assert!(
                reason.ends_with(&format!("stage 1 (on-call) approved by {who}")),
                "{reason}"
            ),
            None => assert!(!reason.contains("approved by"), "{reason}"),
        }
        let (person, wrong) = match expected.stage {
            1 => ("carol", "alice"),
            _ => (["alice", "bob"][draw as usize % 2], "carol"),
        };
        match draw {
            // Someone of the other stage tries: refused, nothing changes.
            7 => {
                let (status, answer) = decide(app, wrong, &run, &held, None).await;
                assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
                log.push(format!("{wrong} refused at {}", expected.stage));
            }
            // A late click on the call of the stage passed before: refused, or, from the one
            // who decided it, answered as the repeat it is; either way nothing changes.
            8 if passed.is_some() => {
                let old = passed.as_ref().unwrap();
                let (status, answer) = decide(app, "carol", &run, old, None).await;
                let repeat = answer["decisions"][0]["status"] == "already_recorded";
                assert!(status.is_client_error() || repeat, "{status} {answer}");
                log.push("late click changed nothing".into());
            }
            // A rejection ends it: nothing runs.
            9 => {
                let reject = json!({"call_id": held["call_id"], "digest": held["digest"],
                                    "action": "reject", "reason": "not now"});
                let (status, answer) = app.decide_as(person, &run, reject).await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                app.wait_status(&run, "completed").await;
                log.push(format!("{person} rejected at {}", expected.stage));
                return log.join(", ");
            }
            // An edit (at most three: then the history goes on to its end).
            4..=6 if edits < 3 => {
                edits += 1;
                let version = format!("1.0.{edits}");
                let (status, answer) = decide(app, person, &run, &held, Some(&version)).await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                log.push(format!("{person} edited at {}", expected.stage));
                expected = match expected.stage {
                    1 => Expected {
                        stage: 2,
                        version,
                        first: Some(person),
                    },
                    _ => Expected {
                        stage: 1,
                        version,
                        first: None,
                    },
                };
                passed = Some(held);
            }
            // An approval: on to stage 2, or, at stage 2, the deploy runs.
            _ => {
                let (status, answer) = decide(app, person, &run, &held, None).await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                log.push(format!("{person} approved at {}", expected.stage));
                if expected.stage == 2 {
                    let decision = decided(app, &run, held["call_id"].as_str().unwrap()).await;
                    let claims = receipt_claims(&decision["receipt"]);
                    assert_eq!(claims["decided_by"], json!([person]), "{claims}");
                    let first = expected.first.unwrap();
                    assert_eq!(claims["stages"], json!([{"stage": 1, "decided_by": first}]));
                    let input = json!({"service": "api", "version": expected.version});
                    assert_eq!(
                        claims["input_digest"],
                        countersign_receipt::input_digest(&input)
                    );
                    app.wait_status(&run, "completed").await;
                    return log.join(", ");
                }
                expected = Expected {
                    stage: 2,
                    version: expected.version,
                    first: Some(person),
                };
                passed = Some(held);
            }
        }
    }
    unreachable!("a history ends with an approval or a rejection")
}
