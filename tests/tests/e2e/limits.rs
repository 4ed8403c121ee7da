//! Authority limits, through the door of external agents and the decision script: support
//! (carol) approves refunds up to $100, finance (alice, bob, rick) up to $1000, and nobody
//! above that. Each call is held for the people whose limits cover it, the reviewer is told
//! why, and an edit counts only from someone the edited call would be held for.

use super::door::{ask_at, external, until_held};
use countersign_tests::app::{INTEGRATION_KEY, REQUESTER_KEY, TestApp};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const AGENT: &str = "till";

const AGENT_FILE: &str = r#"name = "till"

[model]
provider = "external"

[[tools]]
name = "refund"
input_schema = { type = "object", properties = { amount = { type = "number" } }, required = ["amount"] }
[tools.approval]
reason = "refunds move money"
approvers = ["role:support"]
limits = { "role:support" = "input.amount <= 100.0", "role:finance" = "input.amount <= 1000.0" }
"#;

async fn app() -> TestApp {
    external(AGENT, AGENT_FILE).start().await
}

/// A refund of `amount` asked at the door, once it is held: its state.
async fn held_refund(app: &TestApp, amount: f64) -> Value {
    let ask = json!({"tool": "refund", "input": {"amount": amount}, "wait_secs": 0});
    let key = format!("refund-{amount}");
    let (status, asked) = ask_at(app, AGENT, REQUESTER_KEY, &key, ask).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{asked}");
    until_held(app, &asked).await
}

/// `person`'s `decision` (`approve`, or an edit to `input`) on the held call `held`.
async fn decide(
    app: &TestApp,
    person: &str,
    held: &Value,
    input: Option<f64>,
) -> (StatusCode, Value) {
    let mut decision = json!({
        "call_id": held["call_id"],
        "digest": held["held"]["digest"],
        "action": "approve",
    });
    if let Some(amount) = input {
        decision["action"] = json!("edit");
        decision["input"] = json!({"amount": amount});
        decision["note"] = json!("a smaller refund");
    }
    app.decide_as(person, held["run_id"].as_str().unwrap(), decision)
        .await
}

/// Each amount, who may decide it (the resolved deciders), and what the reviewer is told.
#[tokio::test]
async fn each_call_is_held_for_the_people_whose_limits_cover_it() {
    let app = app().await;
    let rows: [(f64, &[&str], &str); 3] = [
        (50.0, &["carol"], "refunds move money"),
        (
            500.0,
            &["alice", "bob", "rick"],
            "refunds move money. It is above the limit of role:support: input.amount <= 100.0: asked role:finance.",
        ),
        (
            5000.0,
            &[],
            "refunds move money. It is above every approver's limit (role:finance: input.amount <= 1000.0; role:support: input.amount <= 100.0): nobody may approve it, and it expires at its deadline.",
        ),
    ];
    for (amount, deciders, reason) in rows {
        let held = held_refund(&app, amount).await;
        assert_eq!(
            held["held"]["deciders"],
            json!(deciders),
            "${amount}: {held}"
        );
        assert_eq!(held["held"]["reason"], reason, "${amount}");
        // Only the deciders' approvals count: the decision script refuses anyone else.
        for person in ["carol", "alice"] {
            let (status, answer) = decide(&app, person, &held, None).await;
            match deciders.contains(&person) {
                true => assert_eq!(status, StatusCode::OK, "${amount} {person}: {answer}"),
                false => {
                    assert_eq!(
                        status,
                        StatusCode::FORBIDDEN,
                        "${amount} {person}: {answer}"
                    );
                    assert_eq!(answer["error"]["refusal"], "not_approver", "{answer}");
                }
            }
            if status == StatusCode::OK {
                break;
            }
        }
    }
}

#[tokio::test]
async fn an_edit_counts_only_within_its_decider_s_limit() {
    let app = app().await;
    let held = held_refund(&app, 60.0).await;
    // carol may not raise it past her limit, to where finance would decide it.
    let (status, answer) = decide(&app, "carol", &held, Some(150.0)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(answer["error"]["refusal"], "above_limit", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("asked role:finance"), "{message}");
    // Within it, her edit is recorded, and the call is released with the edited input.
    let (status, answer) = decide(&app, "carol", &held, Some(40.0)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let run = held["run_id"].as_str().unwrap();
    let (_, state) = app
        .get(&format!(
            "/v1/runs/{run}/calls/{}",
            held["call_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(state["status"], "edited", "{state}");
    assert_eq!(state["input"], json!({"amount": 40.0}), "{state}");
}

/// A standing grant decides in its maker's name, so it keeps to their limit: carol's grant on
/// refunds up to $500 releases the next $80 refund, but one of $300 waits for finance and the
/// grant is not used on it.
#[tokio::test]
async fn a_standing_grant_releases_only_what_its_maker_s_limit_covers() {
    let app = app().await;
    let first = held_refund(&app, 60.0).await;
    let terms = json!({
        "run_id": first["run_id"], "call_id": first["call_id"], "digest": first["held"]["digest"],
        "condition": "input.amount <= 500.0", "max_uses": 5, "expires_in": "1h",
        "decided_by": "carol",
    });
    let (status, made) = app
        .request(
            Method::POST,
            "/v1/grants",
            Some(INTEGRATION_KEY),
            Some(terms),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let grant = format!("/v1/grants/{}", made["grant"]["id"].as_str().unwrap());

    let ask = json!({"tool": "refund", "input": {"amount": 80.0}, "wait_secs": 20});
    let (status, small) = ask_at(&app, AGENT, REQUESTER_KEY, "refund-80", ask).await;
    assert_eq!(
        (status, &small["status"]),
        (StatusCode::OK, &json!("approved")),
        "{small}"
    );
    let by = small["decision"]["decided_by"].as_str().unwrap();
    assert!(by.starts_with("carol, under grant "), "{small}");
    let (_, state) = app.get(&grant).await;
    let uses = state["uses"].clone();

    let big = held_refund(&app, 300.0).await;
    assert_eq!(
        big["held"]["deciders"],
        json!(["alice", "bob", "rick"]),
        "{big}"
    );
    app.wait_deliveries_settled().await;
    let path = big["links"]["self"].as_str().unwrap();
    let (_, still) = app.get(path).await;
    assert_eq!(still["status"], "pending", "{still}");
    let (_, state) = app.get(&grant).await;
    assert_eq!(state["uses"], uses, "the grant was not used on it: {state}");
}
