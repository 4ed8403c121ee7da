//! A run whose tool call failed says so wherever the run is shown, though it ends `completed`
//! (the model answered anyway): the API's run (`failed_calls`), `run.completed`, the inbox's
//! run page and, while the run waits on another call, its queue row, and the command line's `runs get` and `show` (in `cli.rs`). The case of the
//! demo: a refund policy loosened past what the refunds service accepts, so the $129 refund
//! is released without a person and the service refuses it (401: no receipt). A call a person
//! refused is not a failed call.

use crate::inbox::{ALICE_KEY, Browser, add_keys};
use countersign_fake_model::{anthropic_text, anthropic_tool_use, refund_brain, turn};
use countersign_tests::app::{REQUESTER_KEY, TestApp};
use countersign_tests::live::LiveEvents;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The refund policy as the demo agent has it, and as loosened: only refunds over $400 wait.
const WHEN: &str = "when = \"input.amount > 20.0\"";
const LOOSENED: &str = "when = \"input.amount > 400.0\"";

/// An app whose worker runs the refund agent with its policy loosened past $400 (the gateway
/// keeps the file as it was; it decides nothing here), and alice's key for the inbox.
pub(super) async fn loosened_app() -> TestApp {
    loosened_app_with(refund_brain).await
}

/// [`loosened_app`] with the model `brain`.
async fn loosened_app_with(brain: fn(&Value) -> Value) -> TestApp {
    let mut app = TestApp::builder(brain)
        .workers(0)
        .gateway(add_keys)
        .start()
        .await;
    app.rewrite_agent(|agent| agent.replace(WHEN, LOOSENED));
    app.spawn_worker();
    app
}

/// A run whose $129 refund went to the refunds service without a person and was refused
/// there, once it has completed; its id.
pub(super) async fn refused_refund(app: &TestApp) -> String {
    let run_id = app.start_run("Refund A-1001 please.").await;
    app.wait_status(&run_id, "completed").await;
    assert_eq!(
        app.tools.refused(),
        ["missing"],
        "the tool refused the refund"
    );
    assert!(app.tools.refunds().is_empty());
    run_id
}

#[tokio::test]
async fn a_refund_its_tool_refused_is_a_failed_call_of_the_completed_run_in_the_api_in_run_completed_and_on_the_run_page()
 {
    let app = loosened_app().await;
    let run_id = refused_refund(&app).await;

    let (status, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["status"], "completed");
    let failed = run["failed_calls"].clone();
    assert_eq!(failed.as_array().map(Vec::len), Some(1), "{run}");
    assert_eq!(failed[0]["call_id"], "toolu_2");
    assert_eq!(failed[0]["tool"], "issue_refund");
    assert_eq!(failed[0]["outcome"], "failed");
    let error = failed[0]["error"].as_str().unwrap();
    assert!(error.contains("issue_refund answered HTTP 401"), "{error}");

    // run.completed says the same, as a client following the run gets it.
    let (status, live) = LiveEvents::open(&app, &run_id, REQUESTER_KEY, None).await;
    assert_eq!(status, StatusCode::OK);
    let events = live.unwrap().until("run.completed").await;
    let completed = &events.last().unwrap().data;
    assert_eq!(completed["failed_calls"], failed, "{completed}");

    // The run's page in the inbox: in its facts, and the calls listed.
    let alice = Browser::signed_in(&app, ALICE_KEY).await;
    let page = alice.get(&format!("/inbox/runs/{run_id}")).await;
    assert_eq!(page.status, StatusCode::OK);
    for shown in [
        "<dt>Failed calls</dt><dd class=\"failed-count\"><a href=\"#failed-calls\">1 call failed</a></dd>",
        "<section class=\"failed-calls\" id=\"failed-calls\"><h2>1 call failed</h2>",
        "<li data-call=\"toolu_2\"><strong>issue_refund</strong> (<code>toolu_2</code>) failed: ",
        "issue_refund answered HTTP 401",
    ] {
        assert!(
            page.html.contains(shown),
            "{shown:?} missing: {}",
            page.html
        );
    }
}

#[tokio::test]
async fn a_run_whose_refund_a_reviewer_rejected_has_no_failed_call() {
    let app = TestApp::builder(refund_brain)
        .gateway(add_keys)
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001 please.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let digest = &paused["pending"][0]["digest"];
    let decision = json!([{"call_id": "toolu_2", "digest": digest, "action": "reject",
                           "reason": "Photos show the item intact."}]);
    let (status, body) = app.decide(&run_id, decision).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let done = app.wait_status(&run_id, "completed").await;
    // The model was told the refund did not run, as an error; it was not to run.
    assert_eq!(done["failed_calls"], json!([]), "{done}");
    let told = &done["messages"][2]["content"][1];
    assert_eq!(
        (&told["is_error"], &told["outcome"]),
        (&json!(true), &json!("rejected"))
    );
    // Its page says the refund was rejected, not that it failed.
    let alice = Browser::signed_in(&app, ALICE_KEY).await;
    let page = alice.get(&format!("/inbox/runs/{run_id}")).await;
    assert!(
        page.html
            .contains("<strong>issue_refund</strong> was rejected:"),
        "{}",
        page.html
    );
    // What the page shows, not the words its live script knows for every outcome.
    let shown: String = page
        .html
        .split("<script")
        .enumerate()
        .map(|(i, part)| match i {
            0 => part,
            _ => part.split_once("</script>").map_or("", |(_, after)| after),
        })
        .collect();
    for unsaid in ["id=\"failed-calls\"", "call failed", " failed:"] {
        assert!(!shown.contains(unsaid), "{unsaid:?}: {shown}");
    }
}

/// Two refunds asked together: $129, which the loosened policy lets through and the service
/// refuses, and $450, which waits for a person.
fn one_refused_one_held(request: &Value) -> Value {
    let refund = |order: &str, amount: u32| json!({"order_id": order, "amount": amount, "reason": "arrived broken"});
    match turn(request) {
        0 => anthropic_tool_use(
            "I will refund both orders.",
            &[
                ("toolu_1", "issue_refund", refund("A-1001", 129)),
                ("toolu_2", "issue_refund", refund("A-1002", 450)),
            ],
        ),
        _ => anthropic_text("Done."),
    }
}

#[tokio::test]
async fn a_run_waiting_on_one_refund_after_its_other_failed_says_so_in_the_api_and_on_its_queue_row()
 {
    let app = loosened_app_with(one_refused_one_held).await;
    let run_id = app.start_run("Refund both orders.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    assert_eq!(paused["pending"][0]["call_id"], "toolu_2", "{paused}");
    let failed = &paused["failed_calls"];
    assert_eq!(failed.as_array().map(Vec::len), Some(1), "{paused}");
    assert_eq!(failed[0]["call_id"], "toolu_1");

    let alice = Browser::signed_in(&app, ALICE_KEY).await;
    let queue = alice.get("/inbox").await;
    assert!(
        queue.html.contains(&format!("data-run=\"{run_id}\"")),
        "{}",
        queue.html
    );
    let link =
        format!("<a class=\"failed\" href=\"/inbox/runs/{run_id}#failed-calls\">1 call failed</a>");
    assert!(
        queue.html.contains(&link),
        "{link:?} missing: {}",
        queue.html
    );
}
