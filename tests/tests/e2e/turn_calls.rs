//! A call id names one call for the life of a run, whatever ids the model gives: a model server
//! that numbers its calls afresh each turn gets each turn's call decided, timed and run on its
//! own, and ids holding what keys and parsers split on cannot break quorums or deadlines.

use countersign_fake_model::{openai_answer, turn};
use countersign_model::agent::Provider;
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::smtp_sink::SmtpSink;
use countersign_tests::wait_for;
use serde_json::{Value, json};
use std::collections::HashMap;

const FINANCE: &str = "approvers = [\"role:finance\"]\n";

fn refund(amount: u32) -> Value {
    json!({"order_id": "A-1001", "amount": amount, "reason": "arrived broken"})
}

fn approve(call_id: &str, digest: &Value) -> Value {
    json!({"call_id": call_id, "digest": digest, "action": "approve"})
}

/// A model server that numbers tool calls from `call_0` in every answer, as several
/// OpenAI-compatible servers do: a $129 refund, then a $400 one, then its answer.
fn renumbering_brain(request: &Value) -> Value {
    match turn(request) {
        0 => openai_answer(
            Some("Refunding the broken item."),
            &[("call_0", "issue_refund", refund(129))],
        ),
        1 => openai_answer(
            Some("And the rest of the order."),
            &[("call_0", "issue_refund", refund(400))],
        ),
        _ => openai_answer(Some("Both refunds are done."), &[]),
    }
}

/// Waits until the run is paused on turn `turns`; the run as the API shows it.
async fn paused_on(app: &TestApp, run_id: &str, turns: u32) -> Value {
    wait_for(&format!("turn {turns} to be held"), PATIENCE, || async {
        let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
        (run["status"] == "awaiting_approval" && run["turns"] == turns).then_some(run)
    })
    .await
}

/// The `tool` messages of the model's last request: (tool_call_id, content) each.
fn tool_messages(app: &TestApp) -> Vec<(String, String)> {
    let requests = app.model.requests();
    let last = requests.last().unwrap();
    last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let text = |field: &str| m[field].as_str().unwrap().to_string();
            (text("tool_call_id"), text("content"))
        })
        .collect()
}

/// The run's audit entries of `kind`: (actor, call_id) each, in order.
async fn audited(app: &TestApp, run_id: &str, kind: &str) -> Vec<(String, String)> {
    let (status, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    assert_eq!(status, 200, "{trail}");
    trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["entry"])
        .filter(|e| e["kind"] == kind)
        .map(|e| {
            let text = |field: &str| e[field].as_str().unwrap_or_default().to_string();
            (text("actor"), text("call_id"))
        })
        .collect()
}

/// The pending calls `GET /v1/approvals` lists.
async fn approvals(app: &TestApp) -> Vec<Value> {
    let (status, body) = app.get("/v1/approvals").await;
    assert_eq!(status, 200, "{body}");
    body["approvals"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_call_id_the_model_uses_again_in_a_later_turn_is_a_new_call_decided_and_run_on_its_own() {
    let app = TestApp::builder(renumbering_brain)
        .provider(Provider::Openai)
        .policy(FINANCE)
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let first = app.wait_status(&run_id, "awaiting_approval").await;
    assert_eq!(first["pending"][0]["call_id"], "call_0");
    let (status, body) = app
        .decide_as(
            "alice",
            &run_id,
            approve("call_0", &first["pending"][0]["digest"]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["status"], "recorded");

    // Turn 2's `call_0` is held again, as a call of its own that nobody has decided.
    let second = paused_on(&app, &run_id, 2).await;
    let call = &second["pending"][0];
    let call_id = call["call_id"].as_str().unwrap().to_string();
    assert_ne!(call_id, "call_0", "{second}");
    assert_eq!(call["model_call_id"], "call_0", "{second}");
    assert_eq!(call["input"]["amount"], 400);
    assert!(
        call["decision"].is_null(),
        "alice's decision is not this call's: {second}"
    );
    let listed = approvals(&app).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["call_id"], call_id.as_str());
    assert_eq!(listed[0]["input"]["amount"], 400);

    // alice's decision still names turn 1's call alone: asking again changes nothing.
    let (status, body) = app
        .decide_as(
            "alice",
            &run_id,
            approve("call_0", &first["pending"][0]["digest"]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["status"], "already_recorded");
    assert_eq!(approvals(&app).await.len(), 1);

    let (status, body) = app
        .decide_as("bob", &run_id, approve(&call_id, &call["digest"]))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["status"], "recorded");
    assert_eq!(body["resumes"], true);
    let done = app.wait_status(&run_id, "completed").await;
    assert_eq!(done["answer"], "Both refunds are done.");

    let refunds = app.tools.refunds();
    let amounts: Vec<&Value> = refunds.iter().map(|r| &r["amount"]).collect();
    assert_eq!(amounts, [&json!(129), &json!(400)]);
    // Each refund went to the tool once, under a key of its own.
    assert_eq!(
        app.tools.received_by_key("/refunds"),
        HashMap::from([
            (format!("{run_id}:1:call_0"), 1),
            (format!("{run_id}:2:{call_id}"), 1),
        ])
    );
    // The model is answered under its own id each turn, with that turn's refund.
    let answers = tool_messages(&app);
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert!(answers.iter().all(|(id, _)| id == "call_0"), "{answers:?}");
    assert!(answers[0].1.contains("rf_1"), "{answers:?}");
    assert!(answers[1].1.contains("rf_2"), "{answers:?}");
    assert_eq!(
        audited(&app, &run_id, "decided").await,
        [
            ("alice".to_string(), "call_0".to_string()),
            ("bob".to_string(), call_id.clone()),
        ]
    );
}

/// A model whose call ids hold what keys and parsers split on: `a|b` beside `a` (their votes
/// would share a prefix, their timers a separator), and `x|y`, left to its deadline.
fn hostile_brain(request: &Value) -> Value {
    match turn(request) {
        0 => openai_answer(
            Some("Three refunds."),
            &[
                ("a|b", "issue_refund", refund(30)),
                ("a", "issue_refund", refund(40)),
                ("x|y", "issue_refund", refund(50)),
            ],
        ),
        _ => openai_answer(Some("Done."), &[]),
    }
}

#[tokio::test]
async fn call_ids_holding_separators_cannot_break_a_quorum_or_a_deadline() {
    let policy = format!("{FINANCE}quorum = 2\ntimeout = \"5s\"\n");
    let app = TestApp::builder(hostile_brain)
        .provider(Provider::Openai)
        .policy(&policy)
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001 three times.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let pending = paused["pending"].as_array().unwrap();
    let ids: Vec<&str> = pending
        .iter()
        .map(|p| p["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t1.1", "a", "t1.3"], "{paused}");
    let model_ids: Vec<&Value> = pending.iter().map(|p| &p["model_call_id"]).collect();
    assert_eq!(model_ids, [&json!("a|b"), &Value::Null, &json!("x|y")]);
    let listed: Vec<Value> = approvals(&app)
        .await
        .iter()
        .map(|a| a["call_id"].clone())
        .collect();
    assert_eq!(listed, [json!("t1.1"), json!("a"), json!("t1.3")]);

    // The model's own id names no call here: decisions quote the call's.
    let (status, body) = app
        .decide_as("alice", &run_id, approve("a|b", &pending[0]["digest"]))
        .await;
    assert_eq!(status, 404, "{body}");

    // A quorum of two on each of the first two calls, counted apart.
    for (call, pending) in ids.iter().zip(pending).take(2) {
        let decision = approve(call, &pending["digest"]);
        let (status, body) = app.decide_as("alice", &run_id, decision.clone()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["decisions"][0]["status"], "approval_recorded",
            "{body}"
        );
        assert_eq!(body["decisions"][0]["approvals"], 1, "{body}");
        let (status, body) = app.decide_as("bob", &run_id, decision).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["decisions"][0]["status"], "recorded", "{body}");
    }
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    for decided in &run["pending"].as_array().unwrap()[..2] {
        assert_eq!(decided["decision"]["decided_by"], "alice, bob", "{run}");
    }
    assert!(run["pending"][2]["decision"].is_null(), "{run}");

    // Nobody decides `x|y`: its deadline fires, and the run goes on.
    app.wait_status(&run_id, "completed").await;
    assert_eq!(
        audited(&app, &run_id, "expired").await,
        [("countersign".to_string(), "t1.3".to_string())]
    );
    let answers = tool_messages(&app);
    let answered: Vec<&str> = answers.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(answered, ["a|b", "a", "x|y"]);
    assert!(answers[0].1.contains("refunded"), "{answers:?}");
    assert!(answers[1].1.contains("refunded"), "{answers:?}");
    assert!(answers[2].1.contains("deadline"), "{answers:?}");
    let refunds = app.tools.refunds();
    let amounts: Vec<&Value> = refunds.iter().map(|r| &r["amount"]).collect();
    assert_eq!(amounts, [&json!(30), &json!(40)]);
    assert_eq!(
        app.tools.received_by_key("/refunds"),
        HashMap::from([
            (format!("{run_id}:1:t1.1"), 1),
            (format!("{run_id}:1:a"), 1),
        ])
    );
}

const BASE: &str = "http://approvals.test";

/// The approve links of the mails sent to `address`, at least `count` of them, in order,
/// rewritten to the test gateway.
async fn approve_links(app: &TestApp, sink: &SmtpSink, address: &str, count: usize) -> Vec<String> {
    wait_for(&format!("{count} mails to {address}"), PATIENCE, || async {
        let links: Vec<String> = sink
            .mails()
            .iter()
            .filter(|m| m.to.iter().any(|t| t == address))
            .map(|m| m.links(BASE)[0].replacen(BASE, &app.gateway_url, 1))
            .collect();
        (links.len() >= count).then_some(links)
    })
    .await
}

/// Posts an email page's form as the reviewer's browser does, from the gateway's own page.
async fn post_form(app: &TestApp, link: &str) -> (u16, String) {
    let response = app
        .http
        .post(link)
        .header("origin", BASE)
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/x-www-form-urlencoded")
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test]
async fn a_link_mailed_for_a_call_never_decides_a_later_turns_call_with_the_same_id_and_input() {
    // The same refund asked twice, as `call_0` each time: both calls have the same digest.
    let brain = |request: &Value| match turn(request) {
        0 | 1 => openai_answer(
            Some("Refunding."),
            &[("call_0", "issue_refund", refund(129))],
        ),
        _ => openai_answer(Some("Done."), &[]),
    };
    let sink = SmtpSink::start().await;
    let email = sink.email_config(BASE);
    let policy = format!("{FINANCE}channels = [\"email:approvers\"]\n");
    let app = TestApp::builder(brain)
        .provider(Provider::Openai)
        .policy(&policy)
        .gateway(|c| c.email = Some(email))
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let first = app.wait_status(&run_id, "awaiting_approval").await;
    let turn_1_link = approve_links(&app, &sink, "bob@example.com", 1)
        .await
        .remove(0);
    let (status, body) = app
        .decide_as(
            "alice",
            &run_id,
            approve("call_0", &first["pending"][0]["digest"]),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    let second = paused_on(&app, &run_id, 2).await;
    let call = &second["pending"][0];
    assert_eq!(call["digest"], first["pending"][0]["digest"], "{second}");
    // bob's link of turn 1 is for turn 1's call, which alice decided: it decides nothing now.
    let (status, page) = post_form(&app, &turn_1_link).await;
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("Approved by alice"), "{page}");
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert!(run["pending"][0]["decision"].is_null(), "{run}");

    // The mail about turn 2's call brings links of its own, which decide it.
    let turn_2_link = approve_links(&app, &sink, "bob@example.com", 2)
        .await
        .remove(1);
    let (status, page) = post_form(&app, &turn_2_link).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Approved by bob via email"), "{page}");
    app.wait_status(&run_id, "completed").await;
    let call_id = call["call_id"].as_str().unwrap();
    assert_eq!(
        app.tools.received_by_key("/refunds"),
        HashMap::from([
            (format!("{run_id}:1:call_0"), 1),
            (format!("{run_id}:2:{call_id}"), 1),
        ])
    );
    assert_eq!(
        audited(&app, &run_id, "decided").await,
        [
            ("alice".to_string(), "call_0".to_string()),
            ("bob".to_string(), call_id.to_string()),
        ]
    );
}
