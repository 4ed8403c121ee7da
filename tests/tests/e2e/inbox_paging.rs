//! `GET /v1/approvals` pages through every pending call with a cursor: no window hides the
//! newer runs, each call appears once however the pages are cut, and runs that moved on
//! are left out.

use countersign_fake_model::refund_brain;
use countersign_model::run::RunId;
use countersign_runtime::metrics::Metrics;
use countersign_runtime::names::Names;
use countersign_store::keys::{Keys, Shard};
use countersign_store::{Awaiting, Store};
use countersign_tests::app::TestApp;
use countersign_tests::wait_for;
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::Value;
use std::collections::HashSet;
use std::time::Duration;

const RUNS: usize = 1200;

/// Every page of the inbox at `limit`, following `next_cursor` until it is null.
async fn all_pages(app: &TestApp, limit: usize) -> Vec<Vec<Value>> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => format!("/v1/approvals?limit={limit}"),
            Some(c) => format!("/v1/approvals?limit={limit}&cursor={c}"),
        };
        let (status, body) = app.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        pages.push(body["approvals"].as_array().unwrap().clone());
        match body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return pages,
        }
        assert!(pages.len() <= RUNS, "the cursor does not move on");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_pages_through_twelve_hundred_paused_runs_showing_each_call_once() {
    let app = TestApp::builder(refund_brain).workers(4).start().await;
    let mut runs = Vec::new();
    for _ in 0..RUNS / 50 {
        runs.extend(join_all((0..50).map(|_| app.start_run("Refund A-1001 please."))).await);
    }
    let redis = redis::Client::open(app.infra.redis_url.as_str()).unwrap();
    let names = Names::new(&app.namespace).unwrap();
    // A run is indexed only once it is stored as awaiting approval.
    wait_for("every run to pause", Duration::from_secs(300), || async {
        let mut conn = redis.get_multiplexed_async_connection().await.ok()?;
        let mut paused = 0;
        for shard in Shard::all() {
            let in_shard: usize = redis::cmd("ZCARD")
                .arg(Keys::of(&names).awaiting_key(shard))
                .query_async(&mut conn)
                .await
                .ok()?;
            paused += in_shard;
        }
        (paused == RUNS).then_some(())
    })
    .await;

    // One run is decided: from then on it is left out, wherever it was in the index.
    let decided = &runs[RUNS / 2];
    let run = app.wait_status(decided, "awaiting_approval").await;
    let (status, body) = app
        .approve(decided, "toolu_2", &run["pending"][0]["digest"])
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let expected: HashSet<&str> = runs
        .iter()
        .map(String::as_str)
        .filter(|id| id != decided)
        .collect();

    for limit in [500, 100] {
        let pages = all_pages(&app, limit).await;
        let calls: Vec<(String, String)> = pages
            .iter()
            .flatten()
            .map(|a| {
                (
                    a["run_id"].as_str().unwrap().to_string(),
                    a["call_id"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let distinct: HashSet<&(String, String)> = calls.iter().collect();
        assert_eq!(
            distinct.len(),
            calls.len(),
            "a call appeared twice at limit {limit}"
        );
        let shown: HashSet<&str> = calls.iter().map(|(run, _)| run.as_str()).collect();
        assert_eq!(
            shown, expected,
            "the pages at limit {limit} show every waiting run"
        );
        assert!(calls.iter().all(|(_, call)| call == "toolu_2"));
        assert!(pages.iter().all(|page| page.len() <= limit));
        // Full pages, then the rest, then an empty last page that says there is no more.
        let full = (RUNS - 1) / limit;
        assert!(pages[..full].iter().all(|page| page.len() == limit));
        assert_eq!(
            pages.len(),
            full + 1 + usize::from((RUNS - 1).is_multiple_of(limit))
        );
    }
}

#[tokio::test]
async fn a_bad_cursor_or_limit_is_a_json_error() {
    let app = TestApp::builder(refund_brain).workers(0).start().await;
    for (query, code) in [
        ("cursor=nonsense", "invalid_cursor"),
        ("cursor=12-run%20x", "invalid_cursor"),
        ("limit=0", "bad_request"),
        ("limit=501", "bad_request"),
        ("limit=-1", "invalid_query"),
    ] {
        let (status, body) = app.get(&format!("/v1/approvals?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["code"], code, "{query}: {body}");
    }
    let (status, body) = app.get("/v1/approvals").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["approvals"], Value::Array(Vec::new()));
    assert_eq!(body["next_cursor"], Value::Null);
}

#[tokio::test]
async fn runs_that_paused_in_the_same_millisecond_are_paged_by_id_without_loss() {
    let app = TestApp::builder(refund_brain).workers(0).start().await;
    let names = Names::new(&app.namespace).unwrap();
    let store = Store::connect(&app.connections(), names.clone(), Metrics::default())
        .await
        .unwrap();
    let redis = redis::Client::open(app.infra.redis_url.as_str()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    // Ten runs in each of three milliseconds, so page boundaries fall inside the ties.
    let mut indexed = Vec::new();
    for ms in [1_000, 1_001, 1_002] {
        for i in 0..10 {
            let id = format!("run_{ms}_{i:02}");
            let _: i64 = redis::cmd("ZADD")
                .arg(Keys::of(&names).awaiting_key(Shard::of(&RunId::parse(&id).unwrap())))
                .arg(ms)
                .arg(&id)
                .query_async(&mut conn)
                .await
                .unwrap();
            indexed.push(id);
        }
    }
    for limit in [1, 3, 7, 30] {
        let mut seen = Vec::new();
        let mut after: Option<Awaiting> = None;
        loop {
            let page = store.awaiting(after.as_ref(), limit).await.unwrap();
            assert!(page.len() <= limit);
            seen.extend(page.iter().map(|a| a.run_id.to_string()));
            if page.len() < limit {
                break;
            }
            after = page.last().cloned();
        }
        assert_eq!(
            seen, indexed,
            "pages of {limit} give the index in order, once each"
        );
    }
}
