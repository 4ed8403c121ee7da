//! The door of external agents, `POST /v1/agents/{agent}/calls`: an agent written in code asks
//! before each call, through the same runs, policies, decisions and receipts as a countersign
//! agent's. `issue_refund` has an endpoint (the demo refunds service, which checks receipts),
//! so countersign runs it; `send_email` has none, so the agent runs it itself once released.

use base64::Engine;
use countersign_tests::app::{
    ADMIN_KEY, PATIENCE, READER_KEY, REQUESTER_KEY, REVIEWER_KEY, TestApp, TestAppBuilder,
};
use countersign_tests::live::LiveEvents;
use countersign_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const AGENT: &str = "desk";

pub(super) async fn app() -> TestApp {
    let app = TestApp::builder(|_: &Value| countersign_fake_model::anthropic_text("Unused."));
    let tools = "TOOLS";
    let agent = format!(
        r#"name = "{AGENT}"

[model]
provider = "external"

[[tools]]
name = "issue_refund"
input_schema = {{ type = "object", properties = {{ order_id = {{ type = "string" }}, amount = {{ type = "number" }}, reason = {{ type = "string" }} }}, required = ["order_id", "amount", "reason"] }}
http = {{ url = "{tools}/refunds" }}
[tools.approval]
when = "input.amount > 20.0"
reason = "Refund of ${{{{ input.amount }}}} moves money"

[[tools]]
name = "send_email"
input_schema = {{ type = "object", properties = {{ to = {{ type = "string" }}, body = {{ type = "string" }} }}, required = ["to", "body"] }}
[tools.approval]
reason = "Email leaves the company"

[[tools]]
name = "note_customer"
input_schema = {{ type = "object", properties = {{ customer = {{ type = "string" }}, note = {{ type = "string" }} }}, required = ["customer", "note"] }}
approval = "never"

[[tools]]
name = "page_oncall"
input_schema = {{ type = "object", properties = {{ message = {{ type = "string" }} }}, required = ["message"] }}
[tools.approval]
timeout = "1s"
"#
    );
    let app = app.start().await;
    // The refunds service's address is known once the app runs: the file is written then, and
    // read when it appears.
    let text = agent.replace(tools, &app.tools.base_url);
    std::fs::write(app.agents_dir().join(format!("{AGENT}.toml")), text).unwrap();
    wait_for("the desk agent loaded", PATIENCE, || async {
        let (_, answer) = ask(
            &app,
            REQUESTER_KEY,
            "probe",
            json!({"tool": "nope", "input": {}}),
        )
        .await;
        answer["error"]["message"]
            .as_str()?
            .contains("has no tool")
            .then_some(())
    })
    .await;
    app
}

/// An ask as `key`, under idempotency key `idem`.
pub(super) async fn ask(app: &TestApp, key: &str, idem: &str, body: Value) -> (StatusCode, Value) {
    ask_at(app, AGENT, key, idem, body).await
}

/// An app with the external agent `name` defined by `file` (its model is never asked).
pub(super) fn external<'a>(name: &str, file: &str) -> TestAppBuilder<'a> {
    TestApp::builder(|_: &Value| countersign_fake_model::anthropic_text("Unused."))
        .agent(&format!("{name}.toml"), file.to_string())
}

/// Cancels `run_id` with the requester's key, as the agent that asked would.
pub(super) async fn cancelled_by_requester(app: &TestApp, run_id: &str) {
    let (status, body) = app
        .request(
            Method::POST,
            &format!("/v1/runs/{run_id}/cancel"),
            Some(REQUESTER_KEY),
            Some(json!({"reason": "the customer withdrew"})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

/// An ask to `agent`'s door.
pub(super) async fn ask_at(
    app: &TestApp,
    agent: &str,
    key: &str,
    idem: &str,
    body: Value,
) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/agents/{agent}/calls", app.gateway_url))
        .bearer_auth(key)
        .header("Idempotency-Key", idem)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The call's state as `key` sees it, waiting up to `wait` seconds for an outcome.
pub(super) async fn look(
    app: &TestApp,
    key: &str,
    state: &Value,
    wait: u64,
) -> (StatusCode, Value) {
    let path = format!(
        "{}?wait_secs={wait}",
        state["links"]["self"].as_str().unwrap()
    );
    app.request(Method::GET, &path, Some(key), None).await
}

/// The asked call once its policy has held it for a person (the long poll waits for an
/// outcome, which a held call does not have, so this looks until it is held instead).
pub(super) async fn until_held(app: &TestApp, asked: &Value) -> Value {
    wait_for("the call held", PATIENCE, || async {
        let (_, state) = look(app, REQUESTER_KEY, asked, 1).await;
        (state["status"] == "pending").then_some(state)
    })
    .await
}

fn refund(amount: f64) -> Value {
    json!({"tool": "issue_refund", "input": {"order_id": "A-1001", "amount": amount, "reason": "damaged"},
           "message": "The customer sent a photo of the damage.", "session": "conv-1",
           "evidence": [{"tool": "get_order", "input": {"order_id": "A-1001"}, "content": "paid $40 by card"}]})
}

#[tokio::test]
async fn a_call_its_policy_lets_through_runs_once_and_is_answered_with_its_result() {
    let app = app().await;
    let (status, first) = ask(&app, REQUESTER_KEY, "k-small", refund(5.0)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "allowed", "{first}");
    assert_eq!(first["executes"], "countersign");
    assert_eq!(first["result"]["is_error"], false, "{first}");
    // The same ask again is the same call: answered from its run, never run again.
    let (status, again) = ask(&app, REQUESTER_KEY, "k-small", refund(5.0)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["run_id"], first["run_id"]);
    assert_eq!(app.tools.refunds().len(), 1);
    // The same key for another call is refused.
    let (status, other) = ask(&app, REQUESTER_KEY, "k-small", refund(6.0)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{other}");
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn a_held_call_waits_for_a_person_then_runs_with_its_receipt() {
    let app = app().await;
    let mut body = refund(40.0);
    body["wait_secs"] = json!(0);
    let (status, held) = ask(&app, REQUESTER_KEY, "k-big", body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{held}");
    let held = until_held(&app, &held).await;
    assert_eq!(
        held["held"]["reason"], "Refund of $40 moves money",
        "{held}"
    );
    assert!(held["held"]["deadline"].is_string() || held["held"]["deadline"].is_null());
    // The reviewer sees the agent's words and decides on the digest it was shown.
    let run_id = held["run_id"].as_str().unwrap();
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(
        run["text"], "The customer sent a photo of the damage.",
        "{run}"
    );
    assert_eq!(
        app.tools.refunds().len(),
        0,
        "nothing ran before the approval"
    );
    // What the agent had seen goes to the reviewers with the request.
    let (_, events) = LiveEvents::open(&app, run_id, ADMIN_KEY, None).await;
    let requested = events.unwrap().until("approval.requested").await;
    let evidence = &requested.last().unwrap().data["evidence"];
    assert_eq!(evidence[0]["tool"], "get_order", "{evidence}");
    assert_eq!(evidence[0]["content"], "paid $40 by card", "{evidence}");
    let (status, body) = app
        .approve(
            run_id,
            held["call_id"].as_str().unwrap(),
            &held["held"]["digest"],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, done) = look(&app, REQUESTER_KEY, &held, 30).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["status"], "approved", "{done}");
    assert_eq!(done["result"]["is_error"], false, "{done}");
    assert!(done["decision"]["receipt"].is_string(), "{done}");
    assert_eq!(app.tools.refunds().len(), 1);
    assert_eq!(
        app.tools.receipts().len(),
        1,
        "the refund ran with its receipt"
    );
    // A reviewer reads the call but never holds its receipt.
    let (_, seen) = look(&app, REVIEWER_KEY, &held, 0).await;
    assert_eq!(seen["status"], "approved");
    assert!(seen["decision"].get("receipt").is_none(), "{seen}");
}

#[tokio::test]
async fn a_tool_without_an_endpoint_is_released_to_the_agent_with_the_edited_input_or_the_reason() {
    let app = app().await;
    let email = |to: &str| json!({"tool": "send_email", "input": {"to": to, "body": "Hello"}, "wait_secs": 0});
    let (_, first) = ask(&app, REQUESTER_KEY, "k-mail-1", email("a@example.com")).await;
    let (_, second) = ask(&app, REQUESTER_KEY, "k-mail-2", email("b@example.com")).await;
    let first = until_held(&app, &first).await;
    let second = until_held(&app, &second).await;
    assert_eq!(first["executes"], "agent");
    let edited = json!({"to": "a@example.com", "body": "Hello, and sorry"});
    let (status, body) = app
        .decide(
            first["run_id"].as_str().unwrap(),
            json!([{"call_id": first["call_id"], "digest": first["held"]["digest"],
                    "action": "edit", "input": edited, "note": "Apologise"}]),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = app
        .decide(
            second["run_id"].as_str().unwrap(),
            json!([{"call_id": second["call_id"], "digest": second["held"]["digest"],
                    "action": "reject", "reason": "Not to this customer"}]),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, first) = look(&app, REQUESTER_KEY, &first, 30).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "edited", "{first}");
    assert_eq!(
        first["input"], edited,
        "the agent runs what the reviewer chose"
    );
    assert_eq!(first["decision"]["note"], "Apologise");
    let receipt = first["decision"]["receipt"]
        .as_str()
        .expect("a receipt for the agent's tool");
    let claims = claims(receipt);
    assert_eq!(claims["call_id"], first["call_id"], "{claims}");
    assert_eq!(claims["aud"], "send_email", "{claims}");
    assert_eq!(claims["action"], "edit", "{claims}");
    assert_eq!(
        claims["input_digest"],
        countersign_receipt::input_digest(&edited),
        "{claims}"
    );
    let (status, second) = look(&app, REQUESTER_KEY, &second, 30).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["status"], "rejected", "{second}");
    assert_eq!(second["decision"]["reason"], "Not to this customer");
    assert!(second.get("input").is_some());
}

/// A report of how the agent ran a call released to it, as `key`.
pub(super) async fn report(
    app: &TestApp,
    key: &str,
    state: &Value,
    body: Value,
) -> (StatusCode, Value) {
    let path = format!("{}/execution", state["links"]["self"].as_str().unwrap());
    app.request(Method::POST, &path, Some(key), Some(body))
        .await
}

#[tokio::test]
async fn a_released_call_is_claimed_by_one_attempt_and_its_end_is_in_the_trail() {
    let app = app().await;
    let email = json!({"tool": "send_email", "input": {"to": "a@example.com", "body": "Hello"}, "wait_secs": 0});
    let (_, asked) = ask(&app, REQUESTER_KEY, "k-run-1", email.clone()).await;
    let held = until_held(&app, &asked).await;
    // Not released while it waits for a person.
    let started = |attempt: &str| json!({"attempt": attempt, "status": "started"});
    let (status, body) = report(&app, REQUESTER_KEY, &held, started("early")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_released", "{body}");
    let run_id = held["run_id"].as_str().unwrap();
    let call_id = held["call_id"].as_str().unwrap();
    let (status, body) = app.approve(run_id, call_id, &held["held"]["digest"]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, released) = look(&app, REQUESTER_KEY, &held, 30).await;
    assert_eq!(released["status"], "approved", "{released}");
    assert!(released.get("execution").is_none(), "{released}");

    // An end from an attempt that never claimed it; a reviewer's report; a report that is
    // neither a start nor an end: each refused, changing nothing.
    let ended = json!({"attempt": "a", "status": "succeeded", "result": {"sent": true}});
    let (status, body) = report(&app, REQUESTER_KEY, &released, ended.clone()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_started", "{body}");
    let (status, body) = report(&app, REVIEWER_KEY, &released, started("r")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = report(
        &app,
        REQUESTER_KEY,
        &released,
        json!({"attempt": "a", "status": "failed"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // Two processes claim it at once: one runs it, the other is told it is taken.
    let (a, b) = tokio::join!(
        report(&app, REQUESTER_KEY, &released, started("a")),
        report(&app, REQUESTER_KEY, &released, started("b")),
    );
    let (winner, loser) = match a.0 {
        StatusCode::OK => (("a", a), b),
        _ => (("b", b), a),
    };
    assert_eq!(winner.1.0, StatusCode::OK, "{:?}", winner.1);
    assert_eq!(loser.0, StatusCode::CONFLICT, "{:?}", loser.1);
    assert_eq!(loser.1["error"]["code"], "execution_taken", "{}", loser.1);
    assert_eq!(
        loser.1["error"]["details"]["execution"]["attempt"],
        winner.0
    );
    let attempt = winner.0;
    assert_eq!(winner.1.1["execution"]["status"], "started");
    // The winner's claim asked again (a lost answer) is the same claim.
    let (status, _) = report(&app, REQUESTER_KEY, &released, started(attempt)).await;
    assert_eq!(status, StatusCode::OK);
    let loser_attempt = if attempt == "a" { "b" } else { "a" };
    let mut ended = ended;
    ended["attempt"] = json!(loser_attempt);
    let (status, body) = report(&app, REQUESTER_KEY, &released, ended.clone()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "execution_taken", "{body}");
    ended["attempt"] = json!(attempt);
    let (status, done) = report(&app, REQUESTER_KEY, &released, ended.clone()).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["execution"]["status"], "succeeded", "{done}");
    assert_eq!(done["execution"]["result"], json!({"sent": true}));
    // The same end again is answered as recorded; another end is refused.
    let (status, _) = report(&app, REQUESTER_KEY, &released, ended).await;
    assert_eq!(status, StatusCode::OK);
    let failed = json!({"attempt": attempt, "status": "failed", "error": "bounced"});
    let (status, body) = report(&app, REQUESTER_KEY, &released, failed).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "already_reported", "{body}");

    // Asked again with the same key (another process, after a crash): the same call, with
    // the record that says it ran, so it is not run again.
    let (status, again) = ask(&app, REQUESTER_KEY, "k-run-1", email).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["run_id"], held["run_id"]);
    assert_eq!(again["execution"]["status"], "succeeded", "{again}");

    // The trail holds the claim and the end, once each, and still verifies.
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    assert_eq!(trail["verified"], true, "{trail}");
    let kinds = |kind: &str| {
        trail["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| {
                e["entry"]["kind"] == kind && e["entry"]["detail"]["executed_by"] == "agent"
            })
            .map(|e| e["entry"].clone())
            .collect::<Vec<_>>()
    };
    let (claims, ends) = (kinds("started"), kinds("executed"));
    assert_eq!((claims.len(), ends.len()), (1, 1), "{trail}");
    assert_eq!(claims[0]["actor"], "rick", "{trail}");
    assert_eq!(ends[0]["detail"]["result"], json!({"sent": true}));
}

#[tokio::test]
async fn a_call_countersign_runs_is_never_reported_by_the_agent() {
    let app = app().await;
    let (status, done) = ask(&app, REQUESTER_KEY, "k-ran", refund(5.0)).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let (status, body) = report(
        &app,
        REQUESTER_KEY,
        &done,
        json!({"attempt": "a", "status": "started"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_released", "{body}");
}

#[tokio::test]
async fn a_receipt_the_gateway_signed_for_a_released_call_verifies_in_node() {
    let app = app().await;
    let input = json!({"to": "ana@example.com", "body": "Ça va? 😀", "n": 1.5e-7});
    let (_, asked) = ask(
        &app,
        REQUESTER_KEY,
        "k-node",
        json!({"tool": "send_email", "input": input, "wait_secs": 0}),
    )
    .await;
    let held = until_held(&app, &asked).await;
    let run_id = held["run_id"].as_str().unwrap();
    let (status, body) = app
        .approve(
            run_id,
            held["call_id"].as_str().unwrap(),
            &held["held"]["digest"],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, done) = look(&app, REQUESTER_KEY, &held, 30).await;
    let receipt = done["decision"]["receipt"].as_str().expect("a receipt");
    let signed = claims(receipt);
    // What the tool knows: the gateway's keys, who it expects receipts from and for, and the
    // request it received (the receipt, the Idempotency-Key it came with, the body).
    let case = json!({
        "jwks_url": format!("{}/.well-known/jwks.json", app.gateway_url),
        "issuer": signed["iss"],
        "audience": "send_email",
        "tool": "send_email",
        "input": done["input"],
        "idempotency_key": format!("{}:{}:{}", signed["run_id"].as_str().unwrap(), signed["turn"], signed["call_id"].as_str().unwrap()),
        "receipt": receipt,
    });
    let file = std::env::temp_dir().join(format!("countersign-receipt-case-{run_id}.json"));
    std::fs::write(&file, case.to_string()).unwrap();
    let node = concat!(env!("CARGO_MANIFEST_DIR"), "/../sdk/node");
    let out = tokio::process::Command::new("node")
        .arg("--test")
        .current_dir(node)
        .env("COUNTERSIGN_RECEIPT_CASE", &file)
        .output()
        .await
        .expect("node (20 or later) on the PATH");
    std::fs::remove_file(&file).unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    // The gateway's receipt was checked, not skipped.
    assert!(report.contains("# skipped 0"), "{report}");
    assert!(
        report.contains("ok 5 - a receipt the gateway signed"),
        "{report}"
    );
}

#[tokio::test]
async fn a_call_nobody_decides_in_time_expires_and_a_cancelled_one_never_runs() {
    let app = app().await;
    // Nobody decides the page within its second: the ask's wait ends with the expiry.
    let page = json!({"tool": "page_oncall", "input": {"message": "disk full"}, "wait_secs": 30});
    let (status, expired) = ask(&app, REQUESTER_KEY, "k-page", page).await;
    assert_eq!(status, StatusCode::OK, "{expired}");
    assert_eq!(expired["status"], "expired", "{expired}");
    assert_eq!(expired["decision"]["expired"], true, "{expired}");
    assert!(expired["decision"].get("receipt").is_none(), "{expired}");
    let (status, body) = report(
        &app,
        REQUESTER_KEY,
        &expired,
        json!({"attempt": "a", "status": "started"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_released", "{body}");

    // A held refund cancelled by the agent's key: its wait ends cancelled, nothing ran, and
    // a late approval is refused.
    let mut body = refund(60.0);
    body["wait_secs"] = json!(0);
    let (_, asked) = ask(&app, REQUESTER_KEY, "k-cancel", body).await;
    let held = until_held(&app, &asked).await;
    let run_id = held["run_id"].as_str().unwrap();
    cancelled_by_requester(&app, run_id).await;
    let (status, cancelled) = look(&app, REQUESTER_KEY, &held, 30).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let (status, body) = app
        .approve(
            run_id,
            held["call_id"].as_str().unwrap(),
            &held["held"]["digest"],
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(app.tools.refunds().len(), 0, "a cancelled call never runs");
}

#[tokio::test]
async fn a_bad_ask_is_refused_with_what_is_wrong_and_starts_nothing() {
    let app = app().await;
    let cases = [
        (
            REQUESTER_KEY,
            json!({"tool": "issue_refund", "input": {"order_id": "A-1"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount",
        ),
        (
            REQUESTER_KEY,
            json!({"tool": "wire_money", "input": {}}),
            StatusCode::NOT_FOUND,
            "no tool",
        ),
        (
            REQUESTER_KEY,
            json!({"tool": "send_email"}),
            StatusCode::BAD_REQUEST,
            "input",
        ),
        (
            REQUESTER_KEY,
            json!({"tool": "send_email", "input": {"to": "a", "body": "b"}, "wait_secs": 100000}),
            StatusCode::BAD_REQUEST,
            "wait_secs",
        ),
        (REVIEWER_KEY, refund(5.0), StatusCode::FORBIDDEN, "may not"),
        (READER_KEY, refund(5.0), StatusCode::FORBIDDEN, "may not"),
    ];
    for (key, body, expected, says) in cases {
        let (status, answer) = ask(&app, key, "k-bad", body.clone()).await;
        assert_eq!(status, expected, "{body}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(says),
            "{body}: {answer}"
        );
    }
    // Without an idempotency key.
    let (status, answer) = app
        .request(
            Method::POST,
            &format!("/v1/agents/{AGENT}/calls"),
            Some(REQUESTER_KEY),
            Some(refund(5.0)),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    // An agent countersign runs has no door.
    let (status, answer) = ask_at(&app, "refunds", ADMIN_KEY, "k-bad", refund(5.0)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not an external agent"),
        "{answer}"
    );
    assert_eq!(app.tools.refunds().len(), 0);
}

/// A receipt's claims, as its tool reads them once the signature checks out (the receipts'
/// own tests check signatures; here what matters is what it binds).
fn claims(receipt: &str) -> Value {
    let payload = receipt.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}
