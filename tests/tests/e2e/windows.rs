//! Windows, through the door of external agents: a kiosk may refund a customer up to $100 a
//! day without anyone (`when = "window.daily > 100.0"`, the day's refunds to that customer
//! with this one). Calls asked at once race for the window's room; a held call reserves its
//! share until it is decided, and gives it back when it does not run.

use super::door::{ask_at, cancelled_by_requester, external, look};
use countersign_tests::app::{PATIENCE, REQUESTER_KEY, TestApp};
use countersign_tests::wait_for;
use reqwest::StatusCode;
use serde_json::{Value, json};

const AGENT: &str = "kiosk";

pub(super) const AGENT_FILE: &str = r#"name = "kiosk"

[model]
provider = "external"

[[tools]]
name = "refund"
input_schema = { type = "object", properties = { customer = { type = "string" }, amount = { type = "number" } }, required = ["customer", "amount"] }
[tools.approval]
when = "window.daily > 100.0"
reason = "refunds past $100 a day to one customer"
[tools.approval.windows.daily]
sum = "input.amount"
over = "24h"
by = "input.customer"
"#;

async fn app() -> TestApp {
    external(AGENT, AGENT_FILE).start().await
}

/// A refund of `amount` to `customer` asked at the door (`idem` its idempotency key), once
/// its policy has sorted it: let through (`allowed`) or held (`pending`).
pub(super) async fn refund(app: &TestApp, idem: &str, customer: &str, amount: f64) -> Value {
    let ask = json!({"tool": "refund", "input": {"customer": customer, "amount": amount}, "wait_secs": 0});
    let (status, asked) = ask_at(app, AGENT, REQUESTER_KEY, idem, ask).await;
    assert!(status.is_success(), "{status} {asked}");
    settled(app, &asked, &["allowed", "pending"]).await
}

/// The call's state once its status is one of `statuses`.
async fn settled(app: &TestApp, asked: &Value, statuses: &[&str]) -> Value {
    wait_for("the call sorted", PATIENCE, || async {
        let (_, state) = look(app, REQUESTER_KEY, asked, 1).await;
        statuses
            .contains(&state["status"].as_str().unwrap_or(""))
            .then_some(state)
    })
    .await
}

/// The total the reviewer of a held call of c-1's is told the window had before it.
fn total_before(held: &Value) -> f64 {
    total_before_of(held, "c-1")
}

/// The total the reviewer of a held call of `customer`'s is told the window had before it.
fn total_before_of(held: &Value, customer: &str) -> f64 {
    let reason = held["held"]["reason"].as_str().unwrap();
    let told = reason
        .split(&format!("window daily (24h, {customer}): "))
        .nth(1)
        .unwrap_or_else(|| panic!("the reason names the window: {reason}"));
    told.split(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn calls_racing_for_a_window_let_through_exactly_what_fits_and_a_rejection_gives_back() {
    let app = app().await;
    // Eight refunds of $30 to one customer at once: three fit in $100, five wait.
    let keys: Vec<String> = (0..8).map(|i| format!("race-{i}")).collect();
    let asked =
        futures::future::join_all(keys.iter().map(|key| refund(&app, key, "c-1", 30.0))).await;
    let (allowed, held): (Vec<&Value>, Vec<&Value>) =
        asked.iter().partition(|s| s["status"] == "allowed");
    assert_eq!((allowed.len(), held.len()), (3, 5), "{asked:#?}");
    // Each held call was told the total before it, the three let through at least, and each
    // later one reserved its share: five distinct totals from 90 up.
    let mut totals: Vec<f64> = held.iter().map(|h| total_before(h)).collect();
    totals.sort_by(f64::total_cmp);
    assert_eq!(totals, [90.0, 120.0, 150.0, 180.0, 210.0], "{held:#?}");
    for h in &held {
        let reason = h["held"]["reason"].as_str().unwrap();
        assert!(
            reason
                .starts_with("refunds past $100 a day to one customer. window daily (24h, c-1): "),
            "{reason}"
        );
        assert!(reason.ends_with("before this call's 30"), "{reason}");
    }
    // Another customer has a window of their own.
    let other = refund(&app, "other", "c-2", 30.0).await;
    assert_eq!(other["status"], "allowed", "{other}");

    // A $10 refund now waits: the five held calls reserve their shares.
    let small = refund(&app, "small-1", "c-1", 10.0).await;
    assert_eq!(small["status"], "pending", "{small}");
    assert_eq!(total_before(&small), 240.0, "{small}");
    // Rejected, none of them runs, and each gives its share back.
    for h in held.iter().copied().chain([&small]) {
        let decision = json!({"call_id": h["call_id"], "digest": h["held"]["digest"],
                              "action": "reject", "reason": "not today"});
        let (status, answer) = app
            .decide_as("alice", h["run_id"].as_str().unwrap(), decision)
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        settled(&app, h, &["rejected"]).await;
    }
    // $90 ran today: a $10 refund fits, and then a $1 one does not.
    let ten = refund(&app, "small-2", "c-1", 10.0).await;
    assert_eq!(ten["status"], "allowed", "{ten}");
    let one = refund(&app, "small-3", "c-1", 1.0).await;
    assert_eq!(one["status"], "pending", "{one}");
    assert_eq!(total_before(&one), 100.0, "{one}");
}

#[tokio::test]
async fn an_approved_call_counts_with_the_input_it_ran_with() {
    let app = app().await;
    let big = refund(&app, "big", "c-1", 150.0).await;
    assert_eq!(big["status"], "pending", "{big}");
    assert_eq!(total_before(&big), 0.0);
    // Edited down to $60 and approved, it counts $60.
    let decision = json!({"call_id": big["call_id"], "digest": big["held"]["digest"],
                          "action": "edit", "input": {"customer": "c-1", "amount": 60.0},
                          "note": "what the receipt shows"});
    let (status, answer) = app
        .decide_as("alice", big["run_id"].as_str().unwrap(), decision)
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let edited = settled(&app, &big, &["edited"]).await;
    // Its receipt names the window as the reviewer was shown it.
    let path = format!(
        "/v1/runs/{}/calls/{}?wait_secs=0",
        big["run_id"].as_str().unwrap(),
        big["call_id"].as_str().unwrap()
    );
    let (_, state) = app.get(&path).await;
    let claims = countersign_tests::receipt_claims(&state["decision"]["receipt"]);
    assert_eq!(
        claims["windows"],
        json!([{"name": "daily", "key": "c-1", "over": "24h", "before": 0.0, "amount": 150.0}]),
        "{edited}"
    );
    let fits = refund(&app, "fits", "c-1", 40.0).await;
    assert_eq!(fits["status"], "allowed", "{fits}");
    let over = refund(&app, "over", "c-1", 0.5).await;
    assert_eq!(over["status"], "pending", "{over}");
    assert_eq!(total_before(&over), 100.0, "{over}");
}

#[tokio::test]
async fn a_share_the_policy_cannot_read_holds_the_call() {
    let app = app().await;
    let negative = refund(&app, "negative", "c-1", -500.0).await;
    assert_eq!(negative["status"], "pending", "{negative}");
    let reason = negative["held"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("could not read the call's window"),
        "{reason}"
    );
    // It added nothing: $100 still fits.
    let fits = refund(&app, "fits", "c-1", 100.0).await;
    assert_eq!(fits["status"], "allowed", "{fits}");
}

#[tokio::test]
async fn a_held_call_whose_run_is_cancelled_gives_its_share_back() {
    let app = app().await;
    let big = refund(&app, "big", "c-1", 150.0).await;
    assert_eq!(big["status"], "pending", "{big}");
    let run_id = big["run_id"].as_str().unwrap();
    cancelled_by_requester(&app, run_id).await;
    // Once a worker has ended the run (the cancel alone does not give shares back).
    wait_for("the run ended", PATIENCE, || async {
        let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
        (run["status"] == "cancelled").then_some(())
    })
    .await;
    let fits = refund(&app, "fits", "c-1", 100.0).await;
    assert_eq!(fits["status"], "allowed", "{fits}");
}

/// What became of one generated refund.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    /// Let through with nobody asked.
    Free,
    /// Held, then approved: it ran.
    Approved,
    /// Held, then rejected, or its run cancelled: it did not run.
    Refused,
    /// Held, and left waiting.
    Waiting,
}

/// Generated histories (seeded, `MODEL_CHECK_SEED` replays): four lanes at once, each asking
/// six refunds of $5 to $60 to one of two customers and, for each one held, approving it,
/// rejecting it, cancelling its run or leaving it waiting. Checked against a reference model:
/// what ran without anyone never adds up past a customer's $100 (each free call's total
/// counts every free call before it, and those are never given back), and the window's total
/// at the end is exactly what ran or still waits, nothing refused left in it.
#[tokio::test]
async fn generated_histories_keep_free_calls_within_the_window_and_its_total_exact() {
    let seed = std::env::var("MODEL_CHECK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
    println!("window histories: seed {seed} (MODEL_CHECK_SEED={seed} plays them again)");
    let mut rng = countersign_tests::model_check::rng::Rng::new(seed);
    // Each lane's steps: (customer, amount, what is done if it is held).
    let lanes: Vec<Vec<(&str, u64, u64)>> = (0..4)
        .map(|_| {
            (0..6)
                .map(|_| {
                    let customer = ["c-1", "c-2"][rng.below(2) as usize];
                    (customer, 5 + rng.below(56), rng.below(4))
                })
                .collect()
        })
        .collect();
    let app = app().await;
    let played = futures::future::join_all(lanes.iter().enumerate().map(|(lane, steps)| {
        let app = &app;
        async move {
            let mut fates = Vec::new();
            for (step, &(customer, amount, action)) in steps.iter().enumerate() {
                let key = format!("lane-{lane}-{step}");
                let sorted = refund(app, &key, customer, amount as f64).await;
                let fate = match (sorted["status"].as_str(), action) {
                    (Some("allowed"), _) => Fate::Free,
                    (_, 0) => decided(app, &sorted, "approve").await,
                    (_, 1) => decided(app, &sorted, "reject").await,
                    (_, 2) => {
                        let run = sorted["run_id"].as_str().unwrap();
                        cancelled_by_requester(app, run).await;
                        app.wait_status(run, "cancelled").await;
                        Fate::Refused
                    }
                    _ => Fate::Waiting,
                };
                fates.push((customer, amount, fate));
            }
            fates
        }
    }))
    .await;
    for customer in ["c-1", "c-2"] {
        let mine: Vec<(u64, Fate)> = played
            .iter()
            .flatten()
            .filter(|(c, _, _)| *c == customer)
            .map(|(_, amount, fate)| (*amount, *fate))
            .collect();
        let sum = |keep: &[Fate]| -> u64 {
            mine.iter()
                .filter(|(_, f)| keep.contains(f))
                .map(|(a, _)| a)
                .sum()
        };
        let free = sum(&[Fate::Free]);
        assert!(
            free <= 100,
            "{customer}: ${free} ran with nobody asked: {mine:?}"
        );
        // A refund too large for any window is held and told the total before it.
        let probe = refund(&app, &format!("probe-{customer}"), customer, 1000.0).await;
        assert_eq!(probe["status"], "pending", "{probe}");
        let counted = sum(&[Fate::Free, Fate::Approved, Fate::Waiting]);
        assert_eq!(
            total_before_of(&probe, customer),
            counted as f64,
            "{customer}: {mine:?}"
        );
        println!("{customer}: {mine:?}: ${free} free, ${counted} counted");
    }
}

/// The held call `sorted` decided `action` by alice, once its run has taken the decision.
async fn decided(app: &TestApp, sorted: &Value, action: &str) -> Fate {
    let mut decision = json!({"call_id": sorted["call_id"], "digest": sorted["held"]["digest"],
                              "action": action});
    if action == "reject" {
        decision["reason"] = json!("not today");
    }
    let run = sorted["run_id"].as_str().unwrap();
    let (status, answer) = app.decide_as("alice", run, decision).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    match action {
        "approve" => {
            settled(app, sorted, &["approved"]).await;
            Fate::Approved
        }
        _ => {
            settled(app, sorted, &["rejected"]).await;
            Fate::Refused
        }
    }
}
