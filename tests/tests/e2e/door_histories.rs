//! Generated histories of the execution record of calls released to an external agent: three
//! attempts (processes that asked for the same call) claim it, end it and ask for it again,
//! in random steps of up to three requests sent at once, against a reference model of the
//! record. Each step's answers must be those of the model for some order of its requests, and
//! the record and the audit trail at the end those the model reached: one attempt ever
//! claims a call, only it ends it, and a second end is refused unless it repeats the first.
//!
//! `MODEL_CHECK_SEED` plays a printed seed's histories again.

use super::door::{app, ask, report};
use countersign_tests::app::{PATIENCE, REQUESTER_KEY, TestApp};
use countersign_tests::model_check::rng::Rng;
use countersign_tests::wait_for;
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

const HISTORIES: usize = 10;
const STEPS: u64 = 8;
const ATTEMPTS: [&str; 3] = ["a", "b", "c"];

/// The record of one call, as the model holds it.
#[derive(Clone, Debug, PartialEq)]
enum Record {
    Unclaimed,
    Started(&'static str),
    Ended(&'static str, Ended),
}

/// How an attempt says its call ended.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ended {
    Succeeded(u64),
    Failed,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Start(&'static str),
    End(&'static str, Ended),
    /// The same ask again, with the same idempotency key: the answer shows the record.
    AskAgain,
}

/// What an operation was answered: `Ok`, a refusal's code, or the record an ask showed.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Ok,
    Refused(String),
    Shows(Record),
}

impl Record {
    /// The model's answer to `op`, and the record after it.
    fn apply(&self, op: Op) -> (Answer, Record) {
        let refused = |code: &str| (Answer::Refused(code.into()), self.clone());
        match (op, self) {
            (Op::AskAgain, _) => (Answer::Shows(self.clone()), self.clone()),
            (Op::Start(a), Record::Unclaimed) => (Answer::Ok, Record::Started(a)),
            (Op::Start(a), Record::Started(b) | Record::Ended(b, _)) if a == *b => {
                (Answer::Ok, self.clone())
            }
            (Op::Start(_), _) => refused("execution_taken"),
            (Op::End(..), Record::Unclaimed) => refused("not_started"),
            (Op::End(a, end), Record::Started(b)) if a == *b => (Answer::Ok, Record::Ended(a, end)),
            (Op::End(a, end), Record::Ended(b, was)) if a == *b => match end == *was {
                true => (Answer::Ok, self.clone()),
                false => refused("already_reported"),
            },
            (Op::End(..), _) => refused("execution_taken"),
        }
    }
}

#[tokio::test]
async fn generated_histories_of_claims_and_ends_keep_one_execution_per_call() {
    let seed = std::env::var("MODEL_CHECK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
    println!("door histories: seed {seed} (MODEL_CHECK_SEED={seed} plays them again)");
    let mut rng = Rng::new(seed);
    let app = app().await;
    for history in 0..HISTORIES {
        let key = format!("history-{seed}-{history}");
        let note = json!({"tool": "note_customer", "input": {"customer": "ana", "note": history.to_string()}});
        let (status, call) = ask(&app, REQUESTER_KEY, &key, note.clone()).await;
        assert_eq!(status, StatusCode::OK, "{call}");
        assert_eq!(call["status"], "allowed", "{call}");
        // Every record the answers so far allow (orders of requests sent at once may differ).
        let mut possible = vec![Record::Unclaimed];
        let mut steps = Vec::new();
        for _ in 0..rng.between(3, STEPS) {
            let batch: Vec<Op> = (0..rng.between(1, 3)).map(|_| op(&mut rng)).collect();
            let answers =
                join_all(batch.iter().map(|op| send(&app, &call, &key, &note, *op))).await;
            steps.push((batch.clone(), answers.clone()));
            possible = explained(&possible, &batch, &answers);
            assert!(
                !possible.is_empty(),
                "seed {seed}, history {history}: no order of the steps' requests explains the answers: {steps:#?}"
            );
        }
        let last = send(&app, &call, &key, &note, Op::AskAgain).await;
        let Answer::Shows(record) = last else {
            unreachable!()
        };
        assert!(
            possible.contains(&record),
            "seed {seed}, history {history}: the record is {record:?}, the model allows {possible:?}: {steps:#?}"
        );
        audited_once(&app, &call, &record).await;
    }
}

fn op(rng: &mut Rng) -> Op {
    let attempt = ATTEMPTS[rng.below(ATTEMPTS.len() as u64) as usize];
    match rng.weighted(&[4, 4, 1]) {
        0 => Op::Start(attempt),
        1 if rng.chance(75) => Op::End(attempt, Ended::Succeeded(rng.below(2))),
        1 => Op::End(attempt, Ended::Failed),
        _ => Op::AskAgain,
    }
}

/// Sends `op` for the released `call` (asked under `key` with `note`); how it was answered.
async fn send(app: &TestApp, call: &Value, key: &str, note: &Value, op: Op) -> Answer {
    let body = match op {
        Op::AskAgain => {
            let (status, again) = ask(app, REQUESTER_KEY, key, note.clone()).await;
            assert_eq!(status, StatusCode::OK, "{again}");
            assert_eq!(
                again["run_id"], call["run_id"],
                "the same ask is the same call"
            );
            return Answer::Shows(shown(&again));
        }
        Op::Start(attempt) => json!({"attempt": attempt, "status": "started"}),
        Op::End(attempt, Ended::Succeeded(n)) => {
            json!({"attempt": attempt, "status": "succeeded", "result": {"n": n}})
        }
        Op::End(attempt, Ended::Failed) => {
            json!({"attempt": attempt, "status": "failed", "error": "the CRM is down"})
        }
    };
    let (status, answer) = report(app, REQUESTER_KEY, call, body).await;
    match status {
        StatusCode::OK => Answer::Ok,
        StatusCode::CONFLICT => Answer::Refused(answer["error"]["code"].as_str().unwrap().into()),
        other => panic!("{op:?} was answered {other}: {answer}"),
    }
}

/// The record a call's state shows.
fn shown(state: &Value) -> Record {
    let execution = &state["execution"];
    let attempt = |a: &Value| {
        ATTEMPTS
            .into_iter()
            .find(|known| a == known)
            .unwrap_or_else(|| panic!("an attempt nobody made: {state}"))
    };
    match execution["status"].as_str() {
        None => Record::Unclaimed,
        Some("started") => Record::Started(attempt(&execution["attempt"])),
        Some("succeeded") => Record::Ended(
            attempt(&execution["attempt"]),
            Ended::Succeeded(execution["result"]["n"].as_u64().unwrap()),
        ),
        Some("failed") => Record::Ended(attempt(&execution["attempt"]), Ended::Failed),
        Some(other) => panic!("an execution status {other:?}: {state}"),
    }
}

/// The records that some order of `batch`, played from one of `from`, ends in while giving
/// exactly `answers`.
fn explained(from: &[Record], batch: &[Op], answers: &[Answer]) -> Vec<Record> {
    let mut out = Vec::new();
    for start in from {
        for order in orders(batch.len()) {
            let mut record = start.clone();
            let fits = order.iter().all(|&i| {
                let (answer, next) = record.apply(batch[i]);
                record = next;
                answer == answers[i]
            });
            if fits && !out.contains(&record) {
                out.push(record);
            }
        }
    }
    out
}

/// Every order of `0..n`.
fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for rest in orders(n - 1) {
        for at in 0..=rest.len() {
            let mut order = rest.clone();
            order.insert(at, n - 1);
            all.push(order);
        }
    }
    all
}

/// The trail holds one claim if the call was claimed, and one end if it ended, by the attempt
/// the record names; and its chain holds.
async fn audited_once(app: &TestApp, call: &Value, record: &Record) {
    let run_id = call["run_id"].as_str().unwrap();
    let (claims, ends) = (
        matches!(record, Record::Started(_) | Record::Ended(..)) as usize,
        matches!(record, Record::Ended(..)) as usize,
    );
    let trail = wait_for("the trail to hold the record", PATIENCE, || async {
        let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
        let count = |kind: &str| -> Option<usize> {
            let entries = trail["entries"].as_array()?;
            Some(
                entries
                    .iter()
                    .filter(|e| {
                        e["entry"]["kind"] == kind && e["entry"]["detail"]["executed_by"] == "agent"
                    })
                    .count(),
            )
        };
        (count("started")? == claims && count("executed")? == ends).then_some(trail)
    })
    .await;
    assert_eq!(trail["verified"], true, "{trail}");
}
