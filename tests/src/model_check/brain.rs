//! The fake model's brain for the model check: each run's input carries its script, and every
//! answer asks for the turn's calls under fresh random ids, as a real model's would be: a
//! worker that asks again for a turn it lost gets other ids, and a call it ran under the old
//! ones can no longer be mistaken for one of the new. It is the refund tool's reviewer model
//! too, approving the calls of the runs [`reviewer_approves`].

use super::history::{call_of, parse_input, reviewer_approves};
use super::observe::ModelAnswer;
use countersign_fake_model::{
    Brain, anthropic_text, anthropic_tool_use, first_user_text, reviewed_call, turn, verdict,
};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The answers given, shared with the brain.
pub type AnswerLog = Arc<Mutex<Vec<ModelAnswer>>>;

/// The brain, and the log of its answers.
pub fn brain() -> (Brain, AnswerLog) {
    let log = AnswerLog::default();
    let kept = log.clone();
    let brain = move |request: &Value| {
        // The reviewer model reads the run from the call's order id (`A-RUN`).
        if let Some(call) = reviewed_call(request) {
            let run = call["input"]["order_id"]
                .as_str()
                .and_then(|o| o.strip_prefix("A-"));
            let approves = run
                .and_then(|r| r.parse().ok())
                .is_some_and(reviewer_approves);
            kept.lock().unwrap().push(ModelAnswer {
                call_ids: Vec::new(),
                review: true,
                at: Instant::now(),
            });
            return verdict(approves, "the model check's reviewer");
        }
        let input = first_user_text(request);
        let Some((run, script)) = parse_input(&input) else {
            return anthropic_text("This is not a model check run.");
        };
        let answer_turn = turn(request);
        let calls: Vec<(String, &str, Value)> = script
            .turns
            .get(answer_turn)
            .into_iter()
            .flatten()
            .map(|spec| {
                let (tool, input) = call_of(run, *spec);
                let id = format!("toolu_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
                (id, tool, input)
            })
            .collect();
        let answer = if calls.is_empty() {
            anthropic_text("All done.")
        } else {
            let asked: Vec<(&str, &str, Value)> = calls
                .iter()
                .map(|(id, tool, input)| (id.as_str(), *tool, input.clone()))
                .collect();
            anthropic_tool_use("Working on it.", &asked)
        };
        kept.lock().unwrap().push(ModelAnswer {
            call_ids: calls.into_iter().map(|(id, _, _)| id).collect(),
            review: false,
            at: Instant::now(),
        });
        answer
    };
    (Brain::from(brain), log)
}
