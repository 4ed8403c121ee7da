//! Cancelling a run: the requester or an admin stops it at its next step; its undecided calls
//! close (their channels say so), nothing held runs, `run.cancelled` is published and the
//! audit trail has who asked and that it stopped.

use approval_gateway::config::{ApiKey, Role};
use countersign_fake_model::refund_brain;
use countersign_tests::app::{ADMIN_KEY, PATIENCE, REQUESTER_KEY, REVIEWER_KEY, TestApp};
use countersign_tests::audit_kinds as kinds;
use countersign_tests::fake_slack::FakeSlack;
use countersign_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const OTHER_REQUESTER_KEY: &str = "test-other-requester-key-0123";

async fn cancel(
    app: &TestApp,
    key: &str,
    run_id: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    app.request(
        Method::POST,
        &format!("/v1/runs/{run_id}/cancel"),
        Some(key),
        body,
    )
    .await
}

/// An app that asks in Slack, with a run paused on its refund and its message posted.
async fn paused_with_slack() -> (TestApp, FakeSlack, String, Value) {
    let slack = FakeSlack::start().await;
    let slack_config = slack.config();
    let app = TestApp::builder(refund_brain)
        .policy("channels = [\"slack:#refunds\"]\n")
        .gateway(move |config| config.slack = Some(slack_config))
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    wait_for("the Slack message", PATIENCE, || async {
        slack.calls("chat.postMessage").pop()
    })
    .await;
    (app, slack, run_id, paused)
}

/// Waits for the call's Slack message to be updated to say it was cancelled.
async fn slack_says_cancelled(slack: &FakeSlack) {
    let update = wait_for("the Slack message to say cancelled", PATIENCE, || async {
        slack.calls("chat.update").pop()
    })
    .await;
    assert!(
        update.body.to_string().contains("Cancelled"),
        "{:?}",
        update.body
    );
}

#[tokio::test]
async fn the_requester_cancels_a_paused_run_its_call_closes_and_nothing_runs() {
    let (app, slack, run_id, paused) = paused_with_slack().await;

    let (status, body) = cancel(
        &app,
        REQUESTER_KEY,
        &run_id,
        Some(json!({"reason": "the customer withdrew the request"})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "cancelling");
    let done = app.wait_status(&run_id, "cancelled").await;
    assert_eq!(done["cancel"]["by"], "rick");
    assert_eq!(
        done["cancel"]["reason"],
        "the customer withdrew the request"
    );

    // Too late to decide; nothing ran, and the Slack message says why.
    let (status, body) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "run_cancelled");
    assert!(app.tools.refunds().is_empty());
    slack_says_cancelled(&slack).await;

    let ended = app
        .stream_messages("RUN_EVENTS", &format!("run.cancelled.{run_id}"))
        .await;
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0]["cancelled_by"], "rick");
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    assert_eq!(trail["verified"], true);
    // (Slack's "notified" entry lands whenever its delivery finished.)
    let kinds: Vec<String> = kinds(&trail)
        .into_iter()
        .filter(|k| k != "notified")
        .collect();
    // The order lookup ran before the pause; the refund never did.
    assert_eq!(
        kinds,
        ["executed", "requested", "cancel_requested", "cancelled"]
    );
    assert_eq!(
        app.model.requests().len(),
        1,
        "the model is not asked again"
    );

    // Cancelling again: the run has finished.
    let (status, body) = cancel(&app, REQUESTER_KEY, &run_id, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test]
async fn a_queued_run_cancelled_before_any_worker_took_it_never_reaches_the_model() {
    let mut app = TestApp::builder(refund_brain).workers(0).start().await;
    let run_id = app.start_run("Refund A-1001.").await;
    let (status, body) = cancel(&app, ADMIN_KEY, &run_id, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    app.spawn_worker();
    let done = app.wait_status(&run_id, "cancelled").await;
    assert_eq!(done["cancel"]["by"], "admin");
    assert!(app.model.requests().is_empty());
}

#[tokio::test]
async fn only_the_requester_or_an_admin_may_cancel() {
    let app = TestApp::builder(refund_brain)
        .gateway(|config| {
            config.api_keys.push(ApiKey {
                key: OTHER_REQUESTER_KEY.into(),
                role: Role::Requester,
                principal: "ria".into(),
                speaks_for: Vec::new(),
            });
        })
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    for key in [REVIEWER_KEY, OTHER_REQUESTER_KEY] {
        let (status, body) = cancel(&app, key, &run_id, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    }
    let (status, body) = cancel(&app, REQUESTER_KEY, &run_id, Some(json!({"why": "x"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an unknown field: {body}");
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["cancel"].is_null());
    let (status, body) = cancel(&app, "no-such-key-0123456789", &run_id, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, body) = cancel(&app, ADMIN_KEY, "run_nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

/// The kinds of a run's audit trail, in the order its scripts wrote them.
async fn trail(app: &TestApp, run_id: &str) -> Vec<String> {
    let (status, body) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    kinds(&body)
}

#[tokio::test]
async fn with_no_worker_running_a_cancel_closes_the_call_at_once_and_a_later_approval_is_refused() {
    let (mut app, slack, run_id, paused) = paused_with_slack().await;
    app.stop_worker(0).await;

    let (status, body) = cancel(&app, REQUESTER_KEY, &run_id, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let digest = &paused["pending"][0]["digest"];
    let (status, body) = app.approve(&run_id, "toolu_2", digest).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "run_cancelled");

    // The call closed in the cancel's own step: announced cancelled, never decided, and its
    // Slack message says so, though no worker has touched the run.
    let cancelled = wait_for("approval.cancelled", PATIENCE, || async {
        let sent = app
            .stream_messages("APPROVALS", &format!("approval.cancelled.{run_id}"))
            .await;
        (!sent.is_empty()).then_some(sent)
    })
    .await;
    assert_eq!(cancelled[0]["call_id"], "toolu_2");
    assert_eq!(cancelled[0]["cancelled_by"], "rick");
    let decided = app
        .stream_messages("APPROVALS", &format!("approval.decided.{run_id}"))
        .await;
    assert!(decided.is_empty(), "{decided:?}");
    slack_says_cancelled(&slack).await;
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert!(run["pending"][0]["decision"].is_null(), "{run}");
    let (_, approvals) = app.get("/v1/approvals").await;
    assert!(
        approvals["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["run_id"] != run_id.as_str()),
        "a cancelling run's call is no longer waiting: {approvals}"
    );

    // A worker finishes it as cancelled, and the refund never runs.
    app.spawn_worker();
    app.wait_status(&run_id, "cancelled").await;
    assert!(app.tools.refunds().is_empty());
    assert!(!trail(&app, &run_id).await.contains(&"decided".to_string()));
}

#[tokio::test]
async fn a_cancel_racing_approvals_either_comes_first_and_nothing_runs_or_comes_after_a_recorded_decision()
 {
    const RUNS: usize = 12;
    let app = TestApp::spawn(refund_brain).await;
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let run_id = app.start_run(&format!("Refund A-1001, race {i}.")).await;
        let paused = app.wait_status(&run_id, "awaiting_approval").await;
        runs.push((run_id, paused["pending"][0]["digest"].clone()));
    }
    // For each run, its requester's cancel and three approvals go out at once.
    let app = &app;
    let answers = futures::future::join_all(runs.iter().map(|(run_id, digest)| async move {
        let approvals =
            futures::future::join_all((0..3).map(|_| app.approve(run_id, "toolu_2", digest)));
        let (cancelled, approvals) =
            tokio::join!(cancel(app, REQUESTER_KEY, run_id, None), approvals);
        (cancelled, approvals)
    }))
    .await;

    let mut cancel_first = 0;
    for ((run_id, _), ((cancel_status, body), approvals)) in runs.iter().zip(&answers) {
        let kinds = trail(app, run_id).await;
        let requested = kinds.iter().position(|k| k == "cancel_requested");
        let decided = kinds.iter().position(|k| k == "decided");
        let recorded = approvals.iter().filter(|(s, _)| s.is_success()).count();
        for (status, body) in approvals {
            assert!(
                status.is_success()
                    || (*status == StatusCode::CONFLICT
                        && ["run_cancelled", "not_awaiting_approval"]
                            .contains(&body["error"]["code"].as_str().unwrap())),
                "{status} {body}"
            );
        }
        // A decision is in the trail only if it was recorded before the cancel.
        match (requested, decided) {
            (Some(r), Some(d)) => assert!(d < r, "{run_id}: {kinds:?}"),
            (None, _) => assert_eq!(*cancel_status, StatusCode::CONFLICT, "{body}"),
            (Some(_), None) => {
                cancel_first += 1;
                assert_eq!(recorded, 0, "{run_id}: {approvals:?}");
                app.wait_status(run_id, "cancelled").await;
                // Only the order lookup, before the pause, ran.
                let executed = kinds.iter().filter(|k| *k == "executed").count();
                assert_eq!(executed, 1, "{kinds:?}");
                assert_eq!(kinds[0], "executed", "{kinds:?}");
                let decided = app
                    .stream_messages("APPROVALS", &format!("approval.decided.{run_id}"))
                    .await;
                assert!(decided.is_empty(), "{decided:?}");
            }
        }
    }
    // Every run ends, one way or the other.
    for (run_id, _) in &runs {
        wait_for("the run to end", PATIENCE, || async {
            let status = app.get_run_status(run_id).await;
            ["completed", "cancelled"]
                .contains(&status.as_str())
                .then_some(())
        })
        .await;
    }
    println!(
        "{RUNS} runs raced a cancel against three approvals: the cancel came first in {cancel_first}; {} refunds ran",
        app.tools.refunds().len()
    );
}
