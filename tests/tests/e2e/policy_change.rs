//! A policy that changes while a call waits, or after it was decided and before it ran: the
//! call is checked again under the policy now, never run under one nobody checked it
//! against, and a rejection stays a rejection.

use countersign_fake_model::{last_results, refund_brain};
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::wait_for;
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The refund policy as the demo agent has it, which tests rewrite.
const WHEN: &str = "when = \"input.amount > 20.0\"";

/// A run paused on its refund, approved (or `action`ed) while no worker runs, then the agent
/// file rewritten by `edit`, then a worker started.
async fn decided_then_changed(
    action: Value,
    edit: impl FnOnce(String) -> String,
) -> (TestApp, String) {
    let mut app = TestApp::builder(refund_brain).start().await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    app.stop_worker(0).await;
    let mut decision = json!({"call_id": "toolu_2", "digest": paused["pending"][0]["digest"]});
    decision
        .as_object_mut()
        .unwrap()
        .extend(action.as_object().unwrap().clone());
    let (code, body) = app.decide(&run_id, json!([decision])).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    app.rewrite_agent(edit);
    app.spawn_worker();
    (app, run_id)
}

/// The demo refunds service refuses a refund over $20 that carries no receipt of a person's
/// approval, whatever the policy says: a policy loosened past that has the call released by
/// the worker and refused by the tool, which is what the tool's own check is for.
async fn refused_by_the_tool(app: &TestApp, run_id: &str) {
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(app.tools.refused(), ["missing"], "the call was sent");
    assert!(app.tools.refunds().is_empty());
}

/// The held call once it is held again as `toolu_2.r2`.
async fn held_again(app: &TestApp, run_id: &str) -> Value {
    wait_for("the call to be held again", PATIENCE, || async {
        let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
        (run["status"] == "awaiting_approval" && run["pending"][0]["call_id"] == "toolu_2.r2")
            .then(|| run["pending"][0].clone())
    })
    .await
}

/// The one event on `subject` of the `RUN_EVENTS` stream, once it is there.
async fn announced(app: &TestApp, subject: &str) -> Value {
    let mut events = wait_for("the event", PATIENCE, || async {
        let events = app.stream_messages("RUN_EVENTS", subject).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    events.remove(0)
}

/// The run's audit entries of `kind`, its chain verified.
async fn audited(app: &TestApp, run_id: &str, kind: &str) -> Vec<Value> {
    let entries = app.audit_entries(run_id).await;
    entries.into_iter().filter(|e| e["kind"] == kind).collect()
}

#[tokio::test]
async fn a_policy_tightened_after_approval_holds_the_call_again_instead_of_running_it() {
    let (app, run_id) = decided_then_changed(json!({"action": "approve"}), |agent| {
        agent.replace(WHEN, &format!("{WHEN}\nquorum = 2"))
    })
    .await;
    // Held again under its own id and a new digest, showing the decision made before.
    let again = &held_again(&app, &run_id).await;
    assert_eq!(again["quorum"], 2);
    assert_eq!(again["recheck"]["call_id"], "toolu_2");
    assert_eq!(again["recheck"]["decision"]["action"], "approve");
    assert_eq!(again["recheck"]["decision"]["decided_by"], "rita");
    assert_ne!(again["digest"], again["recheck"]["digest"]);
    assert_ne!(again["policy_version"], again["recheck"]["policy_version"]);
    assert!(app.tools.refunds().is_empty(), "nothing ran");
    let changed = audited(&app, &run_id, "policy_changed").await;
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0]["call_id"], "toolu_2");
    assert_eq!(changed[0]["detail"]["outcome"], "reheld");
    assert_eq!(changed[0]["detail"]["new_call_id"], "toolu_2.r2");

    // The old call decides nothing now; the new one needs its two approvals.
    let old =
        json!({"call_id": "toolu_2", "digest": again["recheck"]["digest"], "action": "approve"});
    let (code, body) = app.decide_as("alice", &run_id, old).await;
    assert_eq!(code, StatusCode::CONFLICT, "{body}");
    for person in ["alice", "bob"] {
        let decision =
            json!({"call_id": "toolu_2.r2", "digest": again["digest"], "action": "approve"});
        let (code, body) = app.decide_as(person, &run_id, decision).await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1, "the refund ran once");
    // The model's call is answered under the id it gave.
    let results = last_results(app.model.requests().last().unwrap());
    assert_eq!(results[1]["tool_use_id"], "toolu_2");
    assert!(
        results[1]["content"].as_str().unwrap().contains("refunded"),
        "{results:?}"
    );
}

#[tokio::test]
async fn an_approved_call_whose_policy_now_lets_it_through_runs_and_says_so() {
    let (app, run_id) = decided_then_changed(json!({"action": "approve"}), |agent| {
        agent.replace(WHEN, "when = \"input.amount > 400.0\"")
    })
    .await;
    app.wait_status(&run_id, "completed").await;
    // It ran with the receipt of the approval it had.
    assert_eq!(app.tools.refunds().len(), 1);
    let changed = audited(&app, &run_id, "policy_changed").await;
    assert_eq!(changed[0]["detail"]["outcome"], "released", "{changed:?}");
    let event = announced(&app, &format!("run.policy_changed.{run_id}")).await;
    assert_eq!(event["outcome"], "released");
    assert_eq!(event["call_id"], "toolu_2");
}

#[tokio::test]
async fn a_rejected_call_stays_rejected_when_the_policy_is_loosened() {
    let (app, run_id) = decided_then_changed(
        json!({"action": "reject", "reason": "duplicate"}),
        |agent| agent.replace(WHEN, "when = \"never\""),
    )
    .await;
    app.wait_status(&run_id, "completed").await;
    assert!(app.tools.refunds().is_empty());
    let results = last_results(app.model.requests().last().unwrap());
    assert!(
        results[1]["content"].as_str().unwrap().contains("rejected"),
        "{results:?}"
    );
    assert!(audited(&app, &run_id, "policy_changed").await.is_empty());
}

#[tokio::test]
async fn a_call_whose_tool_was_removed_tells_the_model_and_runs_nothing() {
    let (app, run_id) = decided_then_changed(json!({"action": "approve"}), |agent| {
        let at = agent.find("[[tools]]\nname = \"issue_refund\"").unwrap();
        agent[..at].to_string()
    })
    .await;
    app.wait_status(&run_id, "completed").await;
    assert!(app.tools.refunds().is_empty());
    let results = last_results(app.model.requests().last().unwrap());
    assert_eq!(results[1]["is_error"], true);
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap()
            .contains("no longer exists"),
        "{results:?}"
    );
    let changed = audited(&app, &run_id, "policy_changed").await;
    assert_eq!(changed[0]["detail"]["outcome"], "refused");
}

#[tokio::test]
async fn an_input_the_new_schema_refuses_is_not_run() {
    let (app, run_id) = decided_then_changed(json!({"action": "approve"}), |agent| {
        agent.replace("maximum = 500", "maximum = 100")
    })
    .await;
    app.wait_status(&run_id, "completed").await;
    assert!(app.tools.refunds().is_empty());
    let results = last_results(app.model.requests().last().unwrap());
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap()
            .contains("no longer fits"),
        "{results:?}"
    );
    assert_eq!(
        audited(&app, &run_id, "policy_changed").await[0]["detail"]["outcome"],
        "refused"
    );
}

#[tokio::test]
async fn a_running_worker_loads_a_changed_agent_file_and_keeps_the_old_one_when_it_is_broken() {
    let app = TestApp::builder(refund_brain)
        .worker(|c| c.agents_reload_ms = 50)
        .gateway(|c| c.agents_reload_ms = 50)
        .start()
        .await;
    let reloads = |outcome: &'static str| {
        let app = &app;
        async move {
            app.workers_metric(
                1,
                &format!("countersign_agent_reloads_total{{outcome=\"{outcome}\"}}"),
            )
            .await
        }
    };
    // A run that pauses shows the worker has loaded the file as it was.
    let first = app.start_run("Refund A-1001.").await;
    app.wait_status(&first, "awaiting_approval").await;
    app.rewrite_agent(|agent| agent.replace(WHEN, "when = \"input.amount > 400.0\""));
    wait_for("the worker to reload", PATIENCE, || async {
        (reloads("loaded").await >= 1.0).then_some(())
    })
    .await;
    // The gateway loads it too.
    let series = "countersign_agent_reloads_total{outcome=\"loaded\"}";
    wait_for("the gateway to reload", PATIENCE, || async {
        let text = app.gateway_metrics().await;
        (countersign_tests::metric_value(&text, series) >= Some(1.0)).then_some(())
    })
    .await;
    // The waiting refund is released, and a new one of $129 goes to the tool without anyone
    // (whose own check refuses both: no person approved them).
    app.wait_status(&first, "completed").await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refused(), ["missing", "missing"]);

    // A policy that does not compile is refused; the last good one stays.
    app.rewrite_agent(|agent| agent.replace("input.amount > 400.0", "input.amount >"));
    wait_for("the worker to refuse the file", PATIENCE, || async {
        (reloads("refused").await >= 1.0).then_some(())
    })
    .await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refused().len(), 3);
}

/// The red team's loosened file put back three seconds later: the worker checked the waiting
/// calls inside its reload, under the loosened policy, each closed call's announcement
/// waiting on NATS, and loaded the file put back only once all ten were done (45 s),
/// releasing refunds meanwhile. Here NATS is away, so each closed call's announcement waits
/// for as long as the test likes: the file put back takes effect at once all the same, the
/// check of the loosened file stops there, and no refund runs without a person.
#[tokio::test]
async fn a_file_undoing_a_loosened_policy_is_loaded_while_the_waiting_calls_are_still_checked() {
    const CALLS: usize = 10;
    let app = TestApp::builder(refund_brain)
        .on(countersign_tests::infra::Infra::start_restartable().await)
        .worker(|c| c.agents_reload_ms = 50)
        .start()
        .await;
    let inputs: Vec<String> = (0..CALLS).map(|i| format!("Refund A-100{i}.")).collect();
    let runs = app.paused_refunds(&inputs).await;
    let worker = |series: &'static str| app.workers_metric(1, series);
    let reloads = || worker("countersign_agent_reloads_total{outcome=\"loaded\"}");

    app.infra.stop_nats().await;
    app.rewrite_agent(|agent| agent.replace(WHEN, "when = \"input.amount > 400.0\""));
    wait_for("the loosened file to be loaded", PATIENCE, || async {
        (reloads().await >= 1.0).then_some(())
    })
    .await;
    app.rewrite_agent(|agent| agent.replace("when = \"input.amount > 400.0\"", WHEN));
    wait_for("the file put back to be loaded", PATIENCE, || async {
        (reloads().await >= 2.0).then_some(())
    })
    .await;
    let superseded = worker("countersign_policy_rechecks_total{outcome=\"superseded\"}").await;
    assert!(
        superseded < CALLS as f64,
        "the check under the loosened file went on after it was undone: {superseded} calls closed"
    );
    app.infra.start_nats().await;

    // A call still waits as it was held, or (closed under the loosened file) is held again
    // under the file put back: a person decides each, and each refund runs once, with its
    // receipt.
    for (run, digest) in &runs {
        let (code, body) = app.approve(run, "toolu_2", digest).await;
        if code == StatusCode::OK {
            assert_eq!(body["decisions"][0]["status"], "recorded", "{body}");
            continue;
        }
        assert_eq!(code, StatusCode::CONFLICT, "{body}");
        let again = held_again(&app, run).await;
        let (code, body) = app.approve(run, "toolu_2.r2", &again["digest"]).await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
    join_all(runs.iter().map(|(id, _)| app.wait_status(id, "completed"))).await;
    assert_eq!(app.tools.refunds().len(), CALLS);
    assert!(app.tools.refused().is_empty(), "{:?}", app.tools.refused());
    let released = worker("countersign_policy_rechecks_total{outcome=\"released\"}").await;
    assert_eq!(released, 0.0);
}

/// A run paused on its refund while a worker watches the agents' folder closely.
async fn waiting_refund() -> (TestApp, String, Value) {
    let app = TestApp::builder(refund_brain)
        .worker(|c| c.agents_reload_ms = 50)
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    (app, run_id, paused)
}

#[tokio::test]
async fn a_policy_tightened_while_a_call_waits_holds_it_again_under_the_new_terms() {
    let (app, run_id, paused) = waiting_refund().await;
    app.rewrite_agent(|agent| agent.replace(WHEN, &format!("{WHEN}\nquorum = 2")));
    let again = held_again(&app, &run_id).await;
    assert_eq!(again["quorum"], 2);
    assert_eq!(again["recheck"]["call_id"], "toolu_2");
    assert_eq!(again["recheck"]["digest"], paused["pending"][0]["digest"]);
    assert_eq!(
        again["recheck"]["decision"],
        Value::Null,
        "nobody had decided"
    );
    // The old call was closed by the change, never as a person's rejection of it.
    let (code, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(code, StatusCode::CONFLICT);
    let changed = audited(&app, &run_id, "policy_changed").await;
    let outcomes: Vec<&Value> = changed.iter().map(|e| &e["detail"]["outcome"]).collect();
    assert_eq!(outcomes, [&json!("superseded"), &json!("reheld")]);
    assert!(app.tools.refunds().is_empty());
}

#[tokio::test]
async fn a_policy_loosened_while_a_call_waits_lets_it_run() {
    let (app, run_id, _) = waiting_refund().await;
    app.rewrite_agent(|agent| agent.replace(WHEN, "when = \"input.amount > 400.0\""));
    app.wait_status(&run_id, "completed").await;
    refused_by_the_tool(&app, &run_id).await;
    let changed = audited(&app, &run_id, "policy_changed").await;
    let outcomes: Vec<&Value> = changed.iter().map(|e| &e["detail"]["outcome"]).collect();
    assert_eq!(outcomes, [&json!("superseded"), &json!("released")]);
    assert_eq!(
        app.workers_metric(1, "countersign_policy_rechecks_total{outcome=\"released\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn a_shadow_policy_records_where_it_differs_and_changes_nothing() {
    let app = TestApp::builder(refund_brain)
        .policy("\n[tools.shadow]\nwhen = \"input.amount > 200.0\"\n")
        .start()
        .await;
    // The live policy holds the refund of $129; the shadow would have let it run.
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let shadowed = audited(&app, &run_id, "policy_shadow").await;
    assert_eq!(shadowed.len(), 1, "{shadowed:?}");
    assert_eq!(shadowed[0]["call_id"], "toolu_2");
    assert_eq!(shadowed[0]["detail"]["outcome"], "would_release");
    assert_eq!(shadowed[0]["detail"]["live"]["gate"], "hold");
    assert_eq!(shadowed[0]["detail"]["shadow"]["gate"], "run");
    let event = announced(&app, &format!("run.policy_shadow.{run_id}")).await;
    assert_eq!(event["outcome"], "would_release");
    assert_eq!(
        app.workers_metric(
            1,
            "countersign_policy_shadow_total{tool=\"issue_refund\",outcome=\"would_release\"}"
        )
        .await,
        1.0
    );
    // The live policy decides: the refund waits for its approval, then runs once.
    let (code, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(code, StatusCode::OK);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
}

/// Asks for one refund of the amount the run's input names (`Refund 37`), then answers.
fn amount_brain(request: &Value) -> Value {
    if countersign_fake_model::turn(request) > 0 {
        return countersign_fake_model::anthropic_text("Done.");
    }
    let asked = countersign_fake_model::first_user_text(request);
    let amount: u32 = asked.trim_start_matches("Refund ").parse().unwrap();
    countersign_fake_model::anthropic_tool_use(
        "Refunding.",
        &[(
            "toolu_1",
            "issue_refund",
            json!({"order_id": "A-1", "amount": amount, "reason": "broken"}),
        )],
    )
}

/// The replay of `refunds` with its approval `when` replaced by `when`.
async fn replayed(app: &TestApp, when: &str) -> Value {
    let agent = std::fs::read_to_string(app.agents_dir().join("refunds.toml")).unwrap();
    let candidate = agent.replace(WHEN, &format!("when = \"{when}\""));
    let (code, report) = app
        .request(
            reqwest::Method::POST,
            "/v1/agents/refunds/replay",
            Some(countersign_tests::app::ADMIN_KEY),
            Some(json!({"candidate": candidate, "since": "7d"})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_counts_exactly_what_a_stricter_and_a_looser_candidate_would_change() {
    let app = TestApp::builder(amount_brain).start().await;
    // Refunds of $1 to $200: the live policy (over $20) runs 20 of them at once and holds 180.
    let inputs: Vec<String> = (1..=200).map(|n| format!("Refund {n}")).collect();
    let runs = futures::future::join_all(inputs.iter().map(|i| app.start_run(i))).await;
    for (n, run) in (1..=200).zip(&runs) {
        app.wait_status(
            run,
            if n <= 20 {
                "completed"
            } else {
                "awaiting_approval"
            },
        )
        .await;
    }

    let started = std::time::Instant::now();
    let stricter = replayed(&app, "input.amount > 10.0").await;
    println!(
        "replay of 200 runs and 180 waiting calls: {:?}",
        started.elapsed()
    );
    assert_eq!(stricter["runs"], 200, "{stricter}");
    assert_eq!(stricter["calls"], 200);
    let refunds = &stricter["tools"]["issue_refund"];
    assert_eq!(
        (
            &refunds["newly_held"],
            &refunds["newly_released"],
            &refunds["unchanged"]
        ),
        (&json!(10), &json!(0), &json!(190)),
        "$11 to $20 would wait: {refunds}"
    );
    let per_day = |report: &Value, side: &str| {
        report["approvals_per_day"][side]["anyone"]
            .as_f64()
            .unwrap()
    };
    assert!((per_day(&stricter, "live") - 180.0 / 7.0).abs() < 1e-9);
    assert!((per_day(&stricter, "candidate") - 190.0 / 7.0).abs() < 1e-9);
    assert_eq!(
        stricter["examples"]["newly_held"].as_array().unwrap().len(),
        3
    );
    // Every waiting call is still held, under another version: asked again.
    assert_eq!(stricter["waiting"]["reheld"].as_array().unwrap().len(), 180);
    assert_eq!(stricter["waiting"]["released"], json!([]));

    let looser = replayed(&app, "input.amount > 100.0").await;
    let refunds = &looser["tools"]["issue_refund"];
    assert_eq!(
        (
            &refunds["newly_held"],
            &refunds["newly_released"],
            &refunds["unchanged"]
        ),
        (&json!(0), &json!(80), &json!(120)),
        "$21 to $100 would run at once: {refunds}"
    );
    assert!((per_day(&looser, "candidate") - 100.0 / 7.0).abs() < 1e-9);
    assert_eq!(looser["waiting"]["released"].as_array().unwrap().len(), 80);
    assert_eq!(looser["waiting"]["reheld"].as_array().unwrap().len(), 100);

    // It reads, never writes: every held call still waits as it was.
    let (_, run) = app.get(&format!("/v1/runs/{}", runs[199])).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert_eq!(run["pending"][0]["call_id"], "toolu_1");
    // A candidate that does not load is refused with its error.
    let (code, body) = app
        .request(
            reqwest::Method::POST,
            "/v1/agents/refunds/replay",
            Some(countersign_tests::app::ADMIN_KEY),
            Some(json!({"candidate": "name = \"refunds\"\n[model]\nprovider = \"nope\""})),
        )
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not load"),
        "{body}"
    );
    // A key that does not administer may not replay.
    let (code, _) = app
        .request(
            reqwest::Method::POST,
            "/v1/agents/refunds/replay",
            Some(countersign_tests::app::REVIEWER_KEY),
            Some(json!({"candidate": "", "since": "7d"})),
        )
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
}

/// Decides the refund a paused run holds, by alice or bob in turn (`i`), and waits for the
/// run to end.
async fn settle(app: &TestApp, (run, digest): &(String, Value), i: usize, mut decision: Value) {
    decision["call_id"] = json!("toolu_1");
    decision["digest"] = digest.clone();
    let person = ["alice", "bob"][i % 2];
    let (code, body) = app.decide_as(person, run, decision).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    app.wait_status(run, "completed").await;
}

/// The suggestions for `refunds` from the last day, with these thresholds.
async fn suggested(app: &TestApp, min_calls: usize) -> Value {
    let (code, answer) = app
        .request(
            reqwest::Method::GET,
            &format!(
                "/v1/agents/refunds/suggestions?since=1d&min_calls={min_calls}&min_deciders=2"
            ),
            Some(countersign_tests::app::ADMIN_KEY),
            None,
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{answer}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suggestions_stop_below_every_refused_call_and_their_candidate_replays_as_they_say() {
    let app = TestApp::builder(amount_brain).start().await;
    // Held (over $20): $21 to $30 approved by alice and bob in turn, $33 rejected, $45
    // approved, $28 edited down, $24 still waiting. $5 and $8 ran at once.
    let approved: Vec<u32> = (21..=30).chain([45]).collect();
    let mut inputs: Vec<String> = approved.iter().map(|n| format!("Refund {n}")).collect();
    inputs.extend(["Refund 33", "Refund 28", "Refund 24"].map(String::from));
    let paused = app.paused_refunds(&inputs).await;
    for &n in &[5, 8] {
        let run = app.start_run(&format!("Refund {n}")).await;
        app.wait_status(&run, "completed").await;
    }
    for (i, held) in paused.iter().enumerate().take(approved.len()) {
        settle(&app, held, i, json!({"action": "approve"})).await;
    }
    settle(
        &app,
        &paused[11],
        11,
        json!({"action": "reject", "reason": "too much for a scratch"}),
    )
    .await;
    settle(
        &app,
        &paused[12],
        12,
        json!({"action": "edit", "input": {"order_id": "A-1", "amount": 10, "reason": "broken"},
               "note": "half"}),
    )
    .await;

    let answer = suggested(&app, 5).await;
    assert_eq!(
        (&answer["runs"], &answer["held"]),
        (&json!(16), &json!(13)),
        "{answer}"
    );
    let found = answer["suggestions"].as_array().unwrap();
    assert_eq!(found.len(), 1, "{answer}");
    let s = &found[0];
    // $21 to $27 were approved below the edited $28: the bound stops there, so neither the
    // edited nor the rejected call, nor the $45 above them, would have run.
    assert_eq!(
        (&s["tool"], &s["field"]),
        (&json!("issue_refund"), &json!("amount"))
    );
    assert_eq!(s["release"], "input.amount <= 27.0", "{s}");
    let e = &s["evidence"];
    assert_eq!(e["approved"], 7, "{e}");
    assert_eq!(e["deciders"], json!(["alice", "bob"]));
    assert_eq!(e["unanswered"], 0);
    assert_eq!(e["nearest_refused"]["value"], 28.0);
    assert_eq!(e["nearest_refused"]["settled"], "edited");
    assert_eq!(e["nearest_refused"]["run_id"], json!(paused[12].0));
    assert_eq!(
        (&s["disqualified"], &s["disqualifiers"]),
        (&json!(false), &json!([]))
    );
    // Replayed: the 7 approved and the $24 waiting would have run; the rest (the two that
    // ran at once among them) as they were.
    let r = &s["replay"];
    assert_eq!(
        (&r["calls"], &r["newly_released"], &r["unchanged"]),
        (&json!(16), &json!(8), &json!(8)),
        "{r}"
    );
    assert_eq!(s["when"]["before"], "input.amount > 20.0");
    let after = "(input.amount > 20.0) && !(input.amount <= 27.0)";
    assert_eq!(s["when"]["after"], after);
    // The candidate is the live file with that one line changed, and replays the same.
    let live = std::fs::read_to_string(app.agents_dir().join("refunds.toml")).unwrap();
    let candidate = s["candidate"].as_str().unwrap();
    assert_eq!(
        candidate,
        live.replace(WHEN, &format!("when = \"{after}\""))
    );
    let (code, replayed) = app
        .request(
            reqwest::Method::POST,
            "/v1/agents/refunds/replay",
            Some(countersign_tests::app::ADMIN_KEY),
            Some(json!({"candidate": candidate, "since": "1d"})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{replayed}");
    assert_eq!(replayed["tools"]["issue_refund"]["newly_released"], 8);

    // The command line says the same, and writes the candidate for a person to ship.
    let file = std::env::temp_dir().join(format!("cs-suggested-{}.toml", paused[0].0));
    let line = format!(
        "policy suggest refunds --since 1d --min-calls 5 --write {}",
        file.display()
    );
    let out = super::cli::ok(&app, countersign_tests::app::ADMIN_KEY, &line).await;
    for says in [
        "13 held calls settled in 16 runs of refunds",
        "1. issue_refund: let run without asking when input.amount <= 27.0  (no outcome",
        "7 approved as asked, none rejected or edited, by 2 (alice, bob)",
        "amount = 28.0 (edited)",
        "replayed: 8 of 16 calls newly released, 8 unchanged",
    ] {
        assert!(out.contains(says), "{says:?} missing from:\n{out}");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), candidate);
    std::fs::remove_file(&file).unwrap();

    // Eight approvals are more than the bound has: nothing is suggested.
    assert_eq!(suggested(&app, 8).await["suggestions"], json!([]));
    // It reads, never writes: the waiting refund still waits under the live policy.
    let (_, run) = app.get(&format!("/v1/runs/{}", paused[13].0)).await;
    assert_eq!(run["status"], "awaiting_approval");
    // Bad thresholds and windows are refused; only an administrator may ask.
    for query in ["min_calls=0", "since=91d", "since=soon", "bogus=1"] {
        let (code, body) = app
            .request(
                reqwest::Method::GET,
                &format!("/v1/agents/refunds/suggestions?{query}"),
                Some(countersign_tests::app::ADMIN_KEY),
                None,
            )
            .await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{query}: {body}");
    }
    let (code, _) = app
        .request(
            reqwest::Method::GET,
            "/v1/agents/nobody/suggestions",
            Some(countersign_tests::app::ADMIN_KEY),
            None,
        )
        .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    let (code, _) = app
        .request(
            reqwest::Method::GET,
            "/v1/agents/refunds/suggestions",
            Some(countersign_tests::app::REVIEWER_KEY),
            None,
        )
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);

    // The same bound as a standing grant, made by approving the $24 refund waiting now: the
    // command the suggestion printed works, and a later $26 refund runs under the grant.
    let grant = &s["grant"];
    assert_eq!(grant["run_id"], json!(paused[13].0), "{s}");
    assert_eq!(grant["digest"], paused[13].1);
    assert_eq!(
        (
            &grant["condition"],
            &grant["max_uses"],
            &grant["expires_in"]
        ),
        (&json!("input.amount <= 27.0"), &json!(7), &json!("1d"))
    );
    let command = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("countersign "))
        .expect("the grant's command line");
    super::cli::ok(&app, countersign_tests::app::REVIEWER_KEY, command).await;
    app.wait_status(&paused[13].0, "completed").await;
    let later = app.start_run("Refund 26").await;
    app.wait_status(&later, "completed").await;
    let decided = app.audit_entries(&later).await;
    assert!(
        decided
            .iter()
            .any(|e| e["kind"] == "decided" && e["detail"]["under_grant"].is_string()),
        "{decided:?}"
    );
    // Counted again, rita's approvals (one of them through her grant) are hers alone.
    let again = &suggested(&app, 5).await["suggestions"][0]["evidence"];
    assert_eq!(again["approved"], 9, "{again}");
    assert_eq!(again["deciders"], json!(["alice", "bob", "rita"]));
}

#[tokio::test]
async fn a_call_a_crashed_attempt_had_started_is_never_held_again_when_its_policy_changed() {
    let mut app = TestApp::builder(refund_brain).start().await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    app.stop_worker(0).await;
    let mut attention = app.attention_events(&run_id).await;
    let (code, _) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(code, StatusCode::OK);
    // A worker started the refund and died before recording its outcome; then the policy
    // was tightened. Asking again could run the refund a second time: it is reported instead.
    app.mark_started(&run_id, "toolu_2").await;
    app.rewrite_agent(|agent| agent.replace(WHEN, &format!("{WHEN}\nquorum = 2")));
    app.spawn_worker();
    app.wait_status(&run_id, "completed").await;
    app.assert_refund_reported_unknown(&mut attention).await;
    assert!(app.tools.refunds().is_empty(), "not sent again");
    assert!(audited(&app, &run_id, "policy_changed").await.is_empty());
}
