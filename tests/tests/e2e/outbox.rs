//! Nothing recorded is stranded: a decision stored while NATS is down, or by a gateway that
//! died before it could publish, is announced from the run's outbox once it can be, and the
//! run completes without anyone posting again.

use countersign_fake_model::refund_brain;
use countersign_runtime::metrics::Metrics;
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::infra::Infra;
use countersign_tests::wait_for;
use futures::future::join_all;
use serde_json::Value;
use std::time::Instant;

const RUNS: usize = 10;

async fn paused_runs(app: &TestApp, what: &str) -> Vec<(String, Value)> {
    let inputs: Vec<String> = (0..RUNS).map(|i| format!("{what} {i}.")).collect();
    let runs = join_all(inputs.iter().map(|i| app.start_run(i))).await;
    join_all(runs.into_iter().map(|id| async {
        let run = app.wait_status(&id, "awaiting_approval").await;
        (id, run["pending"][0]["digest"].clone())
    }))
    .await
}

fn applied_once(app: &TestApp, runs: &[(String, Value)]) {
    for (id, _) in runs {
        assert_eq!(
            app.tools.received("/refunds", &format!("{id}:1:toolu_2")),
            1,
            "{id}"
        );
    }
    assert_eq!(app.tools.refunds().len(), runs.len());
}

#[tokio::test]
async fn decisions_made_while_nats_is_down_are_answered_and_resume_their_runs_when_it_returns() {
    let infra = Infra::start_restartable().await;
    let app = TestApp::builder(refund_brain).on(infra).start().await;
    let runs = paused_runs(&app, "Outage refund").await;

    app.infra.nats.stop().await.unwrap();
    let started = Instant::now();
    for (id, digest) in &runs {
        let (status, body) = app.approve(id, "toolu_2", digest).await;
        assert_eq!(
            status, 200,
            "the decision stands once Redis holds it: {body}"
        );
        assert_eq!(body["decisions"][0]["status"], "recorded");
    }
    println!(
        "{RUNS} decisions answered 200 with NATS down in {:?}",
        started.elapsed()
    );

    app.infra.nats.start().await.unwrap();
    let back = Instant::now();
    join_all(runs.iter().map(|(id, _)| app.wait_status(id, "completed"))).await;
    println!(
        "all {RUNS} runs completed {:?} after NATS returned",
        back.elapsed()
    );
    applied_once(&app, &runs);
    for (id, _) in &runs {
        let (_, trail) = app.get(&format!("/v1/runs/{id}/audit")).await;
        assert_eq!(trail["verified"], true);
    }
}

#[tokio::test]
async fn a_decision_recorded_by_a_gateway_that_died_before_publishing_is_announced_by_the_sweepers()
{
    let app = TestApp::spawn(refund_brain).await;
    let runs = paused_runs(&app, "Crash refund").await;
    for (id, digest) in &runs {
        app.approve_without_announcing(id, "toolu_2", digest).await;
    }
    let started = Instant::now();
    join_all(runs.iter().map(|(id, _)| app.wait_status(id, "completed"))).await;
    println!(
        "{RUNS} unpublished decisions announced and completed in {:?}",
        started.elapsed()
    );
    applied_once(&app, &runs);
    // The outbox is empty again and the global audit log holds every run's decision.
    wait_for("the outboxes to drain", PATIENCE, || async {
        let mut conn = redis::Client::open(app.infra.redis_url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .ok()?;
        let mut left = 0;
        for (id, _) in &runs {
            let n: usize = redis::cmd("HLEN")
                .arg(format!("cs:{}:outbox:{{{id}}}", app.namespace))
                .query_async(&mut conn)
                .await
                .ok()?;
            left += n;
        }
        (left == 0).then_some(())
    })
    .await;
    for (id, _) in &runs {
        let logged = app.stream_messages("AUDIT", &format!("audit.{id}")).await;
        assert!(
            logged.iter().any(|e| e["entry"]["kind"] == "decided"),
            "{logged:?}"
        );
    }
}

#[tokio::test]
async fn a_worker_sweeping_leaves_a_gateways_late_decision_to_a_gateway() {
    use countersign_model::run::{RunId, RunStatus};
    use countersign_runtime::bus::Bus;
    use countersign_runtime::names::{Names, Service};
    use countersign_store::Store;
    use countersign_store::keys::Shard;
    use countersign_store::relay::Relay;

    let app = TestApp::spawn(refund_brain).await;
    let run = app.start_run("Refund A-1001 please.").await;
    let paused = app.wait_status(&run, "awaiting_approval").await;
    // The gateway's own sweeper must not publish it first: this test sweeps by hand.
    app.stop_gateway();
    app.approve_without_announcing(&run, "toolu_2", &paused["pending"][0]["digest"])
        .await;

    let names = Names::new(&app.namespace).unwrap();
    let store = Store::connect(&app.connections(), names.clone(), Metrics::default())
        .await
        .unwrap();
    let bus = Bus::connect(&app.connections(), names.clone())
        .await
        .unwrap();
    let outbox = Relay::new(store.clone(), bus, Metrics::default());
    let id = RunId::parse(&run).unwrap();
    let waiting = || async {
        let entries = store.outbox_entries(&id).await.unwrap();
        entries.into_iter().map(|a| a.subject).collect::<Vec<_>>()
    };
    // Once the outbox is due, a worker's sweep publishes what both services announce (the
    // audit element) and leaves the decision, which only gateways may announce.
    wait_for(
        "a worker's sweep to publish the audit element",
        PATIENCE,
        || async {
            outbox.sweep(Service::Worker, Shard::of(&id)).await.unwrap();
            (waiting().await == vec![names.approval_decided(&id)]).then_some(())
        },
    )
    .await;
    let status = || async { store.load(&id).await.unwrap().unwrap().status };
    assert_eq!(status().await, RunStatus::AwaitingApproval);
    // A gateway's sweep publishes it, once due again, and the run goes on.
    wait_for(
        "a gateway's sweep to publish the decision",
        PATIENCE,
        || async {
            outbox
                .sweep(Service::Gateway, Shard::of(&id))
                .await
                .unwrap();
            waiting().await.is_empty().then_some(())
        },
    )
    .await;
    wait_for("the run to complete", PATIENCE, || async {
        (status().await == RunStatus::Completed).then_some(())
    })
    .await;
}
