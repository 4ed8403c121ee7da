//! Only the people a policy names may decide, never on their own request unless allowed;
//! a quorum needs distinct people; every decision, accepted or refused, is in a hash-chained
//! audit trail that detects tampering.

use countersign_fake_model::refund_brain;
use countersign_runtime::metrics::Metrics;
use countersign_tests::app::{REQUESTER_KEY, REVIEWER_KEY, TestApp};
use countersign_tests::audit_kinds as kinds;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const FINANCE: &str = "approvers = [\"role:finance\"]\n";

/// Starts a refund run requested by `requester` and waits for it to pause.
async fn paused_run_requested_by(app: &TestApp, requester: &str) -> (String, Value) {
    let (status, body) = app
        .request(
            Method::POST,
            "/v1/runs",
            Some(REQUESTER_KEY),
            Some(json!({"agent": "refunds", "input": "Refund A-1001.", "requested_by": requester})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_string();
    let run = app.wait_status(&run_id, "awaiting_approval").await;
    (run_id, run["pending"][0]["digest"].clone())
}

fn approve(digest: &Value) -> Value {
    json!({"call_id": "toolu_2", "digest": digest, "action": "approve"})
}

async fn audit(app: &TestApp, run_id: &str) -> Value {
    let (status, body) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn a_requester_may_not_approve_their_own_request_and_the_refusal_is_audited() {
    let app = TestApp::builder(refund_brain).policy(FINANCE).start().await;
    let (run_id, digest) = paused_run_requested_by(&app, "rick").await;

    let (status, body) = app.decide_as("rick", &run_id, approve(&digest)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "not_an_approver");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("their own request"),
        "{body}"
    );
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert!(run["pending"][0]["decision"].is_null());

    let (status, body) = app.decide_as("alice", &run_id, approve(&digest)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decided_by"], "alice");
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);

    let trail = audit(&app, &run_id).await;
    assert_eq!(trail["verified"], true, "{trail}");
    let entries = trail["entries"].as_array().unwrap();
    // Refusals are kept apart from the chain, so a flood of them cannot delay a decision.
    let refused = &trail["refusals"][0];
    assert_eq!(refused["actor"], "rick");
    assert_eq!(refused["channel"], "api");
    assert_eq!(refused["call_id"], "toolu_2");
    assert_eq!(refused["code"], "own_request");
    let decided = entries
        .iter()
        .find(|e| e["entry"]["kind"] == "decided")
        .unwrap();
    assert_eq!(decided["entry"]["actor"], "alice");
    assert_eq!(
        kinds(&trail),
        ["executed", "requested", "decided", "executed", "completed"]
    );
}

#[tokio::test]
async fn people_outside_the_approvers_and_keys_speaking_for_strangers_are_refused() {
    let app = TestApp::builder(refund_brain).policy(FINANCE).start().await;
    let (run_id, digest) = paused_run_requested_by(&app, "rick").await;

    let (status, body) = app.decide_as("carol", &run_id, approve(&digest)).await;
    assert_eq!(status, 403, "{body}");
    // The stable class, and the exact reason by the name the script and the refusals use.
    assert_eq!(body["error"]["code"], "not_an_approver", "{body}");
    assert_eq!(body["error"]["refusal"], "not_approver", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not among the approvers")
    );
    // The reviewer key speaks only for itself, and "rita" is not in finance.
    let (status, body) = app.approve(&run_id, "toolu_2", &digest).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = app.decide_as("mallory", &run_id, approve(&digest)).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("on behalf of mallory")
    );
    let (status, body) = app
        .request(
            Method::POST,
            &format!("/v1/runs/{run_id}/decisions"),
            Some(REVIEWER_KEY),
            Some(json!({"decided_by": "alice", "decisions": [approve(&digest)]})),
        )
        .await;
    assert_eq!(status, 403, "{body}");

    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(app.tools.refunds().is_empty());
    // The two refusals of approvers' rules (carol's and rita's) are kept, apart from the chain.
    let trail = audit(&app, &run_id).await;
    assert_eq!(kinds(&trail), ["executed", "requested"]);
    let refused: Vec<&Value> = trail["refusals"].as_array().unwrap().iter().collect();
    assert_eq!(refused.len(), 2, "{trail}");
    assert_eq!(refused[0]["actor"], "rita");
    assert_eq!(refused[1]["actor"], "carol");
    assert!(refused.iter().all(|r| r["code"] == "not_approver"));
}

#[tokio::test]
async fn a_quorum_of_two_needs_two_different_people() {
    let policy = format!("{FINANCE}quorum = 2\n");
    let app = TestApp::builder(refund_brain).policy(&policy).start().await;
    let (run_id, digest) = paused_run_requested_by(&app, "carol").await;

    let (status, body) = app.decide_as("alice", &run_id, approve(&digest)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["status"], "approval_recorded");
    assert_eq!(body["decisions"][0]["approvals"], 1);
    assert_eq!(body["resumes"], false);
    let (status, body) = app.decide_as("alice", &run_id, approve(&digest)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["status"], "already_recorded");
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(
        app.tools.refunds().is_empty(),
        "one approval of two runs nothing"
    );

    let edit = json!({"call_id": "toolu_2", "digest": digest, "action": "edit",
                      "input": {"order_id": "A-1001", "amount": 5, "reason": "r"}});
    let (status, body) = app.decide_as("bob", &run_id, edit).await;
    assert_eq!(status, 400, "{body}");

    let (status, body) = app.decide_as("bob", &run_id, approve(&digest)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["status"], "recorded");
    assert_eq!(body["resumes"], true);
    let done = app.wait_status(&run_id, "completed").await;
    assert_eq!(done["pending"], json!([]));
    assert_eq!(app.tools.refunds().len(), 1);
    let results = countersign_fake_model::last_results(&app.model.requests()[1]);
    assert!(results[1]["content"].as_str().unwrap().contains("refunded"));
}

#[tokio::test]
async fn the_audit_chain_verifies_and_detects_an_edited_entry() {
    let app = TestApp::builder(refund_brain).policy(FINANCE).start().await;
    let (run_id, digest) = paused_run_requested_by(&app, "carol").await;
    app.decide_as("alice", &run_id, approve(&digest)).await;
    app.wait_status(&run_id, "completed").await;
    let trail = audit(&app, &run_id).await;
    assert_eq!(trail["verified"], true);
    assert!(trail["broken_at"].is_null());

    // Someone with Redis access rewrites who decided.
    let key = format!("cs:{}:audit:{{{run_id}}}", app.namespace);
    let mut element = trail["entries"][2].clone();
    assert_eq!(element["entry"]["actor"], "alice");
    element["entry"]["actor"] = "mallory".into();
    let mut conn = app.infra.redis().await;
    let _: () = redis::cmd("LSET")
        .arg(&key)
        .arg(2)
        .arg(element.to_string())
        .query_async(&mut conn)
        .await
        .unwrap();

    let trail = audit(&app, &run_id).await;
    assert_eq!(trail["verified"], false);
    assert_eq!(trail["broken_at"], 2);
}

#[tokio::test]
async fn entries_appended_by_processes_with_a_stale_view_of_the_chain_still_link() {
    use countersign_model::audit::{AuditEntry, AuditKind};
    use countersign_model::run::RunId;
    use countersign_runtime::names::Names;
    use countersign_store::Store;
    let app = TestApp::builder(refund_brain).policy(FINANCE).start().await;
    let (run_id, digest) = paused_run_requested_by(&app, "carol").await;
    app.decide_as("alice", &run_id, approve(&digest)).await;
    app.wait_status(&run_id, "completed").await;

    // Two more processes that never read this run: each links its first entry from a head it
    // does not know, and then from one the other has moved on since.
    let names = Names::new(&app.namespace).unwrap();
    let a = Store::connect(&app.connections(), names.clone(), Metrics::default())
        .await
        .unwrap();
    let b = Store::connect(&app.connections(), names, Metrics::default())
        .await
        .unwrap();
    let id = RunId::parse(&run_id).unwrap();
    for (store, actor) in [(&a, "a1"), (&b, "b1"), (&a, "a2"), (&a, "a3"), (&b, "b2")] {
        let mut entry = AuditEntry::new(&id, AuditKind::Notified);
        entry.actor = Some(actor.to_string());
        store.clone().gateway().audit(&entry).await.unwrap();
    }
    let trail = audit(&app, &run_id).await;
    assert_eq!(trail["verified"], true, "{trail}");
    let actors: Vec<&str> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["entry"]["actor"].as_str())
        .collect();
    assert!(
        actors.ends_with(&["a1", "b1", "a2", "a3", "b2"]),
        "{actors:?}"
    );
}
