//! The OpenAI wire format end to end, and tools that fail without failing the run.

use countersign_fake_model::{
    anthropic_text, anthropic_tool_use, last_results, openai_answer, turn,
};
use countersign_model::agent::Provider;
use countersign_tests::app::TestApp;
use serde_json::{Value, json};

#[tokio::test]
async fn an_openai_run_pauses_resumes_and_answers_each_call_with_a_tool_message_in_order() {
    let app = TestApp::builder(|request: &Value| match turn(request) {
        0 => openai_answer(
            Some("Checking and refunding."),
            &[
                ("call_1", "get_order", json!({"order_id": "A-1001"})),
                (
                    "call_2",
                    "issue_refund",
                    json!({"order_id": "A-1001", "amount": 129.0, "reason": "broken"}),
                ),
            ],
        ),
        _ => openai_answer(Some("Refunded."), &[]),
    })
    .provider(Provider::Openai)
    .start()
    .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    assert_eq!(paused["pending"][0]["call_id"], "call_2");
    assert_eq!(paused["text"], "Checking and refunding.");
    let digest = &paused["pending"][0]["digest"];
    let (status, body) = app.approve(&run_id, "call_2", digest).await;
    assert_eq!(status, 200, "{body}");
    let done = app.wait_status(&run_id, "completed").await;
    assert_eq!(done["answer"], "Refunded.");

    let requests = app.model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["tools"][1]["function"]["name"], "issue_refund");
    let messages = requests[1]["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);
    assert_eq!(messages[2]["tool_calls"][1]["id"], "call_2");
    assert_eq!(messages[3]["tool_call_id"], "call_1");
    assert_eq!(messages[4]["tool_call_id"], "call_2");
    assert!(
        messages[4]["content"]
            .as_str()
            .unwrap()
            .contains("refunded")
    );
    assert_eq!(
        app.tools
            .received("/refunds", &format!("{run_id}:1:call_2")),
        1
    );
}

#[tokio::test]
async fn a_failing_tool_and_bad_input_become_error_results_for_the_model() {
    let app = TestApp::spawn(|request: &Value| match turn(request) {
        0 => anthropic_tool_use(
            "Looking.",
            &[
                ("toolu_x", "get_order", json!({"order_id": "Z-9"})),
                ("toolu_y", "get_order", json!({"order": 5})),
                ("toolu_z", "delete_everything", json!({})),
            ],
        ),
        _ => anthropic_text("No such order."),
    })
    .await;
    let run_id = app.start_run("Look up Z-9.").await;
    let done = app.wait_status(&run_id, "completed").await;
    assert_eq!(done["answer"], "No such order.");
    let results = last_results(&app.model.requests()[1]);
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| r["is_error"] == true), "{results:?}");
    assert!(results[0]["content"].as_str().unwrap().contains("HTTP 404"));
    assert!(results[1]["content"].as_str().unwrap().contains("schema"));
    assert!(
        results[2]["content"]
            .as_str()
            .unwrap()
            .contains("no tool named")
    );
}
