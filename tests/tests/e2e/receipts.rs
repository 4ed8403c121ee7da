//! Countersignature receipts end to end: every approved call (approve, edit, the last
//! approval of a quorum) reaches the demo refunds service with a receipt the gateway signed
//! for exactly that call, which the service checks as a tool author would; whatever no
//! decision countersigned is refused there, changes nothing, and is put before a person.
//! Receipts are shown to admin keys only, and stay spent after the tool restarts.

use countersign_fake_model::refund_brain;
use countersign_local::demo_tools::DemoTools;
use countersign_receipt::{Jwks, KeySet, Refresh, SeenJtis, Signer, Verifier, input_digest};
use countersign_tests::app::{
    ADMIN_KEY, PATIENCE, READER_KEY, RECEIPT_KID, REQUESTER_KEY, REVIEWER_KEY, TestApp,
};
use futures::StreamExt;
use jwt_simple::prelude::{Ed25519PublicKey, EdDSAPublicKeyLike, NoCustomClaims};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// The refund the demo model asks for.
fn asked() -> Value {
    json!({"order_id": "A-1001", "amount": 129, "reason": "arrived broken"})
}

/// The receipts the run's execution entries kept, by call.
async fn kept_receipts(app: &TestApp, run_id: &str) -> Vec<(String, String)> {
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["entry"])
        .filter(|e| e["kind"] == "executed")
        .filter_map(|e| {
            Some((
                e["call_id"].as_str()?.to_string(),
                e["detail"]["receipt"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Posts a refund straight to the demo service, as a worker would (or an attacker could).
async fn post_refund(
    app: &TestApp,
    receipt: Option<&str>,
    key: &str,
    input: &Value,
) -> (StatusCode, Value) {
    post_refund_to(app, &app.tools, receipt, key, input).await
}

/// As [`post_refund`], to the instance `tools` of the demo service.
async fn post_refund_to(
    app: &TestApp,
    tools: &DemoTools,
    receipt: Option<&str>,
    key: &str,
    input: &Value,
) -> (StatusCode, Value) {
    let mut request = app
        .http
        .post(format!("{}/refunds", tools.base_url))
        .header("Idempotency-Key", key)
        .json(input);
    if let Some(receipt) = receipt {
        request = request.header("Countersign-Receipt", receipt);
    }
    let response = request.send().await.unwrap();
    (response.status(), response.json().await.unwrap())
}

#[tokio::test]
async fn approved_and_edited_calls_reach_the_tool_with_receipts_that_name_exactly_them() {
    let app = TestApp::spawn(refund_brain).await;

    // Approved as asked.
    let approved = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&approved, "awaiting_approval").await;
    let held = &paused["pending"][0];
    let (status, _) = app.approve(&approved, "toolu_2", &held["digest"]).await;
    assert_eq!(status, 200);
    app.wait_status(&approved, "completed").await;

    // Edited down to 50.
    let edited = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&edited, "awaiting_approval").await;
    let edit = json!({"order_id": "A-1001", "amount": 50, "reason": "partial"});
    let (status, body) = app
        .decide(
            &edited,
            json!([{"call_id": "toolu_2", "digest": paused["pending"][0]["digest"],
                     "action": "edit", "input": edit, "note": "half"}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    app.wait_status(&edited, "completed").await;

    let receipts = app.tools.receipts();
    assert_eq!(receipts.len(), 2, "each refund ran once, with its receipt");
    // The order lookups the policy let through without a person carried none.
    assert_eq!(app.tools.received_by_key("/orders/lookup").len(), 2);
    assert_eq!(app.tools.carrying_receipts("/orders/lookup"), 0);
    assert_eq!(app.tools.carrying_receipts("/refunds"), 2);
    assert!(app.tools.refused().is_empty());
    let (first, second) = (&receipts[0], &receipts[1]);
    assert_eq!(
        (
            first.run_id.as_str(),
            first.call_id.as_str(),
            first.tool.as_str()
        ),
        (approved.as_str(), "toolu_2", "issue_refund")
    );
    assert_eq!(
        (first.iss.as_str(), first.aud.as_str()),
        (app.gateway_url.as_str(), "issue_refund")
    );
    assert_eq!(first.action, "approve");
    assert_eq!(
        first.risk.as_deref(),
        Some("costly"),
        "what the deciders were shown"
    );
    assert_eq!(first.decided_by, vec!["rita".to_string()]);
    assert_eq!(first.input_digest, input_digest(&asked()));
    assert_eq!(
        first.policy_version,
        held["policy_version"].as_str().unwrap()
    );
    assert!(first.exp > first.iat);
    assert_eq!(second.run_id, edited);
    assert_eq!(second.action, "edit");
    assert_eq!(
        second.input_digest,
        input_digest(&edit),
        "the edited input, not the asked one"
    );
    assert_ne!(first.jti, second.jti);

    // The decision's audit entry names the receipt; the execution entry kept what was sent.
    let (_, trail) = app.get(&format!("/v1/runs/{approved}/audit")).await;
    let decided = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entry"]["kind"] == "decided")
        .unwrap();
    assert_eq!(
        decided["entry"]["detail"]["receipt"],
        json!({"jti": first.jti, "kid": RECEIPT_KID})
    );

    // A JWT library nobody here wrote verifies it with the key the gateway publishes.
    let (status, jwks) = app.get("/.well-known/jwks.json").await;
    assert_eq!(status, 200, "{jwks}");
    let jwk = &jwks["keys"][0];
    assert_eq!(
        (
            jwk["kty"].as_str(),
            jwk["crv"].as_str(),
            jwk["kid"].as_str()
        ),
        (Some("OKP"), Some("Ed25519"), Some(RECEIPT_KID))
    );
    use base64::Engine;
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(jwk["x"].as_str().unwrap())
        .unwrap();
    let key = Ed25519PublicKey::from_bytes(&x).unwrap();
    let (_, token) = &kept_receipts(&app, &approved).await[0];
    let verified = key.verify_token::<NoCustomClaims>(token, None).unwrap();
    assert_eq!(verified.jwt_id.as_deref(), Some(first.jti.as_str()));
}

#[tokio::test]
async fn the_last_approval_of_a_quorum_signs_a_receipt_naming_every_approver() {
    let policy = "approvers = [\"role:finance\"]\nquorum = 2\n";
    let app = TestApp::builder(refund_brain).policy(policy).start().await;
    let (status, body) = app
        .request(
            Method::POST,
            "/v1/runs",
            Some(REQUESTER_KEY),
            Some(json!({"agent": "refunds", "input": "Refund A-1001.", "requested_by": "carol"})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_string();
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let approve = json!({"call_id": "toolu_2", "digest": paused["pending"][0]["digest"], "action": "approve"});
    let (status, body) = app.decide_as("bob", &run_id, approve.clone()).await;
    assert_eq!(status, 200, "{body}");
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert!(
        run["pending"][0]["decision"].is_null(),
        "one approval of two signs nothing"
    );
    let (status, body) = app.decide_as("alice", &run_id, approve).await;
    assert_eq!(status, 200, "{body}");
    app.wait_status(&run_id, "completed").await;

    let receipts = app.tools.receipts();
    assert_eq!(receipts.len(), 1);
    assert_eq!(
        receipts[0].decided_by,
        vec!["alice".to_string(), "bob".to_string()]
    );
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn two_approvals_completing_a_quorum_at_once_sign_one_receipt_naming_both() {
    let policy = "approvers = [\"role:finance\"]\nquorum = 2\n";
    let app = TestApp::builder(refund_brain).policy(policy).start().await;
    let inputs: Vec<String> = (0..6)
        .map(|i| format!("Refund A-1001, case {i}."))
        .collect();
    let paused = app.paused_refunds(&inputs).await;

    // Each of alice and bob may believe theirs is the first approval: whichever the script
    // takes second completes the quorum, and its receipt must name both.
    let app = &app;
    futures::future::join_all(paused.iter().map(|(run_id, digest)| async move {
        let approve = json!({"call_id": "toolu_2", "digest": digest, "action": "approve"});
        let (a, b) = tokio::join!(
            app.decide_as("alice", run_id, approve.clone()),
            app.decide_as("bob", run_id, approve.clone())
        );
        assert_eq!((a.0, b.0), (StatusCode::OK, StatusCode::OK), "{a:?} {b:?}");
        app.wait_status(run_id, "completed").await;
        // The gateway's retry is no refused decision of the reviewer's.
        let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
        assert_eq!(trail["refusals"], json!([]), "{trail}");
    }))
    .await;

    let receipts = app.tools.receipts();
    assert_eq!(receipts.len(), paused.len(), "each refund ran once");
    for receipt in receipts {
        assert_eq!(
            receipt.decided_by,
            vec!["alice".to_string(), "bob".to_string()]
        );
    }
}

#[tokio::test]
async fn the_tool_refuses_every_receipt_that_is_not_this_calls_and_refunds_nothing_more() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.refund_cycle().await;
    let (_, token) = kept_receipts(&app, &run_id).await.pop().unwrap();
    let key = format!("{run_id}:1:toolu_2");
    assert_eq!(app.tools.refunds().len(), 1);

    // The same request again (a retry after a crash) is answered as before; nothing more runs.
    let (status, body) = post_refund(&app, Some(&token), &key, &asked()).await;
    assert_eq!(
        (status, body["refund_id"].as_str()),
        (StatusCode::OK, Some("rf_1"))
    );

    let signer = app.receipt_signer();
    let (rogue, _) = Signer::generate("rogue").unwrap();
    let mut other_tool = app.receipt_claims(&run_id, &asked(), 600);
    other_tool.aud = "send_email".into();
    other_tool.tool = "send_email".into();
    let mut other_call = app.receipt_claims(&run_id, &asked(), 600);
    other_call.call_id = "toolu_9".into();
    let fresh = |run: &str| signer.sign(&app.receipt_claims(run, &asked(), 600));
    let cases: Vec<(&str, Option<String>, String, Value, &str)> = vec![
        ("no receipt", None, key.clone(), asked(), "missing"),
        (
            "used again, by a request of the call under another turn",
            Some(token.clone()),
            format!("{run_id}:2:toolu_2"),
            asked(),
            "other_call",
        ),
        (
            "for another call of the run, with the same input",
            Some(signer.sign(&other_call)),
            key.clone(),
            asked(),
            "other_call",
        ),
        (
            "for another run, with the same input",
            Some(fresh("run_0000000000000000000000other")),
            key.clone(),
            asked(),
            "other_call",
        ),
        (
            "with a request that names no call",
            Some(fresh(&run_id)),
            "k1".into(),
            asked(),
            "other_call",
        ),
        (
            "a body changed after signing",
            Some(token.clone()),
            key.clone(),
            json!({"order_id": "A-1001", "amount": 500, "reason": "arrived broken"}),
            "input_changed",
        ),
        (
            "expired",
            Some(signer.sign(&app.receipt_claims(&run_id, &asked(), -3600))),
            key.clone(),
            asked(),
            "expired",
        ),
        (
            "signed by an unknown key",
            Some(rogue.sign(&app.receipt_claims(&run_id, &asked(), 600))),
            key.clone(),
            asked(),
            "unknown_key",
        ),
        (
            "for another tool",
            Some(signer.sign(&other_tool)),
            key.clone(),
            asked(),
            "other_tool",
        ),
        (
            "not a JWT",
            Some("not.a.jwt".into()),
            key.clone(),
            asked(),
            "malformed",
        ),
    ];
    for (what, receipt, key, input, code) in cases {
        let (status, body) = post_refund(&app, receipt.as_deref(), &key, &input).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        assert_eq!(body["code"], code, "{what}: {body}");
        assert_eq!(app.tools.refunds().len(), 1, "{what} refunded something");
    }
}

#[tokio::test]
async fn an_edits_receipt_does_not_carry_the_asked_input_nor_an_approvals_the_edited_one() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let edit = json!({"order_id": "A-1001", "amount": 50, "reason": "partial"});
    app.decide(
        &run_id,
        json!([{"call_id": "toolu_2", "digest": paused["pending"][0]["digest"],
                 "action": "edit", "input": edit}]),
    )
    .await;
    app.wait_status(&run_id, "completed").await;
    let (_, edit_receipt) = kept_receipts(&app, &run_id).await.pop().unwrap();
    let (status, body) = post_refund(
        &app,
        Some(&edit_receipt),
        &format!("{run_id}:1:toolu_2"),
        &asked(),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("input_changed"))
    );

    let approved = app.refund_cycle().await;
    let (_, approve_receipt) = kept_receipts(&app, &approved).await.pop().unwrap();
    let (status, body) = post_refund(
        &app,
        Some(&approve_receipt),
        &format!("{approved}:1:toolu_2"),
        &edit,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("input_changed"))
    );
    assert_eq!(app.tools.refunds().len(), 2, "one per run, nothing more");
}

#[tokio::test]
async fn a_decision_written_straight_into_redis_is_refused_by_the_tool_and_put_before_a_person() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let mut attention = app.attention_events(&run_id).await;

    // Someone with Redis access records an approval: no gateway signed it.
    app.record_approval(&run_id, "toolu_2", &paused["pending"][0]["digest"], false)
        .await;
    app.wait_status(&run_id, "completed").await;

    assert!(app.tools.refunds().is_empty(), "nothing was refunded");
    assert_eq!(app.tools.refused(), vec!["missing".to_string()]);
    let event = tokio::time::timeout(PATIENCE, attention.next())
        .await
        .unwrap()
        .unwrap();
    let event: Value = serde_json::from_slice(&event.payload).unwrap();
    assert_eq!(event["call_id"], "toolu_2");
    let reason = event["reason"].as_str().unwrap();
    assert!(
        reason.contains("refused this call's countersignature receipt"),
        "{reason}"
    );
    assert!(reason.contains("carried no receipt"), "{reason}");
    let results = countersign_fake_model::last_results(&app.model.requests()[1]);
    assert_eq!(results[1]["is_error"], true, "the model is told it failed");
    assert!(
        kept_receipts(&app, &run_id).await.is_empty(),
        "the trail says none was sent"
    );
}

#[tokio::test]
async fn an_approval_published_by_hand_on_nats_with_no_recorded_decision_runs_nothing() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;

    // A worker's NATS user (a compromised worker host) announces an approval nobody
    // recorded.
    let forged = json!({"type": "approval.decided", "run_id": run_id, "call_id": "toolu_2",
                        "action": "approve", "decided_by": "mallory", "all_decided": true});
    let worker = app
        .infra
        .nats_client_as(&app.namespace, countersign_runtime::names::Service::Worker)
        .await;
    let js = async_nats::jetstream::new(worker);
    js.publish(
        format!("{}.approval.decided.{run_id}", app.namespace),
        forged.to_string().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    app.decisions_drained().await;

    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["pending"][0]["decision"].is_null());
    assert!(app.tools.refunds().is_empty() && app.tools.refused().is_empty());

    // The recorded decision still resumes it, with its receipt, once.
    let (status, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.receipts().len(), 1);
    assert_eq!(app.tools.receipts()[0].decided_by, vec!["rita".to_string()]);
}

#[tokio::test]
async fn receipts_signed_before_a_rotation_verify_while_the_old_key_is_published_and_not_after() {
    let mut app = TestApp::spawn(refund_brain).await;
    let old = app.receipt_signer();
    let receipt = old.sign(&app.receipt_claims("run_x", &asked(), 600));
    let body = serde_json::to_vec(&asked()).unwrap();

    // The new key signs; the old one is published as retired.
    let dir = app.agents_dir().to_path_buf();
    let (_, new_pem) = Signer::generate("test-key-2").unwrap();
    std::fs::write(dir.join("new-key.pem"), new_pem).unwrap();
    let retired = KeySet {
        keys: vec![old.public().clone()],
    };
    std::fs::write(
        dir.join("retired.json"),
        serde_json::to_string(&retired).unwrap(),
    )
    .unwrap();
    let rotated = app
        .spawn_gateway(|config| {
            config.receipts.key_file = Some(dir.join("new-key.pem"));
            config.receipts.kid = Some("test-key-2".into());
            config.receipts.retired_keys_file = Some(dir.join("retired.json"));
        })
        .await;
    let issuer = app.gateway_url.clone();
    let check = |gateway: &str| {
        let verifier = Verifier::new(
            Jwks::from_url(
                format!("{gateway}/.well-known/jwks.json"),
                Refresh::default(),
            ),
            issuer.clone(),
            "issue_refund",
            SeenJtis::default(),
        );
        let (receipt, body) = (receipt.clone(), body.clone());
        async move {
            verifier
                .check(
                    Some(&receipt),
                    "issue_refund",
                    Some("run_x:1:toolu_2"),
                    &body,
                )
                .await
                .map(|c| c.claims.jti)
        }
    };
    assert!(
        check(&rotated).await.is_ok(),
        "the retired key still verifies"
    );

    // Once retired keys are no longer published, what they signed is refused.
    let retired_for_good = app
        .spawn_gateway(|config| {
            config.receipts.key_file = Some(dir.join("new-key.pem"));
            config.receipts.kid = Some("test-key-2".into());
        })
        .await;
    assert_eq!(
        check(&retired_for_good).await,
        Err(countersign_receipt::Refusal::UnknownKey(RECEIPT_KID.into()))
    );
}

/// The execution entry of the refund in a trail as the API shows it.
fn refund_executed(trail: &Value) -> &Value {
    trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entry"]["kind"] == "executed" && e["entry"]["call_id"] == "toolu_2")
        .unwrap_or_else(|| panic!("no execution of the refund in {trail}"))
}

#[tokio::test]
async fn receipts_are_withheld_from_every_key_but_an_admins_and_the_trail_still_verifies() {
    let mut app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    // Decided while no worker runs: the decision and its receipt wait with the run.
    app.stop_worker(0).await;
    let digest = &paused["pending"][0]["digest"];
    let (status, body) = app.approve(&run_id, "toolu_2", digest).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let withheld = json!({"withheld": true});
    let others = [READER_KEY, REVIEWER_KEY, REQUESTER_KEY];
    let run_path = format!("/v1/runs/{run_id}");

    let (_, shown) = app
        .request(Method::GET, &run_path, Some(ADMIN_KEY), None)
        .await;
    let receipt = shown["pending"][0]["decision"]["receipt"]
        .as_str()
        .expect("an admin is shown the receipt")
        .to_string();
    for key in others {
        let (status, shown) = app.request(Method::GET, &run_path, Some(key), None).await;
        assert_eq!(status, StatusCode::OK, "{key}: {shown}");
        assert_eq!(
            shown["pending"][0]["decision"]["receipt"], withheld,
            "{key}"
        );
        assert!(!shown.to_string().contains(&receipt), "{key}: {shown}");
    }
    // A reviewer refused on the decided call is told the decision that stands, not its
    // receipt.
    let (status, refused) = app
        .decide(
            &run_id,
            json!([{"call_id": "toolu_2", "digest": digest, "action": "reject", "reason": "no"}]),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    let decision = &refused["error"]["details"]["decision"];
    assert_eq!(decision["action"], "approve", "{refused}");
    assert_eq!(decision["receipt"], withheld, "{refused}");
    assert!(!refused.to_string().contains(&receipt), "{refused}");

    // The worker's call runs with it, once.
    app.spawn_worker();
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    assert!(app.tools.refused().is_empty());

    // The trail keeps the receipt the tool was sent: an admin sees it, everyone else a
    // withheld entry, and the chain verifies for all, at the gateway and here.
    let trail_path = format!("/v1/runs/{run_id}/audit");
    let (_, full) = app
        .request(Method::GET, &trail_path, Some(ADMIN_KEY), None)
        .await;
    assert_eq!(full["verified"], true, "{full}");
    assert_eq!(
        refund_executed(&full)["entry"]["detail"]["receipt"],
        receipt.as_str()
    );
    assert!(refund_executed(&full).get("entry_sha256").is_none());
    for key in others {
        let (status, trail) = app.request(Method::GET, &trail_path, Some(key), None).await;
        assert_eq!(status, StatusCode::OK, "{key}: {trail}");
        assert_eq!(trail["verified"], true, "{key}: {trail}");
        assert!(!trail.to_string().contains(&receipt), "{key}: {trail}");
        let executed = refund_executed(&trail);
        assert_eq!(executed["entry"]["detail"]["receipt"], withheld, "{key}");
        assert!(executed["entry_sha256"].is_string(), "{key}: {executed}");
        let elements = trail["entries"].as_array().unwrap();
        assert_eq!(countersign_model::audit::verify(elements), Ok(()), "{key}");
        // Every other element is the admin's, as stored.
        let all = full["entries"].as_array().unwrap();
        assert_eq!(elements.len(), all.len());
        let differ = elements.iter().zip(all).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ, 1,
            "{key}: only the refund's execution entry differs"
        );
    }
}

#[tokio::test]
async fn a_receipt_the_tool_ran_is_not_run_again_after_the_tool_restarts() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.refund_cycle().await;
    let (_, token) = kept_receipts(&app, &run_id).await.pop().unwrap();
    let key = format!("{run_id}:1:toolu_2");
    assert_eq!(app.tools.refunds().len(), 1);

    // The refunds service restarts; whoever holds the receipt sends it again, under the
    // call's own key, the turn written another way, and another turn.
    let restarted = app.tools_restarted().await;
    for (key, code) in [
        (key.clone(), "reused"),
        (format!("{run_id}:01:toolu_2"), "other_call"),
        (format!("{run_id}:2:toolu_2"), "other_call"),
    ] {
        let (status, body) = post_refund_to(&app, &restarted, Some(&token), &key, &asked()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{key}: {body}");
        assert_eq!(body["code"], code, "{key}: {body}");
    }
    assert!(
        restarted.refunds().is_empty(),
        "refunded again after the restart"
    );
    assert_eq!(app.tools.refunds().len(), 1);
    // Its first use is in the service's jti file, under the call's key.
    let file = app.agents_dir().join("receipts-run.jsonl");
    let kept = std::fs::read_to_string(file).unwrap();
    assert!(kept.contains(&format!("\"{key}\"")), "{kept}");
}
