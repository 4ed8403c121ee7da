//! Bad input gets a clear JSON error with the right status, and changes nothing.

use countersign_fake_model::refund_brain;
use countersign_tests::app::{ADMIN_KEY, READER_KEY, REQUESTER_KEY, REVIEWER_KEY, TestApp};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn paused_run(app: &TestApp) -> (String, Value) {
    let run_id = app.start_run("Refund A-1001 please.").await;
    let run = app.wait_status(&run_id, "awaiting_approval").await;
    (run_id, run["pending"][0]["digest"].clone())
}

fn assert_error(status: StatusCode, body: &Value, expected: u16, code: &str) {
    assert_eq!(status.as_u16(), expected, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(!body["error"]["message"].as_str().unwrap().is_empty());
}

/// A well-formed digest that is no call's.
const OTHER_DIGEST: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";

#[tokio::test]
async fn every_bad_decision_is_refused_and_the_run_stays_paused() {
    let app = TestApp::spawn(refund_brain).await;
    let (run_id, digest) = paused_run(&app).await;
    let path = format!("/v1/runs/{run_id}/decisions");
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            json!([{"call_id": "toolu_9", "digest": digest, "action": "approve"}]),
            404,
            "not_found",
        ),
        (
            json!([{"call_id": "toolu_2", "digest": OTHER_DIGEST, "action": "approve"}]),
            409,
            "stale_digest",
        ),
        (
            json!([{"call_id": "toolu_2", "action": "approve"}]),
            400,
            "bad_request",
        ),
        (
            json!([{"call_id": "toolu_2", "digest": digest, "action": "reject"}]),
            400,
            "bad_request",
        ),
        (
            json!([{"call_id": "toolu_2", "digest": digest, "action": "reject", "reason": "  "}]),
            400,
            "bad_request",
        ),
        (
            json!([{"call_id": "toolu_2", "digest": digest, "action": "edit", "note": "n"}]),
            400,
            "bad_request",
        ),
        (
            json!([{"call_id": "toolu_2", "digest": digest, "action": "maybe"}]),
            400,
            "invalid_json",
        ),
        (json!([]), 400, "bad_request"),
        // Sizes and formats are checked before anything is stored or audited.
        (
            json!([{"call_id": "toolu_2", "digest": "sha256:not-hex", "action": "approve"}]),
            400,
            "bad_request",
        ),
        (
            json!([{"call_id": "x".repeat(129), "digest": digest, "action": "approve"}]),
            400,
            "bad_request",
        ),
        (
            json!([{"call_id": "toolu_2", "digest": digest, "action": "reject", "reason": "r".repeat(4097)}]),
            400,
            "bad_request",
        ),
    ];
    for (decisions, expected, code) in cases {
        let (status, body) = app.decide(&run_id, decisions.clone()).await;
        assert_error(status, &body, expected, code);
        // A stale digest's refusal does not tell the current one: a script could quote it
        // and approve what nobody looked at.
        let digest = digest.as_str().unwrap();
        assert!(!body.to_string().contains(digest), "{body}");
    }

    // An edit that fails the schema: 422 with the schema's errors.
    let (status, body) = app
        .decide(&run_id, json!([{"call_id": "toolu_2", "digest": digest, "action": "edit",
                                 "input": {"order_id": "A-1001", "amount": "lots", "reason": "r"}}]))
        .await;
    assert_error(status, &body, 422, "invalid_input");
    assert_eq!(
        body["error"]["details"]["errors"],
        json!(["amount: must be a number"]),
        "{body}"
    );

    // Malformed JSON, an oversized body, a missing, unknown or underprivileged key.
    let raw = app
        .http
        .post(format!("{}{path}", app.gateway_url))
        .bearer_auth(REVIEWER_KEY)
        .header("content-type", "application/json")
        .body("{not json");
    let response = raw.send().await.unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(
        response.json::<Value>().await.unwrap()["error"]["code"],
        "invalid_json"
    );

    let huge = json!({"decisions": [{"call_id": "toolu_2", "digest": digest, "action": "reject",
                                      "reason": "x".repeat(100_000)}]});
    let (status, body) = app
        .request(Method::POST, &path, Some(REVIEWER_KEY), Some(huge))
        .await;
    assert_error(status, &body, 413, "body_too_large");

    let approve =
        json!({"decisions": [{"call_id": "toolu_2", "digest": digest, "action": "approve"}]});
    let (status, body) = app
        .request(Method::POST, &path, None, Some(approve.clone()))
        .await;
    assert_error(status, &body, 401, "unauthorized");
    let (status, body) = app
        .request(
            Method::POST,
            &path,
            Some("wrong-key-0123456789"),
            Some(approve.clone()),
        )
        .await;
    assert_error(status, &body, 401, "unauthorized");
    for key in [REQUESTER_KEY, READER_KEY] {
        let (status, body) = app
            .request(Method::POST, &path, Some(key), Some(approve.clone()))
            .await;
        assert_error(status, &body, 403, "forbidden");
    }

    // Nothing changed: still paused, no decision recorded, nothing refunded, model not called.
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["pending"][0]["decision"].is_null(), "{run}");
    assert!(app.tools.refunds().is_empty());
    assert_eq!(app.model.requests().len(), 1);
}

#[tokio::test]
async fn unknown_runs_and_agents_are_404s() {
    let app = TestApp::spawn(refund_brain).await;
    let (status, body) = app.get("/v1/runs/run_doesnotexist").await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = app.get("/v1/runs/not.a.valid.id").await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = app
        .decide(
            "run_doesnotexist",
            json!([{"call_id": "c", "digest": OTHER_DIGEST, "action": "approve"}]),
        )
        .await;
    assert_error(status, &body, 404, "not_found");
    let starts = [
        (
            ADMIN_KEY,
            json!({"agent": "nobody", "input": "hi"}),
            404,
            "not_found",
        ),
        (
            READER_KEY,
            json!({"agent": "refunds", "input": "hi"}),
            403,
            "forbidden",
        ),
        (ADMIN_KEY, json!({"agent": "refunds"}), 400, "invalid_json"),
        // Naming someone else as the requester would let a caller approve its own request.
        (
            ADMIN_KEY,
            json!({"agent": "refunds", "input": "hi", "requested_by": "alice"}),
            403,
            "forbidden",
        ),
    ];
    for (key, body, expected, code) in starts {
        let (status, body) = app
            .request(Method::POST, "/v1/runs", Some(key), Some(body))
            .await;
        assert_error(status, &body, expected, code);
    }
    let (status, body) = app.get("/v1/approvals?status=approved").await;
    assert_error(status, &body, 400, "bad_request");
}

#[tokio::test]
async fn deciding_twice_answers_already_recorded_and_a_different_decision_is_a_conflict() {
    let app = TestApp::spawn(refund_brain).await;
    let (run_id, digest) = paused_run(&app).await;

    // Waiting runs appear in the inbox.
    let (status, inbox) = app.get("/v1/approvals?status=pending").await;
    assert_eq!(status, 200);
    let item = &inbox["approvals"][0];
    assert_eq!(item["run_id"], run_id.as_str());
    assert_eq!(item["call_id"], "toolu_2");
    assert_eq!(item["digest"], digest);

    let reject =
        json!([{"call_id": "toolu_2", "digest": digest, "action": "reject", "reason": "no"}]);
    let (status, body) = app.decide(&run_id, reject.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["status"], "recorded");
    let (status, body) = app.decide(&run_id, reject).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["status"], "already_recorded");
    let (status, body) = app
        .decide(
            &run_id,
            json!([{"call_id": "toolu_2", "digest": digest, "action": "approve"}]),
        )
        .await;
    assert_error(status, &body, 409, "already_decided");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("reject by rita"),
        "{body}"
    );

    app.wait_status(&run_id, "completed").await;
    assert!(app.tools.refunds().is_empty());
    let (_, inbox) = app.get("/v1/approvals").await;
    assert_eq!(inbox["approvals"], json!([]));
}

#[tokio::test]
async fn deciding_a_run_that_is_not_waiting_is_refused() {
    let app = TestApp::spawn(|_: &Value| countersign_fake_model::anthropic_text("Hello.")).await;
    let run_id = app.start_run("Just say hello.").await;
    app.wait_status(&run_id, "completed").await;
    let (status, body) = app
        .decide(
            &run_id,
            json!([{"call_id": "toolu_2", "digest": OTHER_DIGEST, "action": "approve"}]),
        )
        .await;
    assert_error(status, &body, 409, "not_awaiting_approval");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("completed"),
        "{body}"
    );

    let app = TestApp::spawn(refund_brain).await;
    let (run_id, digest) = paused_run(&app).await;
    app.approve(&run_id, "toolu_2", &digest).await;
    app.wait_status(&run_id, "completed").await;
    // A different decision on a call decided before names the recorded one.
    let (status, body) = app
        .decide(
            &run_id,
            json!([{"call_id": "toolu_2", "digest": digest, "action": "reject", "reason": "late"}]),
        )
        .await;
    assert_error(status, &body, 409, "already_decided");
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn an_idempotency_key_reused_for_another_request_is_refused_and_starts_nothing() {
    let app = TestApp::spawn(refund_brain).await;
    let start = |body: String| {
        app.http
            .post(format!("{}/v1/runs", app.gateway_url))
            .bearer_auth(REQUESTER_KEY)
            .header("Idempotency-Key", "desk-ticket-42")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let first = start(
        json!({"agent": "refunds", "input": "Refund A-1001.", "metadata": {"ticket": 42}})
            .to_string(),
    )
    .await
    .unwrap();
    assert_eq!(first.status(), 202);
    let first: Value = first.json().await.unwrap();

    for other in [
        json!({"agent": "refunds", "input": "Refund A-1002 instead."}),
        json!({"agent": "refunds", "input": "Refund A-1001.", "metadata": {"ticket": 43}}),
        json!({"agent": "refunds", "input": "Refund A-1001.", "metadata": {"ticket": 42}, "requested_by": "alice"}),
    ] {
        let answer = start(other.to_string()).await.unwrap();
        let status = answer.status();
        let body: Value = answer.json().await.unwrap();
        assert_error(status, &body, 422, "idempotency_key_reused");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(first["run_id"].as_str().unwrap()),
            "{body}"
        );
    }
    // The same request, its keys in another order and spaced otherwise, is a retry.
    let again = start(
        r#"{ "metadata": {"ticket": 42},  "input": "Refund A-1001.", "agent": "refunds" }"#.into(),
    )
    .await
    .unwrap();
    assert_eq!(again.status(), 202);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["run_id"], first["run_id"]);

    app.wait_status(first["run_id"].as_str().unwrap(), "awaiting_approval")
        .await;
    let started = countersign_tests::metric_value(
        &app.gateway_metrics().await,
        r#"countersign_runs_total{event="started"}"#,
    );
    assert_eq!(started, Some(1.0), "one run started");
    assert!(app.model.requests_for("Refund A-1002 instead.").is_empty());
}

#[tokio::test]
async fn an_idempotency_key_makes_a_retried_start_return_the_same_run() {
    let app = TestApp::spawn(refund_brain).await;
    let start = || {
        app.http
            .post(format!("{}/v1/runs", app.gateway_url))
            .bearer_auth(REQUESTER_KEY)
            .header("Idempotency-Key", "order-A-1001-refund")
            .json(&json!({"agent": "refunds", "input": "Refund A-1001."}))
            .send()
    };
    let first: Value = start().await.unwrap().json().await.unwrap();
    let second = start().await.unwrap();
    assert_eq!(second.status(), 202);
    let second: Value = second.json().await.unwrap();
    assert_eq!(first["run_id"], second["run_id"]);
    app.wait_status(first["run_id"].as_str().unwrap(), "awaiting_approval")
        .await;
    assert_eq!(
        app.model.requests_for("Refund A-1001.").len(),
        1,
        "one run, one model call"
    );
}

#[tokio::test]
async fn an_edit_of_a_field_the_tool_does_not_take_is_refused_by_name_and_a_valid_edit_is_told_as_its_change()
 {
    let app = TestApp::spawn(refund_brain).await;
    let (run_id, digest) = paused_run(&app).await;
    // The reviewer meant `amount`; without the check the tool ran with amount 129.
    let misspelt =
        json!({"order_id": "A-1001", "amount": 129, "amout": 50, "reason": "arrived broken"});
    let (status, body) = app
        .decide(
            &run_id,
            json!([{"call_id": "toolu_2", "digest": digest, "action": "edit",
                                 "input": misspelt, "note": "typo"}]),
        )
        .await;
    assert_error(status, &body, 422, "invalid_input");
    assert_eq!(
        body["error"]["details"]["errors"],
        json!(["amout: is not a field of issue_refund (its fields: amount, order_id, reason)"]),
        "{body}"
    );
    // Nothing recorded, nothing audited as decided, the run still waits.
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert_eq!(run["pending"][0]["decision"], Value::Null);
    assert_eq!(
        run["pending"][0]["fields"],
        json!(["amount", "order_id", "reason"])
    );
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let decided = |trail: &Value| {
        trail["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["entry"].clone())
            .find(|e| e["kind"] == "decided")
    };
    assert_eq!(decided(&trail), None);

    let meant = json!({"order_id": "A-1001", "amount": 50, "reason": "arrived broken"});
    let (status, body) = app
        .decide(
            &run_id,
            json!([{"call_id": "toolu_2", "digest": digest, "action": "edit",
                                 "input": meant, "note": "typo"}]),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds()[0]["amount"], 50);
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let entry = decided(&trail).expect("the edit is audited");
    assert_eq!(
        entry["detail"]["changes"],
        json!([{"field": "amount", "before": 129, "after": 50}]),
        "{entry}"
    );
    // The model is told the change, field by field.
    let told = countersign_fake_model::last_results(app.model.requests().last().unwrap());
    let content = told
        .iter()
        .find(|r| r["tool_use_id"] == "toolu_2")
        .and_then(|r| r["content"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(content.contains("amount: 129 → 50"), "{told:?}");
}

/// A tool that takes an account number as an integer, and whose every call waits for a
/// person (appended to the refund agent's file); it is never reached here.
const PAY_ACCOUNT: &str = r#"
[[tools]]
name = "pay_account"
description = "Pay an amount into an account."
input_schema = { type = "object", properties = { account = { type = "integer" }, amount = { type = "number" } }, required = ["account", "amount"] }
http = { url = "http://127.0.0.1:9/pay" }
approval = "always"
"#;

#[tokio::test]
async fn an_integer_no_digest_binds_exactly_is_neither_held_nor_written_by_an_edit() {
    use countersign_fake_model::{
        anthropic_text, anthropic_tool_use, first_user_text, last_results, turn,
    };
    // 2^53 + 1: RFC 8785 writes it as 9007199254740992, so a digest (and a receipt) made
    // for it also covers …992, and the reverse.
    const PAST: u64 = 9_007_199_254_740_993;
    let app = TestApp::builder(|request: &Value| {
        if turn(request) > 0 {
            return anthropic_text("Done.");
        }
        // "pay ACCOUNT"
        let account: u64 = first_user_text(request)[4..].parse().unwrap();
        let input = json!({"account": account, "amount": 20});
        anthropic_tool_use("Paying.", &[("toolu_2", "pay_account", input)])
    })
    .policy(PAY_ACCOUNT)
    .start()
    .await;

    // The worker does not hold the call: the model is told why, and the run goes on.
    let run_id = app.start_run(&format!("pay {PAST}")).await;
    app.wait_status(&run_id, "completed").await;
    let told = last_results(app.model.requests().last().unwrap());
    let told = told[0].to_string();
    assert!(told.contains("not sent for approval"), "{told}");
    assert!(
        told.contains("input.account is the integer 9007199254740993"),
        "{told}"
    );

    // Nor does an edit write one into a held call.
    let run_id = app.start_run("pay 1234").await;
    let run = app.wait_status(&run_id, "awaiting_approval").await;
    let digest = &run["pending"][0]["digest"];
    let (status, body) = app
        .decide(
            &run_id,
            json!([{"call_id": "toolu_2", "digest": digest, "action": "edit",
                    "input": {"account": PAST, "amount": 20}, "note": "the other account"}]),
        )
        .await;
    assert_error(status, &body, 422, "invalid_input");
    let errors = body["error"]["details"]["errors"].to_string();
    assert!(
        errors.contains("input.account is 9007199254740993"),
        "{body}"
    );
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert_eq!(run["pending"][0]["decision"], Value::Null);
}

#[tokio::test]
async fn calls_held_in_one_turn_carry_at_most_256_kib_of_input_and_one_past_it_is_told_not_held() {
    use countersign_fake_model::{anthropic_text, anthropic_tool_use, last_results, turn};
    // Two calls that need a person: the first is held, the second (with the first) is past
    // what one announcement of the pause may carry, so the model is told, and it is not held.
    let app = TestApp::builder(|request: &Value| {
        if turn(request) > 0 {
            return anthropic_text("Done.");
        }
        let small = json!({"account": 1, "amount": 20, "memo": "m".repeat(100 * 1024)});
        let large = json!({"account": 2, "amount": 20, "memo": "m".repeat(200 * 1024)});
        anthropic_tool_use(
            "Paying.",
            &[
                ("toolu_1", "pay_account", small),
                ("toolu_2", "pay_account", large),
            ],
        )
    })
    .policy(PAY_ACCOUNT)
    .start()
    .await;
    let run_id = app.start_run("pay twice").await;
    let run = app.wait_status(&run_id, "awaiting_approval").await;
    let pending: Vec<&Value> = run["pending"].as_array().unwrap().iter().collect();
    let held: Vec<&Value> = pending.iter().map(|c| &c["call_id"]).collect();
    assert_eq!(held, [&json!("toolu_1")]);
    let (status, body) = app.approve(&run_id, "toolu_1", &pending[0]["digest"]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    app.wait_status(&run_id, "completed").await;
    let told = last_results(app.model.requests().last().unwrap());
    let second = told[1].to_string();
    assert!(second.contains("not sent for approval"), "{second:.500}");
    assert!(second.contains("262144 bytes"), "{second:.500}");
}
