//! What a requester key reads: the runs it asked for or speaks for, and through every listing
//! only what those runs hold. The held calls waiting in `/v1/approvals` (their input and the
//! model's words) and the standing grants of `/v1/grants` are asked the same rule as
//! `GET /v1/runs/{id}` (`authority::may_read`), so a key that may not read a run does not
//! learn what it waits on through a listing either.

use super::grants::{grant, held, refund_asked, start_with, terms};
use approval_gateway::config::{ApiKey, Role};
use countersign_tests::app::{READER_KEY, REQUESTER_KEY, REVIEWER_KEY, TestApp};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// A requester key that speaks for nobody but its own principal, `rhea`.
const RHEA_KEY: &str = "test-rhea-requester-key-0123456789";

/// The run ids of the held calls `key` lists.
async fn listed_runs(app: &TestApp, key: &str) -> Vec<Value> {
    let (status, page) = app
        .request(Method::GET, "/v1/approvals", Some(key), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["run_id"].clone())
        .collect()
}

/// The ids of the grants `key` lists.
async fn listed_grants(app: &TestApp, key: &str) -> Vec<Value> {
    let (status, page) = app
        .request(Method::GET, "/v1/grants", Some(key), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["id"].clone())
        .collect()
}

#[tokio::test]
async fn a_requester_key_lists_only_the_held_calls_and_grants_of_runs_it_may_read() {
    let app = TestApp::builder(refund_asked)
        .gateway(|c| {
            c.api_keys.push(ApiKey {
                key: RHEA_KEY.into(),
                role: Role::Requester,
                principal: "rhea".into(),
                speaks_for: Vec::new(),
            });
        })
        .start()
        .await;
    // Carol's run, started by the key that speaks for her, and rhea's own; both wait.
    let carols = start_with(&app, REQUESTER_KEY, 30, "A-1", Some("carol")).await;
    let rheas = start_with(&app, RHEA_KEY, 30, "B-2", None).await;
    held(&app, &carols).await;
    held(&app, &rheas).await;

    // rhea may not read carol's run, and does not see its held call listed either.
    let (status, body) = app
        .request(
            Method::GET,
            &format!("/v1/runs/{carols}"),
            Some(RHEA_KEY),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(listed_runs(&app, RHEA_KEY).await, [json!(rheas)]);
    // Keys that read every run list both.
    for key in [READER_KEY, REVIEWER_KEY] {
        let mut all = listed_runs(&app, key).await;
        all.sort_by_key(|r| r.as_str().unwrap().to_string());
        let mut both = vec![json!(carols), json!(rheas)];
        both.sort_by_key(|r| r.as_str().unwrap().to_string());
        assert_eq!(all, both, "{key}");
    }

    // A grant made on each run: rhea reads the one made on hers, not the one made on carol's.
    let (status, on_carols) = grant(&app, REVIEWER_KEY, &carols, terms(5)).await;
    assert_eq!(status, StatusCode::CREATED, "{on_carols}");
    let mut on_b = terms(5);
    on_b["condition"] = json!(r#"input.order_id.startsWith("B-")"#);
    let (status, on_rheas) = grant(&app, REVIEWER_KEY, &rheas, on_b).await;
    assert_eq!(status, StatusCode::CREATED, "{on_rheas}");
    let (carols_grant, rheas_grant) = (&on_carols["grant"]["id"], &on_rheas["grant"]["id"]);
    assert_eq!(
        listed_grants(&app, RHEA_KEY).await,
        std::slice::from_ref(rheas_grant)
    );
    assert_eq!(listed_grants(&app, READER_KEY).await.len(), 2);
    let show = |id: &Value| format!("/v1/grants/{}", id.as_str().unwrap());
    let (status, body) = app
        .request(Method::GET, &show(carols_grant), Some(RHEA_KEY), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = app
        .request(Method::GET, &show(rheas_grant), Some(RHEA_KEY), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The key that speaks for carol reads hers.
    let (status, body) = app
        .request(Method::GET, &show(carols_grant), Some(REQUESTER_KEY), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Rhea's grant (not limited to her runs) approves a run of carol's: rhea reads her grant,
    // its use counted, but not which run of carol's it approved.
    let covered = start_with(&app, REQUESTER_KEY, 30, "B-3", Some("carol")).await;
    app.wait_status(&covered, "completed").await;
    let (_, all) = app.get(&show(rheas_grant)).await;
    assert_eq!(all["used_by"][0]["run_id"], json!(covered), "{all}");
    let (status, hers) = app
        .request(Method::GET, &show(rheas_grant), Some(RHEA_KEY), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{hers}");
    assert_eq!(hers["uses"], 1, "{hers}");
    assert_eq!(hers["used_by"], json!([]), "{hers}");
}
