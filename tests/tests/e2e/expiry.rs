//! Deadlines: a call nobody decides in time expires exactly once however many workers
//! sweep, the model is told it expired, late decisions are refused, the channels show it;
//! a decided call never expires; and fifty conflicting decisions record exactly one.

use approval_gateway::config::WebhookEndpoint;
use countersign_fake_model::{last_results, refund_brain};
use countersign_runtime::names::Names;
use countersign_runtime::signing::WebhookSecret;
use countersign_store::keys::{Keys, Shard};
use countersign_tests::app::{INTEGRATION_KEY, PATIENCE, TestApp};
use countersign_tests::audit_kinds as kinds;
use countersign_tests::fake_slack::FakeSlack;
use countersign_tests::wait_for;
use countersign_tests::webhook_receiver::WebhookReceiver;
use futures::future::join_all;
use reqwest::Method;
use serde_json::{Value, json};

/// Deadlines still in the sweepers' sets, over every shard.
async fn deadlines_left(app: &TestApp) -> usize {
    timers_left(app, Keys::deadlines_key).await
}

/// Entries in one kind of timer set (`key` names a shard's), over every shard.
async fn timers_left(app: &TestApp, key: fn(&Keys, Shard) -> String) -> usize {
    let mut conn = app.infra.redis().await;
    let keys = Keys::of(&Names::new(&app.namespace).unwrap());
    let mut left = 0;
    for shard in Shard::all() {
        let n: usize = redis::cmd("ZCARD")
            .arg(key(&keys, shard))
            .query_async(&mut conn)
            .await
            .unwrap();
        left += n;
    }
    left
}

#[tokio::test]
async fn an_undecided_call_expires_once_across_three_workers_and_everyone_is_told() {
    let slack = FakeSlack::start().await;
    let hooks = WebhookReceiver::start(0).await;
    let (slack_config, hook_url) = (slack.config(), hooks.url.clone());
    let policy = "timeout = \"1s\"\nchannels = [\"slack:#refunds\"]\n";
    let app = TestApp::builder(refund_brain)
        .workers(3)
        .policy(policy)
        .gateway(move |config| {
            config.slack = Some(slack_config);
            config.webhooks = vec![WebhookEndpoint {
                name: "all".into(),
                url: hook_url,
                secret: WebhookSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap(),
                all_events: true,
            }];
        })
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    assert!(paused["pending"][0]["deadline"].as_i64().is_some());

    let done = app.wait_status(&run_id, "completed").await;
    assert_eq!(done["answer"], "All done.");
    assert!(
        app.tools.refunds().is_empty(),
        "an expired refund never runs"
    );
    let requests = app.model.requests();
    assert_eq!(requests.len(), 2, "the run resumed exactly once");
    let results = last_results(&requests[1]);
    assert_eq!(results[1]["is_error"], true);
    let told = results[1]["content"].as_str().unwrap();
    assert!(
        told.contains("before its deadline") && told.contains("not a rejection"),
        "{told}"
    );

    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    assert_eq!(
        kinds(&trail).iter().filter(|k| *k == "expired").count(),
        1,
        "{trail}"
    );
    assert_eq!(trail["verified"], true);

    let (status, body) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 410, "{body}");
    assert_eq!(body["error"]["code"], "expired");

    let update = wait_for("the Slack message to say it expired", PATIENCE, || async {
        slack.calls("chat.update").pop()
    })
    .await;
    assert!(
        update.body["blocks"].to_string().contains("Expired"),
        "{:?}",
        update.body
    );
    wait_for("approval.expired at the webhook", PATIENCE, || async {
        hooks.of_type("approval.expired").pop()
    })
    .await;
    wait_for("the deadline to be swept away", PATIENCE, || async {
        (deadlines_left(&app).await == 0).then_some(())
    })
    .await;
    // Counted once, by whichever worker swept it.
    let expired = app
        .workers_metric(3, r#"countersign_calls_total{event="expired"}"#)
        .await;
    assert_eq!(expired, 1.0);
}

#[tokio::test]
async fn a_shard_whose_sweeper_vanished_is_swept_by_another_once_its_lease_lapses() {
    let app = TestApp::builder(refund_brain)
        .policy("timeout = \"1s\"\n")
        .start()
        .await;
    // A sweeper that took every shard's lease and died: nobody else may sweep for 3 s.
    let mut conn = app.infra.redis().await;
    let names = Names::new(&app.namespace).unwrap();
    let leased_at = chrono::Utc::now().timestamp_millis();
    for shard in Shard::all() {
        let _: () = redis::cmd("SET")
            .arg(Keys::of(&names).sweep_lease_key(shard))
            .arg("a-worker-that-died")
            .arg("PX")
            .arg(3000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    // The live worker takes the shards over once the leases lapse, and expires the call.
    app.wait_status(&run_id, "completed").await;
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let expired = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entry"]["kind"] == "expired")
        .unwrap_or_else(|| panic!("no expiry in {trail}"));
    // Not before: while the lease was held, nobody swept that shard.
    assert!(
        expired["entry"]["at"].as_i64().unwrap() >= leased_at + 3000,
        "{expired}"
    );
    let holder: String = redis::cmd("GET")
        .arg(Keys::of(&names).sweep_lease_key(Shard::of(
            &countersign_model::run::RunId::parse(&run_id).unwrap(),
        )))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_ne!(holder, "a-worker-that-died");
}

#[tokio::test]
async fn a_decided_call_leaves_the_sweepers_sets_when_its_run_resumes() {
    let app = TestApp::builder(refund_brain)
        .policy("timeout = \"1h\"\nremind_before = \"30m\"\n")
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    // The timers are set just after the pause is saved.
    wait_for("the call's timers to be set", PATIENCE, || async {
        let set = (
            deadlines_left(&app).await,
            timers_left(&app, Keys::reminders_key).await,
        );
        (set == (1, 1)).then_some(())
    })
    .await;
    app.approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    app.wait_status(&run_id, "completed").await;
    // Not left for the sweepers to find in an hour: gone as the run resumed.
    assert_eq!(deadlines_left(&app).await, 0);
    assert_eq!(timers_left(&app, Keys::reminders_key).await, 0);
}

#[tokio::test]
async fn a_decided_call_never_expires() {
    let app = TestApp::builder(refund_brain)
        .workers(2)
        .policy("timeout = \"4s\"\n")
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let (status, body) = app
        .approve(&run_id, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200, "{body}");
    app.wait_status(&run_id, "completed").await;
    // Its timer went as the run resumed; and once the deadline has passed, and sweeps with
    // it, nothing has expired.
    assert_eq!(deadlines_left(&app).await, 0);
    let deadline = paused["pending"][0]["deadline"].as_i64().unwrap();
    wait_for("the deadline and a sweep to pass", PATIENCE, || async {
        (chrono::Utc::now().timestamp_millis() > deadline + 1000).then_some(())
    })
    .await;
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    assert!(!kinds(&trail).contains(&"expired".to_string()), "{trail}");
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn fifty_concurrent_conflicting_decisions_on_one_call_record_exactly_one() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let digest = paused["pending"][0]["digest"].clone();
    let path = format!("/v1/runs/{run_id}/decisions");
    let answers = join_all((0..50).map(|i| {
        let decision = if i % 2 == 0 {
            json!({"call_id": "toolu_2", "digest": digest, "action": "approve"})
        } else {
            json!({"call_id": "toolu_2", "digest": digest, "action": "reject", "reason": format!("no {i}")})
        };
        let person = ["alice", "bob", "carol", "rick"][i % 4];
        let body = json!({"decided_by": person, "decisions": [decision]});
        let path = path.clone();
        let app = &app;
        async move { app.request(Method::POST, &path, Some(INTEGRATION_KEY), Some(body)).await }
    }))
    .await;
    let recorded: Vec<&Value> = answers
        .iter()
        .filter(|(status, body)| *status == 200 && body["decisions"][0]["status"] == "recorded")
        .map(|(_, body)| body)
        .collect();
    assert_eq!(recorded.len(), 1, "exactly one decision is recorded");
    for (status, body) in &answers {
        let repeat = *status == 200 && body["decisions"][0]["status"] == "already_recorded";
        assert!(
            repeat || *status == 409 || body == recorded[0],
            "{status} {body}"
        );
    }
    app.wait_status(&run_id, "completed").await;
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    assert_eq!(kinds(&trail).iter().filter(|k| *k == "decided").count(), 1);
    assert!(app.tools.refunds().len() <= 1);
    println!(
        "50 concurrent decisions: 1 recorded, {} refused as conflicts, {} repeats",
        answers.iter().filter(|(s, _)| *s == 409).count(),
        answers
            .iter()
            .filter(|(s, b)| *s == 200 && b["decisions"][0]["status"] == "already_recorded")
            .count()
    );
}

/// The red team's eight calls expiring together: the worker that expired each was refused
/// the expiry's `approval.decided` by the shipped NATS permissions, waited for an ack that
/// never came, and left it to a gateway's outbox sweeper, so each expired a publish timeout
/// later than the one before. Each is announced by the worker that expired it, when it
/// expired it: no announcement waits for a sweeper.
#[tokio::test]
async fn calls_expiring_together_are_announced_by_the_worker_that_expired_them_alone() {
    const CALLS: usize = 8;
    let app = TestApp::builder(refund_brain)
        .policy("timeout = \"2s\"\n")
        .start()
        .await;
    let inputs: Vec<String> = (0..CALLS).map(|i| format!("Refund A-100{i}.")).collect();
    let runs = join_all(inputs.iter().map(|input| app.start_run(input))).await;
    join_all(runs.iter().map(|id| app.wait_status(id, "completed"))).await;
    assert!(
        app.tools.refunds().is_empty(),
        "an expired refund never runs"
    );

    let worker = |series: &'static str| app.workers_metric(1, series);
    assert_eq!(
        worker(r#"countersign_calls_total{event="expired"}"#).await,
        CALLS as f64
    );
    assert_eq!(
        worker(r#"countersign_announcements_total{kind="approval.decided",sent="at_once"}"#).await,
        CALLS as f64,
        "the worker announced every expiry it recorded, at once"
    );
    assert_eq!(
        worker(r#"countersign_announcements_total{kind="approval.decided",sent="late"}"#).await,
        0.0
    );
    let gateway = app.gateway_metrics().await;
    assert_eq!(
        countersign_tests::metric_value(
            &gateway,
            r#"countersign_announcements_total{kind="approval.decided",sent="late"}"#
        ),
        None,
        "no gateway's sweeper had an expiry to send"
    );
}
