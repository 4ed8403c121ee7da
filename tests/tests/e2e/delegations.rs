//! Delegations, through the API and the decision script: alice hands her approvals to carol;
//! carol decides alice's calls in both their names until the delegation ends; a delegation
//! never lets anyone approve their own request; one person counts once on a call that needs
//! several approvals; and a delegation ended while decisions are in flight decides nothing
//! after its end.

use super::cli::ok;
use super::door::{ask_at, external, until_held};
use super::inbox::{ALICE_KEY, Browser, CAROL_KEY, add_keys};
use countersign_tests::app::{ADMIN_KEY, INTEGRATION_KEY, REQUESTER_KEY, TestApp};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const AGENT: &str = "cover";

pub(super) const AGENT_FILE: &str = r#"name = "cover"

[model]
provider = "external"

[[tools]]
name = "refund"
input_schema = { type = "object", properties = { amount = { type = "number" } }, required = ["amount"] }
[tools.approval]
approvers = ["alice"]

[[tools]]
name = "wire"
input_schema = { type = "object", properties = { amount = { type = "number" } }, required = ["amount"] }
[tools.approval]
approvers = ["alice", "bob"]
quorum = 2
"#;

async fn app() -> TestApp {
    external(AGENT, AGENT_FILE).gateway(add_keys).start().await
}

/// A `tool` call of `amount` asked by rick at the door, once held.
pub(super) async fn held(app: &TestApp, tool: &str, idem: &str, amount: f64) -> Value {
    let ask = json!({"tool": tool, "input": {"amount": amount}, "wait_secs": 0});
    let (status, asked) = ask_at(app, AGENT, REQUESTER_KEY, idem, ask).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{asked}");
    until_held(app, &asked).await
}

/// `person` approves (or, with `reject`, rejects) the held call.
pub(super) async fn decide(
    app: &TestApp,
    person: &str,
    call: &Value,
    action: &str,
) -> (StatusCode, Value) {
    let decision = json!({"call_id": call["call_id"], "digest": call["held"]["digest"],
                          "action": action, "reason": "not this one"});
    app.decide_as(person, call["run_id"].as_str().unwrap(), decision)
        .await
}

/// `person` (through the key that speaks for people) hands `from`'s approvals to `to`.
pub(super) async fn delegate(
    app: &TestApp,
    person: &str,
    from: Option<&str>,
    to: &str,
) -> (StatusCode, Value) {
    let mut body = json!({"to": to, "for": "1d", "reason": "holiday", "by": person});
    if let Some(from) = from {
        body["from"] = json!(from);
    }
    app.request(
        Method::POST,
        "/v1/delegations",
        Some(INTEGRATION_KEY),
        Some(body),
    )
    .await
}

async fn end(app: &TestApp, person: &str, id: &str) -> (StatusCode, Value) {
    let body = json!({"by": person, "reason": "back early"});
    let path = format!("/v1/delegations/{id}/end");
    app.request(Method::POST, &path, Some(INTEGRATION_KEY), Some(body))
        .await
}

/// The decision recorded on the held call.
pub(super) async fn recorded(app: &TestApp, call: &Value) -> Value {
    let path = format!(
        "/v1/runs/{}/calls/{}?wait_secs=0",
        call["run_id"].as_str().unwrap(),
        call["call_id"].as_str().unwrap()
    );
    let (_, state) = app.get(&path).await;
    state["decision"].clone()
}

#[tokio::test]
async fn a_delegate_decides_in_both_names_until_the_delegation_ends() {
    let app = app().await;
    let first = held(&app, "refund", "r-1", 40.0).await;
    let (status, refused) = decide(&app, "carol", &first, "approve").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(refused["error"]["refusal"], "not_approver");

    // carol may not hand over alice's approvals; alice may, and an admin may.
    let (status, answer) = delegate(&app, "carol", Some("alice"), "carol").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let (status, made) = delegate(&app, "alice", None, "carol").await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(
        (
            &made["from"],
            &made["to"],
            &made["status"],
            &made["created_by"]
        ),
        (
            &json!("alice"),
            &json!("carol"),
            &json!("active"),
            &json!("alice")
        )
    );
    let id = made["id"].as_str().unwrap();

    let (status, answer) = decide(&app, "carol", &first, "approve").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let decision = recorded(&app, &first).await;
    assert_eq!(decision["decided_by"], "carol for alice", "{decision}");
    assert_eq!(decision["delegation"], id, "{decision}");
    // The receipt the tool is sent names both too.
    let claims = countersign_tests::receipt_claims(&decision["receipt"]);
    assert_eq!(claims["decided_by"], json!(["carol for alice"]), "{claims}");
    let run = first["run_id"].as_str().unwrap();
    let (_, trail) = app.get(&format!("/v1/runs/{run}/audit")).await;
    let entry = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|element| &element["entry"])
        .find(|e| e["kind"] == "decided")
        .unwrap_or_else(|| panic!("a decided entry: {trail}"));
    assert_eq!(entry["actor"], "carol for alice", "{entry}");
    assert_eq!(entry["detail"]["delegation"]["id"], id, "{entry}");

    // Both people and an admin read it, with the call decided under it; bob does not.
    let path = format!("/v1/delegations/{id}");
    let (status, shown) = app.request(Method::GET, &path, Some(ADMIN_KEY), None).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["used_by"][0]["run_id"], first["run_id"], "{shown}");
    for (person, sees) in [("alice", 1), ("carol", 1), ("bob", 0)] {
        let path = format!("/v1/delegations?person={person}");
        let (_, listed) = app
            .request(Method::GET, &path, Some(INTEGRATION_KEY), None)
            .await;
        assert_eq!(
            listed["delegations"].as_array().unwrap().len(),
            sees,
            "{person}: {listed}"
        );
    }

    // Ended, it decides nothing more: carol is refused, alice decides.
    let (status, answer) = end(&app, "bob", id).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let (status, ended) = end(&app, "alice", id).await;
    assert_eq!(status, StatusCode::OK, "{ended}");
    assert_eq!(ended["status"], "ended");
    assert_eq!(ended["ended"]["by"], "alice");
    let second = held(&app, "refund", "r-2", 40.0).await;
    let (status, refused) = decide(&app, "carol", &second, "approve").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(refused["error"]["refusal"], "not_approver");
    let (status, answer) = decide(&app, "alice", &second, "approve").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test]
async fn a_delegation_never_lets_anyone_approve_their_own_request() {
    let app = app().await;
    // rick asks for the run and holds alice's approvals: he may reject it, not approve it.
    let (status, made) = delegate(&app, "alice", None, "rick").await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let call = held(&app, "refund", "own", 40.0).await;
    let (status, refused) = decide(&app, "rick", &call, "approve").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(refused["error"]["refusal"], "own_request");
    let (status, answer) = decide(&app, "rick", &call, "reject").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(recorded(&app, &call).await["decided_by"], "rick for alice");
    // Nobody delegates to themselves, nor to someone the configuration does not know.
    for to in ["alice", "mallory"] {
        let (status, answer) = delegate(&app, "alice", None, to).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{to}: {answer}");
    }
}

#[tokio::test]
async fn one_person_counts_once_on_a_call_that_needs_several_approvals() {
    let app = app().await;
    let (status, _) = delegate(&app, "alice", None, "carol").await;
    assert_eq!(status, StatusCode::CREATED);
    let wire = held(&app, "wire", "w-1", 900.0).await;
    let (status, answer) = decide(&app, "carol", &wire, "approve").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["decisions"][0]["status"], "approval_recorded",
        "{answer}"
    );
    // alice's approval counts already, through carol.
    let (status, refused) = decide(&app, "alice", &wire, "approve").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(
        refused["error"]["refusal"], "counted_otherwise",
        "{refused}"
    );
    // bob's completes the quorum, which names both.
    let (status, answer) = decide(&app, "bob", &wire, "approve").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        recorded(&app, &wire).await["decided_by"],
        "bob, carol for alice"
    );
}

/// carol decides alice's held refunds while alice ends the delegation, each decision and
/// each end after its own drawn delay: every decision recorded under the delegation took its use before the end
/// (Redis's clock), every other was refused, and nothing was decided under it after the end.
#[tokio::test]
async fn a_delegation_ended_while_decisions_are_in_flight_decides_nothing_after_its_end() {
    let app = app().await;
    let seed = std::env::var("MODEL_CHECK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
    println!("delegation races: seed {seed} (MODEL_CHECK_SEED={seed} plays them again)");
    let mut rng = countersign_tests::model_check::rng::Rng::new(seed);
    for race in 0..4 {
        let (_, made) = delegate(&app, "alice", None, "carol").await;
        let id = made["id"].as_str().unwrap().to_string();
        let mut calls = Vec::new();
        for i in 0..6 {
            calls.push(held(&app, "refund", &format!("race-{race}-{i}"), 10.0).await);
        }
        let pause = std::time::Duration::from_millis(rng.below(40));
        let ending = async {
            tokio::time::sleep(pause).await;
            end(&app, "alice", &id).await
        };
        let delays: Vec<u64> = calls.iter().map(|_| rng.below(40)).collect();
        let deciding = futures::future::join_all(calls.iter().zip(&delays).map(|(c, wait)| {
            let app = &app;
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(*wait)).await;
                decide(app, "carol", c, "approve").await
            }
        }));
        let ((status, ended), answers) = tokio::join!(ending, deciding);
        assert_eq!(status, StatusCode::OK, "{ended}");
        let ended_at = ended["ended"]["at"].as_i64().unwrap();
        let (_, shown) = app
            .request(
                Method::GET,
                &format!("/v1/delegations/{id}"),
                Some(ADMIN_KEY),
                None,
            )
            .await;
        let uses = shown["used_by"].as_array().unwrap();
        let mut decided = 0;
        for (call, (status, answer)) in calls.iter().zip(&answers) {
            match *status {
                StatusCode::OK => {
                    decided += 1;
                    assert_eq!(recorded(&app, call).await["decided_by"], "carol for alice");
                    assert!(
                        uses.iter().any(|u| u["call_id"] == call["call_id"]),
                        "a recorded decision took a use: {shown}"
                    );
                }
                StatusCode::FORBIDDEN => {
                    assert_eq!(answer["error"]["refusal"], "not_approver", "{answer}");
                    assert!(recorded(&app, call).await.is_null());
                }
                other => panic!("{other}: {answer}"),
            }
        }
        assert_eq!(
            uses.len(),
            decided,
            "each use is a recorded decision: {shown}"
        );
        for used in uses {
            assert!(
                used["at"].as_i64().unwrap() <= ended_at,
                "a use after the end: {shown}"
            );
        }
        println!("race {race}: end after {pause:?}, {decided} of 6 decided under the delegation");
        // alice decides what carol could not.
        for (call, (status, _)) in calls.iter().zip(&answers) {
            if *status == StatusCode::FORBIDDEN {
                assert_eq!(
                    decide(&app, "alice", call, "approve").await.0,
                    StatusCode::OK
                );
            }
        }
    }
}

/// The same from the web inbox: alice delegates on the Delegations page, carol finds alice's
/// call in her queue and approves it on its page, then ends the delegation there.
#[tokio::test]
async fn the_inbox_delegates_shows_the_delegator_s_calls_and_ends_it() {
    let app = app().await;
    let call = held(&app, "refund", "inbox", 40.0).await;
    let (run, call_id) = (
        call["run_id"].as_str().unwrap(),
        call["call_id"].as_str().unwrap(),
    );
    let carol = Browser::signed_in(&app, CAROL_KEY).await;
    let queue = carol.get("/inbox").await;
    assert!(
        !queue.html.contains(run),
        "not carol's before: {}",
        queue.html
    );

    let alice = Browser::signed_in(&app, ALICE_KEY).await;
    let page = alice.get("/inbox/delegations").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    let csrf = page.input("csrf");
    let fields = [
        ("csrf", csrf.as_str()),
        ("to", "carol"),
        ("for", "7d"),
        ("reason", "holiday"),
    ];
    let made = alice.post("/inbox/delegations", &fields).await;
    assert_eq!(made.status, StatusCode::SEE_OTHER, "{}", made.html);
    let listed = alice.get(made.location.as_deref().unwrap()).await;
    assert!(listed.html.contains("Delegated: "), "{}", listed.html);
    assert!(listed.html.contains("carol for alice"), "{}", listed.html);
    let bad = [("csrf", csrf.as_str()), ("to", "carol"), ("for", "forever")];
    assert_eq!(
        alice.post("/inbox/delegations", &bad).await.status,
        StatusCode::BAD_REQUEST
    );

    let queue = carol.get("/inbox").await;
    assert!(
        queue.html.contains(run),
        "alice's call in carol's queue: {}",
        queue.html
    );
    let path = format!("/inbox/runs/{run}/calls/{call_id}");
    let request = carol.get(&path).await;
    let (csrf, digest) = (request.input("csrf"), request.input("digest"));
    let done = carol
        .post(
            &path,
            &[("csrf", &csrf), ("digest", &digest), ("action", "approve")],
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.html);
    assert_eq!(recorded(&app, &call).await["decided_by"], "carol for alice");

    let mine = carol.get("/inbox/delegations").await;
    let id = mine
        .html
        .split("data-delegation=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("a delegation listed: {}", mine.html))
        .to_string();
    let ended = carol
        .post(
            &format!("/inbox/delegations/{id}/end"),
            &[("csrf", &mine.input("csrf"))],
        )
        .await;
    assert_eq!(ended.status, StatusCode::SEE_OTHER, "{}", ended.html);
    let (_, shown) = app
        .request(
            Method::GET,
            &format!("/v1/delegations/{id}"),
            Some(ADMIN_KEY),
            None,
        )
        .await;
    assert_eq!(
        (&shown["status"], &shown["ended"]["by"]),
        (&json!("ended"), &json!("carol"))
    );
}

/// The same from a terminal, with alice's key: delegate, list, show, end.
#[tokio::test]
async fn the_command_line_delegates_lists_and_ends() {
    let app = app().await;
    let made = ok(&app, ALICE_KEY, "delegate carol --for 8h --reason holiday").await;
    assert!(
        made.starts_with("carol decides in alice's place until "),
        "{made}"
    );
    let id = made.trim().rsplit(' ').next().unwrap().to_string();
    assert!(id.starts_with("dlg_"), "{made}");
    let listed = ok(&app, CAROL_KEY, "delegations --active").await;
    assert!(
        listed.contains(&id) && listed.contains("active"),
        "{listed}"
    );
    let call = held(&app, "refund", "cli", 40.0).await;
    let (status, _) = decide(&app, "carol", &call, "approve").await;
    assert_eq!(status, StatusCode::OK);
    let shown = ok(&app, ALICE_KEY, &format!("delegations {id}")).await;
    assert!(shown.contains("alice's approvals to carol"), "{shown}");
    assert!(shown.contains(call["run_id"].as_str().unwrap()), "{shown}");
    let ended = ok(&app, ALICE_KEY, &format!("undelegate {id} --reason back")).await;
    assert!(
        ended.contains("no longer decides in alice's place"),
        "{ended}"
    );
    let listed = ok(&app, CAROL_KEY, "delegations --active").await;
    assert!(listed.contains("No delegations."), "{listed}");
}
