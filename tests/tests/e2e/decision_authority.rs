//! The decision script is the one authority, tried as an attacker would: approvals fired at a
//! run while it pauses, by its own requester or by a non-approver of a quorum call; a signed
//! approval sent again against another run; a flood of refusals while the approver decides; two
//! gateways deciding the same call at once.

use countersign_fake_model::refund_brain;
use countersign_runtime::signing::WebhookSecret;
use countersign_tests::app::{INTEGRATION_KEY, REQUESTER_KEY, TestApp};
use futures::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const FINANCE: &str = "approvers = [\"role:finance\"]\n";
const RUNS: usize = 50;

fn refund_input() -> Value {
    json!({"order_id": "A-1001", "amount": 129, "reason": "arrived broken"})
}

/// A run requested by `requester`, started through the requester key.
async fn start_for(app: &TestApp, requester: &str, input: String) -> String {
    let (status, body) = app
        .request(
            Method::POST,
            "/v1/runs",
            Some(REQUESTER_KEY),
            Some(json!({"agent": "refunds", "input": input, "requested_by": requester})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    body["run_id"].as_str().unwrap().to_string()
}

/// Fires `person`'s approval of the run's refund (its digest worked out in advance) from the
/// moment the run is started until the call is held and refused twice; returns the answers.
async fn fire_while_it_pauses(app: &TestApp, person: &str, run_id: &str) -> Vec<StatusCode> {
    let approve = json!({"call_id": "toolu_2", "action": "approve",
                         "digest": app.refund_digest(run_id, &refund_input())});
    let mut answers = Vec::new();
    while answers
        .iter()
        .filter(|s| **s == StatusCode::FORBIDDEN)
        .count()
        < 2
    {
        answers.push(app.decide_as(person, run_id, approve.clone()).await.0);
        assert!(answers.len() < 10_000, "the call never paused: {answers:?}");
    }
    answers
}

/// Kinds of the run's audit chain, in order.
async fn chain_kinds(app: &TestApp, run_id: &str) -> Vec<String> {
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    assert_eq!(trail["verified"], true, "{trail}");
    countersign_tests::audit_kinds(&trail)
}

/// The decision and the refund's execution come in that order, each once (the order lookup's
/// execution comes before the pause).
fn decided_before_executed(kinds: &[String]) {
    assert_eq!(kinds[0], "executed", "{kinds:?}");
    let kinds = &kinds[1..];
    let at = |kind: &str| kinds.iter().position(|k| k == kind).unwrap();
    assert!(at("requested") < at("decided"), "{kinds:?}");
    assert!(at("decided") < at("executed"), "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| *k == "executed").count(),
        1,
        "{kinds:?}"
    );
}

#[tokio::test]
async fn a_requester_racing_their_own_pause_never_approves_it() {
    let app = TestApp::builder(refund_brain)
        .workers(2)
        .policy(FINANCE)
        .start()
        .await;
    // rick asks for the refunds and is in finance, and a key that speaks for him decides.
    let runs: Vec<String> =
        join_all((0..RUNS).map(|i| start_for(&app, "rick", format!("Race refund {i}.")))).await;
    let answers = join_all(runs.iter().map(|id| fire_while_it_pauses(&app, "rick", id))).await;
    let fired: usize = answers.iter().map(Vec::len).sum();
    let accepted = answers.iter().flatten().filter(|s| s.is_success()).count();
    println!(
        "{fired} approvals fired by the requester while {RUNS} runs paused; {accepted} accepted"
    );
    assert_eq!(accepted, 0);
    for id in &runs {
        let (_, run) = app.get(&format!("/v1/runs/{id}")).await;
        assert_eq!(run["status"], "awaiting_approval", "{run}");
        assert!(run["pending"][0]["decision"].is_null(), "{run}");
    }
    assert!(app.tools.refunds().is_empty());

    // The approver then decides every run, and each audit has the decision before the refund.
    join_all(runs.iter().map(|id| async {
        let digest = app.refund_digest(id, &refund_input());
        let approve = json!({"call_id": "toolu_2", "digest": digest, "action": "approve"});
        assert_eq!(app.decide_as("alice", id, approve).await.0, StatusCode::OK);
        app.wait_status(id, "completed").await;
    }))
    .await;
    assert_eq!(app.tools.refunds().len(), RUNS);
    for id in &runs {
        decided_before_executed(&chain_kinds(&app, id).await);
    }
}

#[tokio::test]
async fn a_non_approver_racing_a_quorum_pause_never_counts() {
    let policy = format!("{FINANCE}quorum = 2\n");
    let app = TestApp::builder(refund_brain)
        .workers(2)
        .policy(&policy)
        .start()
        .await;
    let runs: Vec<String> =
        join_all((0..RUNS).map(|i| start_for(&app, "rick", format!("Quorum race {i}.")))).await;
    // carol is in support, not finance.
    let answers = join_all(
        runs.iter()
            .map(|id| fire_while_it_pauses(&app, "carol", id)),
    )
    .await;
    let accepted = answers.iter().flatten().filter(|s| s.is_success()).count();
    println!(
        "{} approvals fired by a non-approver while {RUNS} quorum-2 runs paused; {accepted} accepted",
        answers.iter().map(Vec::len).sum::<usize>()
    );
    assert_eq!(accepted, 0);

    // One finance approval is not enough; two are.
    let run = &runs[0];
    let approve = json!({"call_id": "toolu_2", "action": "approve",
                         "digest": app.refund_digest(run, &refund_input())});
    assert_eq!(
        app.decide_as("alice", run, approve.clone()).await.0,
        StatusCode::OK
    );
    let (_, view) = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(view["status"], "awaiting_approval");
    assert_eq!(app.decide_as("bob", run, approve).await.0, StatusCode::OK);
    app.wait_status(run, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    decided_before_executed(&chain_kinds(&app, run).await);
}

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::test]
async fn a_signed_approval_sent_to_another_run_is_refused_and_to_its_own_is_idempotent() {
    let app = TestApp::builder(refund_brain)
        .policy(FINANCE)
        .gateway(|config| {
            config.signed_senders = vec![approval_gateway::config::SignedSender {
                name: "ops-desk".into(),
                secret: WebhookSecret::parse(SECRET).unwrap(),
                speaks_for: vec!["alice".into()],
            }];
        })
        .start()
        .await;
    let first = start_for(&app, "carol", "Refund A-1001.".into()).await;
    let second = start_for(&app, "carol", "Refund A-1001 again.".into()).await;
    let paused = app.wait_status(&first, "awaiting_approval").await;
    app.wait_status(&second, "awaiting_approval").await;
    let body = json!({"run_id": first, "decided_by": "alice", "decisions": [
        {"call_id": "toolu_2", "digest": paused["pending"][0]["digest"], "action": "approve"}]})
    .to_string();
    let id = "msg_captured";
    let now = chrono::Utc::now().timestamp();
    let signature = WebhookSecret::parse(SECRET)
        .unwrap()
        .sign(id, now, body.as_bytes());
    let signed = |run: &str, body: String, signature: String| {
        app.http
            .post(format!("{}/v1/runs/{run}/decisions", app.gateway_url))
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", now.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
    };
    let post = |run: &str, body: String| signed(run, body, signature.clone());
    let answer = post(&first, body.clone()).await.unwrap();
    assert_eq!(answer.status(), 200);

    // The captured request, verbatim, against the second run: refused, nothing changes.
    let answer = post(&second, body.clone()).await.unwrap();
    assert_eq!(answer.status(), 400, "{}", answer.text().await.unwrap());
    let (_, run) = app.get(&format!("/v1/runs/{second}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["pending"][0]["decision"].is_null());
    // Even with the path's run named in the body, the digest is the first run's.
    let renamed = body.replace(&first, &second);
    let signature2 =
        WebhookSecret::parse(SECRET)
            .unwrap()
            .sign("msg_other", now, renamed.as_bytes());
    let answer = app
        .http
        .post(format!("{}/v1/runs/{second}/decisions", app.gateway_url))
        .header("content-type", "application/json")
        .header("webhook-id", "msg_other")
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", signature2)
        .body(renamed)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 409, "{}", answer.text().await.unwrap());
    // The same webhook-id with another body is refused; the same request again is a retry.
    let other = body.replace("\"approve\"", "\"reject\",\"reason\":\"no\"");
    let resigned = WebhookSecret::parse(SECRET)
        .unwrap()
        .sign(id, now, other.as_bytes());
    let answer = signed(&first, other, resigned).await.unwrap();
    assert_eq!(answer.status(), 401, "{}", answer.text().await.unwrap());
    let answer = post(&first, body).await.unwrap();
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(answer["decisions"][0]["status"], "already_recorded");

    app.wait_status(&first, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn a_flood_of_refusals_neither_delays_nor_hides_the_approvers_decision() {
    let app = TestApp::builder(refund_brain).policy(FINANCE).start().await;
    let run = start_for(&app, "rick", "Refund A-1001.".into()).await;
    let paused = app.wait_status(&run, "awaiting_approval").await;
    let digest = paused["pending"][0]["digest"].clone();
    let refused = Arc::new(AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    // Eight clients post carol's (not an approver) approvals with large notes, as fast as
    // they can, until the run has completed.
    let flood = join_all((0..8).map(|_| {
        let (app, refused, stop, digest) = (&app, refused.clone(), stop.clone(), digest.clone());
        let run = &run;
        async move {
            let note = "n".repeat(4000);
            let approve = json!({"call_id": "toolu_2", "digest": digest, "action": "reject",
                                 "reason": note});
            while !stop.is_cancelled() {
                let status = app.decide_as("carol", run, approve.clone()).await.0;
                assert!(matches!(status.as_u16(), 403 | 409), "{status}");
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }));
    let approver = async {
        // Let the flood run a while first.
        countersign_tests::wait_for(
            "a flood under way",
            countersign_tests::app::PATIENCE,
            || async { (refused.load(Ordering::Relaxed) >= 300).then_some(()) },
        )
        .await;
        let started = Instant::now();
        let approve = json!({"call_id": "toolu_2", "digest": digest, "action": "approve"});
        assert_eq!(
            app.decide_as("alice", &run, approve).await.0,
            StatusCode::OK
        );
        let answered = started.elapsed();
        app.wait_status(&run, "completed").await;
        let flooded = refused.load(Ordering::Relaxed);
        stop.cancel();
        (answered, started.elapsed(), flooded)
    };
    let (_, (answered, completed, flooded)) = tokio::join!(flood, approver);
    println!(
        "approver answered in {answered:?}, run completed {completed:?} after the decision, under a flood of {flooded} refusals"
    );
    assert_eq!(app.tools.refunds().len(), 1);
    let kinds = chain_kinds(&app, &run).await;
    decided_before_executed(&kinds);
    let (_, trail) = app.get(&format!("/v1/runs/{run}/audit")).await;
    assert_eq!(trail["refusals"].as_array().unwrap().len(), 100, "capped");
    assert!(trail.to_string().len() < 200_000, "the trail stays small");
}

#[tokio::test]
async fn two_gateways_deciding_one_call_at_once_record_and_announce_it_once() {
    let mut app = TestApp::builder(refund_brain).policy(FINANCE).start().await;
    let second = app.spawn_gateway(|_| {}).await;
    let run = start_for(&app, "rick", "Refund A-1001.".into()).await;
    let paused = app.wait_status(&run, "awaiting_approval").await;
    let body = json!({"decided_by": "alice", "decisions": [
        {"call_id": "toolu_2", "digest": paused["pending"][0]["digest"], "action": "approve"}]});
    let post = |base: String| {
        let body = body.clone();
        let app = &app;
        let run = &run;
        async move {
            let answer = app
                .http
                .post(format!("{base}/v1/runs/{run}/decisions"))
                .bearer_auth(INTEGRATION_KEY)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 200);
            answer.json::<Value>().await.unwrap()["decisions"][0]["status"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let (a, b) = tokio::join!(post(app.gateway_url.clone()), post(second));
    let mut statuses = [a, b];
    statuses.sort();
    assert_eq!(statuses, ["already_recorded", "recorded"]);
    app.wait_status(&run, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    let announced = app
        .stream_messages("APPROVALS", &format!("approval.decided.{run}"))
        .await;
    assert_eq!(announced.len(), 1, "{announced:?}");
    assert_eq!(announced[0]["all_decided"], true);
    assert_eq!(announced[0]["decided_by"], "alice");

    // A repeat is answered only to the one who decided; anyone else learns it is decided.
    let approve = json!({"call_id": "toolu_2", "action": "approve",
                         "digest": paused["pending"][0]["digest"]});
    assert_eq!(
        app.decide_as("bob", &run, approve.clone()).await.0,
        StatusCode::CONFLICT
    );
    assert_eq!(
        app.decide_as("alice", &run, approve).await.0,
        StatusCode::OK
    );
    let announced = app
        .stream_messages("APPROVALS", &format!("approval.decided.{run}"))
        .await;
    assert_eq!(
        announced.len(),
        1,
        "a repeat announces nothing: {announced:?}"
    );
}
