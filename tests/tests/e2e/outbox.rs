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

/// The relays a worker's and a gateway's sweepers use, each logged in as its service.
async fn relays(
    app: &TestApp,
) -> (
    countersign_store::Store,
    countersign_store::relay::Relay,
    countersign_store::relay::Relay,
) {
    use countersign_runtime::bus::Bus;
    use countersign_runtime::names::{Names, Service};
    use countersign_store::Store;
    use countersign_store::relay::Relay;
    let names = Names::new(&app.namespace).unwrap();
    let store = Store::connect(&app.connections(), names.clone(), Metrics::default())
        .await
        .unwrap();
    let relay = |service| {
        let (store, names) = (store.clone(), names.clone());
        async move {
            let bus = Bus::connect(&app.connections_as(service), names)
                .await
                .unwrap();
            Relay::new(&store, bus, Metrics::default())
        }
    };
    let worker = relay(Service::Worker).await;
    let gateway = relay(Service::Gateway).await;
    (store, worker, gateway)
}

#[tokio::test]
async fn a_late_decision_is_published_by_a_worker_s_sweep_as_well_as_a_gateway_s() {
    use countersign_model::run::{RunId, RunStatus};
    use countersign_runtime::names::{Names, Service};
    use countersign_store::keys::Shard;

    let app = TestApp::spawn(refund_brain).await;
    let run = app.start_run("Refund A-1001 please.").await;
    let paused = app.wait_status(&run, "awaiting_approval").await;
    // The gateway's own sweeper must not publish it first: this test sweeps by hand.
    app.stop_gateway();
    app.approve_without_announcing(&run, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    let (store, worker, _) = relays(&app).await;
    let names = Names::new(&app.namespace).unwrap();
    let id = RunId::parse(&run).unwrap();
    assert!(
        store
            .outbox_entries(&id)
            .await
            .unwrap()
            .iter()
            .any(|a| a.subject == names.approval_decided(&id))
    );
    // Both services announce decisions (a worker its expiries), so a worker's sweep
    // publishes it once it is due, and the run goes on.
    wait_for(
        "a worker's sweep to publish the decision",
        PATIENCE,
        || async {
            worker.sweep(Service::Worker, Shard::of(&id)).await.unwrap();
            store
                .outbox_entries(&id)
                .await
                .unwrap()
                .is_empty()
                .then_some(())
        },
    )
    .await;
    wait_for("the run to complete", PATIENCE, || async {
        let status = store.load(&id).await.unwrap().unwrap().status;
        (status == RunStatus::Completed).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_worker_sweeping_leaves_a_gateways_late_cancel_to_a_gateway() {
    use countersign_model::audit::{AuditEntry, AuditKind};
    use countersign_model::events::Event;
    use countersign_model::run::{Cancellation, RunId, RunStatus};
    use countersign_runtime::names::{Names, Service, msg_id};
    use countersign_store::keys::Shard;
    use countersign_store::{Announcement, CancelOutcome};

    let app = TestApp::spawn(refund_brain).await;
    let run = app.start_run("Refund A-1001 please.").await;
    app.wait_status(&run, "awaiting_approval").await;
    app.stop_gateway();
    let (store, worker, gateway) = relays(&app).await;
    let names = Names::new(&app.namespace).unwrap();
    let id = RunId::parse(&run).unwrap();
    // A cancel recorded as a gateway that died right after would leave it: its nudge and the
    // held call's cancellation wait in the outbox.
    let stored = store.load(&id).await.unwrap().unwrap();
    let nudge = Announcement::new(
        msg_id::cancel(&id),
        names.runs_start(),
        Event::RunStart {
            run_id: id.clone(),
            agent: stored.agent.clone(),
            input: stored.input.clone(),
            requested_by: stored.requested_by.clone(),
            metadata: stored.metadata.clone(),
        },
    );
    let cancel = Cancellation {
        by: "rick".into(),
        reason: Some("asked twice".into()),
        at: countersign_model::now_ms(),
    };
    let mut entry = AuditEntry::new(&id, AuditKind::CancelRequested);
    entry.actor = Some("rick".into());
    let outcome = store
        .clone()
        .gateway()
        .cancel(&id, &cancel, &entry, &nudge)
        .await
        .unwrap();
    assert!(matches!(outcome, CancelOutcome::Requested(..)));
    let waiting = || async {
        let mut subjects: Vec<String> = store
            .outbox_entries(&id)
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.subject)
            .collect();
        subjects.sort();
        subjects
    };
    // Once the outbox is due, a worker's sweep publishes what both services announce (the
    // audit element) and leaves the cancel, which only gateways may announce.
    let gateways_only = [names.approval_cancelled(&id), names.runs_start()];
    wait_for(
        "a worker's sweep to publish the audit element",
        PATIENCE,
        || async {
            worker.sweep(Service::Worker, Shard::of(&id)).await.unwrap();
            let left = waiting().await;
            (!left.is_empty() && left.iter().all(|s| gateways_only.contains(s))).then_some(())
        },
    )
    .await;
    // A gateway's sweep publishes it, once due again, and the run ends cancelled.
    wait_for(
        "a gateway's sweep to publish the cancel",
        PATIENCE,
        || async {
            gateway
                .sweep(Service::Gateway, Shard::of(&id))
                .await
                .unwrap();
            waiting().await.is_empty().then_some(())
        },
    )
    .await;
    wait_for("the run to end cancelled", PATIENCE, || async {
        let status = store.load(&id).await.unwrap().unwrap().status;
        (status == RunStatus::Cancelled).then_some(())
    })
    .await;
}
