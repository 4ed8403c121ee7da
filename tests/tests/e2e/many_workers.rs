//! Several workers share the work: every run completes, every approved refund runs exactly
//! once, a duplicated `approval.decided` resumes nothing twice, and a stopped worker's
//! paused run is resumed by another.

use countersign_fake_model::refund_brain;
use countersign_model::events::Event;
use countersign_model::run::{Action, RunId};
use countersign_runtime::bus::Bus;
use countersign_runtime::names::Names;
use countersign_tests::app::TestApp;
use futures::future::join_all;
use std::time::Instant;

const RUNS: usize = 50;

#[tokio::test]
async fn two_workers_complete_fifty_concurrent_runs_with_each_refund_run_exactly_once() {
    let app = TestApp::builder(refund_brain).workers(2).start().await;
    let bus = Bus::connect(&app.connections(), Names::new(&app.namespace).unwrap())
        .await
        .unwrap();
    let began = Instant::now();
    let inputs: Vec<String> = (0..RUNS)
        .map(|i| format!("Refund order number {i}."))
        .collect();
    let runs: Vec<String> = join_all(inputs.iter().map(|input| app.start_run(input))).await;
    let paused = join_all(
        runs.iter()
            .map(|id| app.wait_status(id, "awaiting_approval")),
    )
    .await;
    let all_paused = began.elapsed();

    let deciding = Instant::now();
    join_all(runs.iter().zip(&paused).map(|(id, run)| {
        let digest = run["pending"][0]["digest"].clone();
        let (app, bus) = (&app, &bus);
        async move {
            let (status, body) = app.approve(id, "toolu_2", &digest).await;
            assert_eq!(status, 200, "{body}");
            // A second copy of the event under another message id, so JetStream does not
            // drop it as a duplicate: the workers must.
            let run_id = RunId::parse(id).unwrap();
            let event = Event::ApprovalDecided {
                run_id: run_id.clone(),
                call_id: "toolu_2".into(),
                action: Action::Approve,
                decided_by: "rita".into(),
                door: "api".into(),
                all_decided: true,
                channels: Vec::new(),
                under_grant: None,
                superseded: false,
            };
            bus.publish(
                bus.names.approval_decided(&run_id),
                &format!("copy:{id}"),
                event,
            )
            .await
            .unwrap();
        }
    }))
    .await;
    join_all(runs.iter().map(|id| app.wait_status(id, "completed"))).await;
    let all_done = deciding.elapsed();

    for id in &runs {
        assert_eq!(
            app.tools.received("/refunds", &format!("{id}:1:toolu_2")),
            1,
            "run {id}"
        );
        assert_eq!(
            app.tools
                .received("/orders/lookup", &format!("{id}:1:toolu_1")),
            1,
            "run {id}"
        );
    }
    assert_eq!(app.tools.refunds().len(), RUNS);
    for input in &inputs {
        assert_eq!(
            app.model.requests_for(input).len(),
            2,
            "{input}: the model is called twice"
        );
    }
    println!(
        "{RUNS} runs, 2 workers: started to all paused in {all_paused:?}; \
         decided to all completed in {all_done:?}"
    );
}

#[tokio::test]
async fn a_run_paused_by_a_worker_that_stopped_is_resumed_by_another() {
    let mut app = TestApp::builder(refund_brain).start().await;
    let run_id = app.start_run("Refund A-1001 please.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    app.stop_worker(0).await;
    app.spawn_worker();

    let digest = &paused["pending"][0]["digest"];
    let (status, body) = app.approve(&run_id, "toolu_2", digest).await;
    assert_eq!(status, 200, "{body}");
    let done = app.wait_status(&run_id, "completed").await;
    assert_eq!(done["answer"], "All done.");
    assert_eq!(
        app.tools
            .received("/refunds", &format!("{run_id}:1:toolu_2")),
        1
    );
}
