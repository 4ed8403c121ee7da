//! A run pauses before a call that needs a person, and resumes once it is decided.

use countersign_fake_model::{
    anthropic_text, anthropic_tool_use, last_results, refund_brain, turn,
};
use countersign_tests::app::TestApp;
use serde_json::json;

#[tokio::test]
async fn an_approved_refund_runs_once_and_both_results_reach_the_model_in_one_message() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app
        .start_run("Order A-1001 arrived broken, please refund it.")
        .await;

    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let pending = paused["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["tool"], "issue_refund");
    assert_eq!(pending[0]["summary"], "Refund $129 for order A-1001");
    assert_eq!(pending[0]["reason"], "Refund of $129 moves money");
    assert!(
        pending[0]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert_eq!(
        paused["text"],
        "The order arrived broken; I will check it and refund it."
    );
    // The lookup ran while the refund waited; nothing was refunded yet.
    let key_of = |call: &str| format!("{run_id}:1:{call}");
    assert_eq!(app.tools.received("/orders/lookup", &key_of("toolu_1")), 1);
    assert_eq!(app.tools.received("/refunds", &key_of("toolu_2")), 0);
    assert_eq!(app.model.requests().len(), 1);

    let decided = std::time::Instant::now();
    let (status, body) = app.approve(&run_id, "toolu_2", &pending[0]["digest"]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["resumes"], true);

    let done = app.wait_status(&run_id, "completed").await;
    println!(
        "decision to completed run (resume, refund, model turn): {:?}",
        decided.elapsed()
    );
    assert_eq!(done["answer"], "All done.");
    assert_eq!(app.tools.received("/refunds", &key_of("toolu_2")), 1);
    assert_eq!(app.tools.refunds().len(), 1);

    let requests = app.model.requests();
    assert_eq!(requests.len(), 2);
    let results = last_results(&requests[1]);
    assert_eq!(results.len(), 2, "both results go back in one message");
    assert_eq!(results[0]["tool_use_id"], "toolu_1");
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains("delivered")
    );
    assert_eq!(results[1]["tool_use_id"], "toolu_2");
    assert!(results[1]["content"].as_str().unwrap().contains("refunded"));
    assert!(results.iter().all(|r| r.get("is_error").is_none()));
}

#[tokio::test]
async fn a_rejection_reaches_the_model_as_an_error_with_the_reason_and_nothing_is_refunded() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001 please.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let digest = &paused["pending"][0]["digest"];

    let (status, body) = app
        .decide(
            &run_id,
            json!([{"call_id": "toolu_2", "digest": digest, "action": "reject",
                                 "reason": "Photos show the item intact."}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    app.wait_status(&run_id, "completed").await;

    assert!(app.tools.refunds().is_empty());
    assert_eq!(
        app.tools
            .received("/refunds", &format!("{run_id}:1:toolu_2")),
        0
    );
    let results = last_results(&app.model.requests()[1]);
    assert_eq!(results[1]["is_error"], true);
    let content = results[1]["content"].as_str().unwrap();
    assert!(content.contains("rejected"), "{content}");
    assert!(
        content.contains("Photos show the item intact."),
        "{content}"
    );
}

#[tokio::test]
async fn an_edited_refund_runs_with_the_reviewers_input_and_the_model_is_told() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001 please.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let digest = &paused["pending"][0]["digest"];

    let edited = json!({"order_id": "A-1001", "amount": 49, "reason": "partial refund"});
    let (status, body) = app
        .decide(
            &run_id,
            json!([{"call_id": "toolu_2", "digest": digest, "action": "edit",
                                 "input": edited, "note": "Only the lid was broken."}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    app.wait_status(&run_id, "completed").await;

    let refunds = app.tools.refunds();
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0]["amount"], 49);
    let results = last_results(&app.model.requests()[1]);
    let content = results[1]["content"].as_str().unwrap();
    assert!(content.contains("edited"), "{content}");
    assert!(content.contains("\"amount\":49"), "{content}");
    assert!(content.contains("Only the lid was broken."), "{content}");
}

/// A reviewer who opens the edit form and sends it back unchanged approved the call as shown:
/// it is recorded and told as an approval, not as "approved with changes".
#[tokio::test]
async fn an_edit_that_changes_nothing_is_recorded_as_an_approval() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001 please.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let held = &paused["pending"][0];
    let (status, body) = app
        .decide(
            &run_id,
            json!([{"call_id": "toolu_2", "digest": held["digest"], "action": "edit",
                    "input": held["input"], "note": "Checked the photos."}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    app.wait_status(&run_id, "completed").await;
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let decided = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entry"]["kind"] == "decided")
        .unwrap();
    assert_eq!(decided["entry"]["detail"]["action"], "approve", "{decided}");
    assert_eq!(decided["entry"]["detail"]["note"], "Checked the photos.");
    let refunds = app.tools.refunds();
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0]["amount"], held["input"]["amount"]);
    let results = last_results(&app.model.requests()[1]);
    let content = results[1]["content"].as_str().unwrap();
    assert!(!content.contains("edited"), "{content}");
}

#[tokio::test]
async fn two_held_calls_decided_in_two_requests_call_the_model_once_after_the_second() {
    let app = TestApp::spawn(|request: &serde_json::Value| match turn(request) {
        0 => anthropic_tool_use(
            "Two refunds.",
            &[
                (
                    "toolu_a",
                    "issue_refund",
                    json!({"order_id": "A-1001", "amount": 100, "reason": "broken"}),
                ),
                (
                    "toolu_b",
                    "issue_refund",
                    json!({"order_id": "A-1002", "amount": 30, "reason": "late"}),
                ),
            ],
        ),
        _ => anthropic_text("Both handled."),
    })
    .await;
    let run_id = app.start_run("Refund both orders.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let pending = paused["pending"].as_array().unwrap().clone();
    assert_eq!(pending.len(), 2);

    let (status, body) = app.approve(&run_id, "toolu_b", &pending[1]["digest"]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["resumes"], false);
    let still = app.wait_status(&run_id, "awaiting_approval").await;
    assert_eq!(still["pending"][1]["decision"]["action"], "approve");
    assert_eq!(
        app.model.requests().len(),
        1,
        "no model call before the last decision"
    );
    assert!(
        app.tools.refunds().is_empty(),
        "nothing runs before the turn is decided"
    );

    let (status, body) = app
        .decide(&run_id, json!([{"call_id": "toolu_a", "digest": pending[0]["digest"], "action": "reject", "reason": "too much"}]))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["resumes"], true);
    app.wait_status(&run_id, "completed").await;

    let requests = app.model.requests();
    assert_eq!(
        requests.len(),
        2,
        "the model is called once, after the second decision"
    );
    let results = last_results(&requests[1]);
    assert_eq!(results[0]["tool_use_id"], "toolu_a");
    assert_eq!(results[0]["is_error"], true);
    assert_eq!(results[1]["tool_use_id"], "toolu_b");
    assert_eq!(app.tools.refunds().len(), 1);
    assert_eq!(app.tools.refunds()[0]["order_id"], "A-1002");
}

#[tokio::test]
async fn a_small_refund_needs_no_approval() {
    let app = TestApp::spawn(|request: &serde_json::Value| match turn(request) {
        0 => anthropic_tool_use(
            "Small refund.",
            &[(
                "toolu_s",
                "issue_refund",
                json!({"order_id": "A-1002", "amount": 15.5, "reason": "late"}),
            )],
        ),
        _ => anthropic_text("Refunded."),
    })
    .await;
    let run_id = app.start_run("Refund A-1002.").await;
    let done = app.wait_status(&run_id, "completed").await;
    assert_eq!(done["answer"], "Refunded.");
    assert_eq!(app.tools.refunds().len(), 1);
}
