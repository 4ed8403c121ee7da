//! The reference model of a run, and the invariants checked against it after each history.
//!
//! The model of each run is built from what the gateway answered the test (decisions recorded
//! or refused, cancels accepted or refused), what the run's audit trail says happened to each
//! call (held with which input, closed by whom: a person, the deadline or a policy change;
//! checked again; executed, with what outcome), the run's final record (the calls of its
//! turns) and the instants the test saw (each model answer made, each tool request received,
//! each answer of the gateway). The checks are the run's promises:
//!
//! 1. Each call is executed at most once: the refund tool, not idempotent, gets at most one
//!    request per idempotency key; every tool request names a call of the run's final record,
//!    in the turn that asked for it, and the call has an `executed` entry in the trail.
//! 2. A held call runs only after a decision that let it (approve or edit, answered 2xx), with
//!    exactly the input approved or the edited one, or when a changed policy released it;
//!    nothing runs that was rejected, expired or closed by a cancel; a free call runs with the
//!    model's input and only if some limit of the history let it through.
//! 3. Nothing starts after an accepted cancel: no tool request for a call of a model answer
//!    made after the cancel was answered 202; and a run whose cancel was accepted ends
//!    `cancelled` (a refused cancel names the status the run ended in).
//! 4. One recorded decision per call, the one a 2xx answer reported.
//! 5. Every refusal is explained by the model (stale digest, decided already, expired, not
//!    waiting, cancelled), and no 5xx but a 503 while a server was restarted.
//! 6. Every run ends, and its audit chain recomputes.
//! 7. A run that ended is named by none of its shard's indexes of waiting: not listed as
//!    paused for the inbox (`awaiting`), and none of its calls in the sets of deadlines and
//!    reminders the sweepers walk.
//! 8. The refund tool's reviewer model, live, decides only inside its bounds: its verdict on
//!    each held call is `outside_envelope` above the envelope and otherwise what it answers
//!    for that run; a call it decided was inside, approved by its live verdict in the trail,
//!    and decided in its name, as an approval. (Its approval then counts for 1 to 4 as a
//!    person's would: the call runs once, with the input held, never after a cancel.)
//!
//! Where the real system may honestly do either of two things, both are allowed: a call
//! started before a crash is reported `unknown` (the refund tool is not idempotent) or has its
//! recorded result; a $150 refund is free or held depending on which limit the worker had
//! loaded; a decision racing an expiry or a policy change may win or lose.

use super::history::{ENVELOPE, reviewer_approves};
use super::observe::{Answer, Asked, Ended, Observations, ToolRequest};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Instant;

/// A broken promise: which invariant (1 to 8), which run, what the test saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: u8,
    pub run: Option<String>,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.run {
            Some(run) => write!(f, "[{}] {run}: {}", self.invariant, self.what),
            None => write!(f, "[{}] {}", self.invariant, self.what),
        }
    }
}

/// What closed a held call, as its trail records it.
#[derive(Clone, Debug, PartialEq)]
enum Closing {
    Person {
        principal: String,
        action: String,
        input: Option<Value>,
    },
    /// The reviewer model, in its name (`model:…`).
    Model {
        principal: String,
        action: String,
    },
    Expired,
    Superseded,
}

impl Closing {
    /// Whether it lets the call run.
    fn lets_run(&self) -> bool {
        match self {
            Closing::Person { action, .. } | Closing::Model { action, .. } => action != "reject",
            Closing::Expired | Closing::Superseded => false,
        }
    }
}

/// One call of a run, as its trail tells it.
#[derive(Clone, Debug, Default)]
struct CallModel {
    /// The input it was held with, if it was held.
    held_input: Option<Value>,
    closings: Vec<Closing>,
    /// A changed policy let it run after it was held.
    released: bool,
    /// A changed policy held it again under a new id, or refused it.
    rechecked: bool,
    /// The outcomes of its `executed` entries.
    executed: Vec<String>,
    /// The reviewer model's verdicts on it: (verdict, mode).
    verdicts: Vec<(String, String)>,
}

impl CallModel {
    fn closing(&self) -> Option<&Closing> {
        self.closings.first()
    }
}

/// One run, as the model has it at the end of the history.
struct RunModel<'a> {
    ended: &'a Ended,
    status: String,
    calls: BTreeMap<String, CallModel>,
    /// Each call the model asked for (by the model's id): its turn (counting from 1) and input.
    asked: HashMap<String, (u32, Value)>,
    /// When the first cancel was answered 202.
    cancel_accepted: Option<Instant>,
    /// When the first cancel was sent.
    cancel_sent: Option<Instant>,
}

impl<'a> RunModel<'a> {
    fn new(ended: &'a Ended, answers: &[Answer]) -> Self {
        let mut calls: BTreeMap<String, CallModel> = BTreeMap::new();
        for entry in entries(&ended.trail) {
            let Some(call_id) = entry["call_id"].as_str() else {
                continue;
            };
            let call = calls.entry(call_id.to_string()).or_default();
            let detail = &entry["detail"];
            match entry["kind"].as_str().unwrap_or_default() {
                "requested" => call.held_input = Some(detail["input"].clone()),
                "decided" => {
                    let principal: String = entry["actor"].as_str().unwrap_or_default().into();
                    let action = detail["action"].as_str().unwrap_or_default().into();
                    call.closings.push(match principal.starts_with("model:") {
                        true => Closing::Model { principal, action },
                        false => Closing::Person {
                            principal,
                            action,
                            input: detail.get("input").filter(|i| !i.is_null()).cloned(),
                        },
                    });
                }
                "reviewer_verdict" => call.verdicts.push((
                    detail["verdict"].as_str().unwrap_or_default().into(),
                    detail["mode"].as_str().unwrap_or_default().into(),
                )),
                "expired" => call.closings.push(Closing::Expired),
                "policy_changed" => match detail["outcome"].as_str() {
                    Some("superseded") => call.closings.push(Closing::Superseded),
                    Some("released") => call.released = true,
                    _ => call.rechecked = true,
                },
                "executed" => call
                    .executed
                    .push(detail["outcome"].as_str().unwrap_or_default().into()),
                _ => {}
            }
        }
        let mut asked = HashMap::new();
        let mut turn = 0;
        for message in ended.record["messages"].as_array().into_iter().flatten() {
            if message["role"] != "assistant" {
                continue;
            }
            turn += 1;
            for block in message["content"].as_array().into_iter().flatten() {
                if block["type"] == "tool_use" {
                    let id = block["id"].as_str().unwrap_or_default().to_string();
                    asked.insert(id, (turn, block["input"].clone()));
                }
            }
        }
        let cancels = answers
            .iter()
            .filter(|a| matches!(a.asked, Asked::Cancel { run } if run == ended.run));
        let cancel_sent = cancels.clone().map(|a| a.sent).min();
        let cancel_accepted = cancels.filter(|a| a.status == 202).map(|a| a.at).min();
        Self {
            ended,
            status: ended.record["status"].as_str().unwrap_or_default().into(),
            calls,
            asked,
            cancel_accepted,
            cancel_sent,
        }
    }

    fn call(&self, call_id: &str) -> Option<&CallModel> {
        self.calls.get(call_id)
    }
}

/// The audit entries of a trail, oldest first.
fn entries(trail: &Value) -> impl Iterator<Item = &Value> {
    trail["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| &e["entry"])
}

/// The model's id of a call: a call held again after a policy change is `<id>.r2`, `.r3`…
fn model_id(call_id: &str) -> &str {
    match call_id.rsplit_once(".r") {
        Some((base, n)) if n.parse::<u32>().is_ok() => base,
        _ => call_id,
    }
}

/// Checks one history's observations; every broken promise found.
pub fn check(obs: &Observations) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut say = |invariant: u8, run: Option<&str>, what: String| {
        found.push(Violation {
            invariant,
            run: run.map(str::to_string),
            what,
        });
    };
    for (run, status) in &obs.unfinished {
        let id = obs.run_ids[*run].as_deref();
        say(6, id, format!("run {run} never ended: {status}"));
    }
    let runs: HashMap<&str, RunModel> = obs
        .ended
        .iter()
        .map(|e| (e.run_id.as_str(), RunModel::new(e, &obs.answers)))
        .collect();
    let model_at: HashMap<&str, Instant> = obs
        .model
        .iter()
        .flat_map(|a| a.call_ids.iter().map(move |id| (id.as_str(), a.at)))
        .collect();

    for run in runs.values() {
        check_end(run, &mut say);
        check_calls(run, obs, &mut say);
        check_unlisted(run, obs, &mut say);
    }
    let mut sent: HashMap<&str, usize> = HashMap::new();
    for request in &obs.tools {
        *sent.entry(request.key.as_str()).or_default() += 1;
    }
    for request in &obs.tools {
        let Some((run_id, turn, call_id)) = request.names() else {
            say(
                1,
                None,
                format!("a tool request with key {:?}", request.key),
            );
            continue;
        };
        let Some(run) = runs.get(run_id) else {
            say(
                1,
                Some(run_id),
                format!(
                    "a request to {} for a run the test did not end",
                    request.path
                ),
            );
            continue;
        };
        if request.path == "/refunds" && sent[request.key.as_str()] > 1 {
            say(
                1,
                Some(run_id),
                format!(
                    "the refund {call_id} (not idempotent) was sent {} times under one key",
                    sent[request.key.as_str()]
                ),
            );
        }
        check_request(
            run,
            request,
            turn,
            call_id,
            model_at.get(model_id(call_id)),
            obs,
            &mut say,
        );
    }
    for answer in &obs.answers {
        check_answer(answer, obs, &runs, &mut say);
    }
    found.dedup();
    found
}

type Say<'s> = dyn FnMut(u8, Option<&str>, String) + 's;

/// 6 and 3: the run ended, its chain recomputes, and a cancel accepted ended it cancelled.
fn check_end(run: &RunModel, say: &mut Say) {
    let id = Some(run.ended.run_id.as_str());
    if !matches!(run.status.as_str(), "completed" | "failed" | "cancelled") {
        say(6, id, format!("the run ended the history {}", run.status));
    }
    let elements = run.ended.trail["entries"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if let Err(at) = countersign_model::audit::verify(&elements) {
        say(6, id, format!("the audit chain breaks at element {at}"));
    }
    if run.ended.trail["verified"] != true {
        say(
            6,
            id,
            "the gateway says the audit chain does not verify".into(),
        );
    }
    if run.cancel_accepted.is_some() && run.status != "cancelled" {
        say(
            3,
            id,
            format!(
                "a cancel was answered 202, and the run ended {}",
                run.status
            ),
        );
    }
}

/// 7: an ended run is in no index of waiting.
fn check_unlisted(run: &RunModel, obs: &Observations, say: &mut Say) {
    if !matches!(run.status.as_str(), "completed" | "failed" | "cancelled") {
        return;
    }
    let id = run.ended.run_id.as_str();
    for (index, member) in &obs.indexed {
        let names = member == id || member.split('|').next() == Some(id);
        if names {
            say(
                7,
                Some(id),
                format!(
                    "the run ended {} and {index} still holds {member:?}",
                    run.status
                ),
            );
        }
    }
}

/// 1, 2 and 4 for each call of the trail.
fn check_calls(run: &RunModel, obs: &Observations, say: &mut Say) {
    let id = Some(run.ended.run_id.as_str());
    let limits = (
        obs.limits.iter().min().copied().unwrap_or_default(),
        obs.limits.iter().max().copied().unwrap_or_default(),
    );
    for (call_id, call) in &run.calls {
        if call.closings.len() > 1 {
            say(
                4,
                id,
                format!(
                    "{call_id} was decided {} times: {:?}",
                    call.closings.len(),
                    call.closings
                ),
            );
        }
        if let Some(Closing::Person {
            principal, action, ..
        }) = call.closing()
        {
            let told = obs.answers.iter().any(|a| {
                (200..300).contains(&a.status)
                    && matches!(&a.asked, Asked::Decide { call_id: c, principal: p, action: x, .. }
                        if c == call_id && p == principal && x == action)
            });
            if !told {
                say(
                    4,
                    id,
                    format!(
                        "{call_id} is recorded as {action} by {principal}, which no 2xx answer said"
                    ),
                );
            }
        }
        if let Some(input) = &call.held_input
            && input["amount"]
                .as_u64()
                .is_some_and(|a| a <= limits.0 as u64)
        {
            say(
                2,
                id,
                format!("{call_id} was held with {input}, under every limit"),
            );
        }
        if call.executed.len() > 1 {
            say(
                1,
                id,
                format!(
                    "{call_id} has {} executed entries: {:?}",
                    call.executed.len(),
                    call.executed
                ),
            );
        }
        for outcome in &call.executed {
            let sent = obs.tools.iter().any(|r| {
                r.names()
                    .is_some_and(|(r, _, c)| r == run.ended.run_id && c == call_id)
            });
            match outcome.as_str() {
                "unknown" if !obs.disrupted => {
                    say(
                        1,
                        id,
                        format!("{call_id} is reported unknown, and no worker died"),
                    );
                }
                "executed" | "approved" | "edited" if !sent => {
                    say(
                        1,
                        id,
                        format!("{call_id} is reported {outcome}, and its tool never got it"),
                    );
                }
                _ => {}
            }
        }
        check_model(run, call_id, call, say);
        let lets_run = call.closing().is_some_and(Closing::lets_run);
        if run.status == "completed"
            && lets_run
            && call.executed.is_empty()
            && !call.rechecked
            && !call.released
        {
            say(
                2,
                id,
                format!("{call_id} was approved and the run completed without running it"),
            );
        }
    }
}

/// 8: the reviewer model's verdicts on `call` and its decision of it, if it decided it.
fn check_model(run: &RunModel, call_id: &str, call: &CallModel, say: &mut Say) {
    let id = Some(run.ended.run_id.as_str());
    let Some(held) = &call.held_input else {
        return;
    };
    let inside = held["amount"]
        .as_f64()
        .is_some_and(|a| a <= f64::from(ENVELOPE));
    let expected = match (inside, reviewer_approves(run.ended.run)) {
        (false, _) => "outside_envelope",
        (true, true) => "approve",
        (true, false) => "ask_person",
    };
    for (verdict, mode) in &call.verdicts {
        if verdict != expected || mode != "live" {
            say(
                8,
                id,
                format!(
                    "the reviewer's verdict on {call_id} ({held}) is {verdict} ({mode}), not {expected} (live)"
                ),
            );
        }
    }
    let Some(Closing::Model { principal, action }) = call.closing() else {
        return;
    };
    let approved = call
        .verdicts
        .iter()
        .any(|(v, m)| v == "approve" && m == "live");
    if action != "approve" || !principal.starts_with("model:fake-reviewer@") || !inside || !approved
    {
        say(
            8,
            id,
            format!(
                "{call_id} ({held}) was decided {action} by {principal}, with verdicts {:?}",
                call.verdicts
            ),
        );
    }
}

/// 1, 2 and 3 for one request a tool received.
fn check_request(
    run: &RunModel,
    request: &ToolRequest,
    turn: u32,
    call_id: &str,
    answered_at: Option<&Instant>,
    obs: &Observations,
    say: &mut Say,
) {
    let id = Some(run.ended.run_id.as_str());
    let body = &request.body;
    match run.asked.get(model_id(call_id)) {
        None => say(
            1,
            id,
            format!(
                "{} got {call_id} ({body}), which is no call of the run's record",
                request.path
            ),
        ),
        Some((asked_turn, _)) if *asked_turn != turn => say(
            1,
            id,
            format!(
                "{call_id} was sent as a call of turn {turn}; the record has it in turn {asked_turn}"
            ),
        ),
        Some(_) => {}
    }
    let call = run.call(call_id);
    if call.is_none_or(|c| c.executed.is_empty()) {
        say(
            1,
            id,
            format!(
                "{call_id} reached {} ({body}) and the trail has no executed entry for it",
                request.path
            ),
        );
    }
    match call.and_then(|c| Some((c, c.held_input.as_ref()?))) {
        Some((call, held)) => {
            let allowed = match call.closing() {
                Some(Closing::Person { action, input, .. }) if action == "edit" => input.clone(),
                Some(Closing::Person { action, .. } | Closing::Model { action, .. })
                    if action == "approve" =>
                {
                    Some(held.clone())
                }
                Some(Closing::Superseded) if call.released => Some(held.clone()),
                _ => None,
            };
            match allowed {
                None => say(
                    2,
                    id,
                    format!(
                        "held call {call_id} ran ({body}) though it was {}",
                        match call.closing() {
                            Some(c) => format!("closed as {c:?}"),
                            None => "never decided".into(),
                        }
                    ),
                ),
                Some(allowed) if &allowed != body => say(
                    2,
                    id,
                    format!(
                        "held call {call_id} ran with {body}, not with {allowed}, what was let run"
                    ),
                ),
                Some(_) => {}
            }
        }
        None => {
            if let Some((_, input)) = run.asked.get(model_id(call_id))
                && input != body
            {
                say(
                    2,
                    id,
                    format!("free call {call_id} ran with {body}, not the model's {input}"),
                );
            }
            let limit = obs.limits.iter().max().copied().unwrap_or_default();
            if body["amount"].as_u64().is_some_and(|a| a > limit as u64) {
                say(
                    2,
                    id,
                    format!("refund {call_id} ({body}) ran unheld, over every limit"),
                );
            }
        }
    }
    if let (Some(cancelled), Some(answered)) = (run.cancel_accepted, answered_at)
        && *answered > cancelled
    {
        say(
            3,
            id,
            format!(
                "{call_id} reached {} {:?} after a cancel was answered 202; the model asked for it {:?} after the 202",
                request.path,
                request.at.saturating_duration_since(cancelled),
                answered.saturating_duration_since(cancelled)
            ),
        );
    }
}

/// 3, 4 and 5 for one answer of the gateway.
fn check_answer(
    answer: &Answer,
    obs: &Observations,
    runs: &HashMap<&str, RunModel>,
    say: &mut Say,
) {
    let run_index = match &answer.asked {
        Asked::Decide { run, .. } | Asked::Cancel { run } => *run,
    };
    let run_id = obs
        .run_ids
        .get(run_index)
        .cloned()
        .flatten()
        .unwrap_or_default();
    let id = Some(run_id.as_str());
    if answer.unavailable > 0 && !obs.restarts {
        say(
            5,
            id,
            format!(
                "{} answers 503 with every server up: {answer:?}",
                answer.unavailable
            ),
        );
    }
    if answer.status >= 500 {
        say(5, id, format!("a {} answer: {answer:?}", answer.status));
        return;
    }
    let Some(run) = runs.get(run_id.as_str()) else {
        return;
    };
    let cancel_before = run.cancel_sent.is_some_and(|sent| sent < answer.at);
    let code = answer.code.as_deref().unwrap_or_default();
    match &answer.asked {
        Asked::Cancel { .. } => match answer.status {
            202 => {}
            409 if code == "finished" && answer.said.contains(&format!("is {}", run.status)) => {}
            _ => say(
                5,
                id,
                format!(
                    "a cancel answered {} {code}: {}; the run ended {}",
                    answer.status, answer.said, run.status
                ),
            ),
        },
        Asked::Decide {
            call_id,
            principal,
            action,
            stale,
            runs_with,
            ..
        } => {
            let closing = run.call(call_id).and_then(CallModel::closing);
            // The recorded decision is this one: same person, same action and, for an edit,
            // the same input (another edit by the same person is another decision).
            let ours = matches!(closing, Some(Closing::Person { principal: p, action: a, input })
                if p == principal && a == action
                    && (*action != "edit" || input.as_ref() == runs_with.as_ref()));
            if (200..300).contains(&answer.status) {
                if *stale {
                    say(
                        5,
                        id,
                        format!(
                            "a decision on {call_id} quoting a stale digest was answered {}",
                            answer.status
                        ),
                    );
                } else if !ours {
                    say(
                        4,
                        id,
                        format!(
                            "{principal}'s {action} of {call_id} was answered {} ({}), and the trail records {closing:?}",
                            answer.status, answer.said
                        ),
                    );
                }
                return;
            }
            // A stale digest never repeats a decision, even one's own.
            let closed_otherwise = closing.is_some() && (!ours || *stale);
            let cancelled = run.status == "cancelled" && cancel_before;
            let explained = match code {
                "run_cancelled" => cancel_before,
                "already_decided" => closed_otherwise,
                // Past its deadline, a call is closed by whichever comes first: the sweep, a
                // policy change, or a cancel (even one sent after this refusal).
                "expired" => {
                    matches!(closing, Some(Closing::Expired | Closing::Superseded))
                        || run.status == "cancelled"
                }
                "not_awaiting_approval" | "not_found" => closed_otherwise || cancelled,
                "stale_digest" => *stale,
                _ => false,
            };
            if !explained {
                say(
                    5,
                    id,
                    format!(
                        "{principal}'s {action} of {call_id}{} was refused {} {code} ({}), which the model does not explain: the call was closed as {closing:?}, the run ended {}",
                        if *stale { " (stale digest)" } else { "" },
                        answer.status,
                        answer.said,
                        run.status
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_check::observe::ModelAnswer;
    use serde_json::json;
    use std::time::Duration;

    const RUN: &str = "run_mc1";

    /// A trail of `entries` (kind, call, actor, detail), chained as the scripts chain them.
    fn trail(entries: &[(&str, &str, &str, Value)]) -> Value {
        let run = countersign_model::run::RunId::parse(RUN).unwrap();
        let mut prev = String::new();
        let elements: Vec<Value> = entries
            .iter()
            .map(|(kind, call, actor, detail)| {
                let mut entry = countersign_model::audit::AuditEntry::new(
                    &run,
                    serde_json::from_value(json!(kind)).unwrap(),
                );
                entry.call_id = (!call.is_empty()).then(|| call.to_string());
                entry.actor = Some(actor.to_string());
                entry.detail = detail.clone();
                let (text, sha) = countersign_model::audit::prepare(&entry);
                let hash = countersign_model::audit::link(&prev, &sha);
                let element = json!({"prev": prev, "hash": hash, "entry": serde_json::from_str::<Value>(&text).unwrap()});
                prev = hash;
                element
            })
            .collect();
        json!({"verified": true, "entries": elements})
    }

    fn refund(amount: u32) -> Value {
        json!({"order_id": "A-0", "amount": amount, "reason": "model check"})
    }

    /// One run: the model asked for a lookup and a $12 refund (free) and a $150 refund, held
    /// and approved by rita; everything ran once; the run completed.
    /// A trail's entries as (kind, call id, actor, detail), to change and make again with
    /// [`trail_of`].
    fn rows(trail: &Value) -> Vec<(String, String, String, Value)> {
        trail["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let e = &e["entry"];
                (
                    e["kind"].as_str().unwrap().into(),
                    e["call_id"].as_str().unwrap_or_default().into(),
                    e["actor"].as_str().unwrap().into(),
                    e["detail"].clone(),
                )
            })
            .collect()
    }

    fn trail_of(rows: &[(String, String, String, Value)]) -> Value {
        let rows: Vec<(&str, &str, &str, Value)> = rows
            .iter()
            .map(|(k, c, a, d)| (k.as_str(), c.as_str(), a.as_str(), d.clone()))
            .collect();
        trail(&rows)
    }

    fn clean() -> (Observations, Instant) {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let record = json!({"status": "completed", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Model check run 0: L R12 R150"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_a", "name": "get_order", "input": {"order_id": "A-0"}},
                {"type": "tool_use", "id": "toolu_b", "name": "issue_refund", "input": refund(12)},
                {"type": "tool_use", "id": "toolu_c", "name": "issue_refund", "input": refund(150)}]},
            {"role": "user", "content": []},
            {"role": "assistant", "content": [{"type": "text", "text": "All done."}]}]});
        let trail = trail(&[
            ("executed", "toolu_a", "w", json!({"outcome": "executed"})),
            ("executed", "toolu_b", "w", json!({"outcome": "executed"})),
            ("requested", "toolu_c", "w", json!({"input": refund(150)})),
            (
                "decided",
                "toolu_c",
                "rita",
                json!({"action": "approve", "input": null}),
            ),
            ("executed", "toolu_c", "w", json!({"outcome": "approved"})),
            ("completed", "", "w", json!({})),
        ]);
        let request = |path: &str, call: &str, body: Value, ms| ToolRequest {
            path: path.into(),
            key: format!("{RUN}:1:{call}"),
            body,
            at: at(ms),
        };
        let obs = Observations {
            run_ids: vec![Some(RUN.into())],
            inputs: vec!["Model check run 0: L R12 R150".into()],
            tools: vec![
                request("/lookup", "toolu_a", json!({"order_id": "A-0"}), 20),
                request("/refunds", "toolu_b", refund(12), 21),
                request("/refunds", "toolu_c", refund(150), 60),
            ],
            model: vec![ModelAnswer {
                call_ids: vec!["toolu_a".into(), "toolu_b".into(), "toolu_c".into()],
                review: false,
                at: at(10),
            }],
            answers: vec![Answer {
                asked: Asked::Decide {
                    run: 0,
                    call_id: "toolu_c".into(),
                    principal: "rita",
                    action: "approve",
                    runs_with: Some(refund(150)),
                    stale: false,
                },
                sent: at(40),
                at: at(50),
                status: 200,
                code: None,
                said: "recorded".into(),
                unavailable: 0,
            }],
            ended: vec![Ended {
                run: 0,
                run_id: RUN.into(),
                record,
                trail,
            }],
            indexed: Vec::new(),
            unfinished: Vec::new(),
            limits: vec![100],
            disrupted: false,
            restarts: false,
        };
        (obs, t0)
    }

    fn invariants(obs: &Observations) -> Vec<u8> {
        let mut found: Vec<u8> = check(obs).iter().map(|v| v.invariant).collect();
        found.dedup();
        found
    }

    #[test]
    fn a_clean_history_keeps_every_promise() {
        let (obs, _) = clean();
        assert_eq!(check(&obs), []);
    }

    #[test]
    fn an_ended_run_still_listed_as_waiting_or_timed_is_caught() {
        for (index, member) in [
            ("awaiting", RUN.to_string()),
            ("deadlines", format!("{RUN}|toolu_c|sha256:ab")),
            ("reminders", format!("{RUN}|toolu_c|sha256:ab")),
        ] {
            let (mut obs, _) = clean();
            obs.indexed.push((index.into(), member));
            assert_eq!(invariants(&obs), [7], "{index}");
        }
        // Another run's entries are not this one's.
        let (mut obs, _) = clean();
        obs.indexed.push(("awaiting".into(), format!("{RUN}0")));
        assert_eq!(check(&obs), []);
    }

    #[test]
    fn a_refund_sent_again_under_its_key_or_under_a_call_the_record_lacks_is_caught() {
        let (mut obs, _) = clean();
        obs.tools.push(obs.tools[1].clone());
        assert_eq!(invariants(&obs), [1]);

        // Hole 1: a takeover asked the model again and refunded under the new id.
        let (mut obs, _) = clean();
        let mut again = obs.tools[1].clone();
        again.key = format!("{RUN}:1:toolu_lost");
        obs.tools.push(again);
        let found = check(&obs);
        assert!(
            found
                .iter()
                .any(|v| v.what.contains("no call of the run's record")),
            "{found:?}"
        );
    }

    #[test]
    fn a_call_run_after_an_accepted_cancel_or_missing_from_the_trail_is_caught() {
        // Hole 2: the cancel was answered before the model answered.
        let (mut obs, t0) = clean();
        obs.answers.push(Answer {
            asked: Asked::Cancel { run: 0 },
            sent: t0,
            at: t0 + Duration::from_millis(5),
            status: 202,
            code: None,
            said: String::new(),
            unavailable: 0,
        });
        obs.ended[0].record["status"] = json!("cancelled");
        assert_eq!(invariants(&obs), [3]);

        // Hole 3: the edited refund ran, and the trail lacks its execution.
        let (mut obs, _) = clean();
        let mut kept = rows(&obs.ended[0].trail);
        kept.truncate(4);
        obs.ended[0].trail = trail_of(&kept);
        let found = check(&obs);
        assert!(
            found.iter().any(|v| v.what.contains("no executed entry")),
            "{found:?}"
        );
    }

    #[test]
    fn a_run_without_approval_or_with_other_input_a_stale_digest_accepted_and_a_broken_chain_are_caught()
     {
        let (mut obs, _) = clean();
        obs.tools[2].body = refund(151);
        assert_eq!(invariants(&obs), [2]);

        let (mut obs, _) = clean();
        obs.answers[0].said = "refused".into();
        obs.answers[0].status = 409;
        obs.answers[0].code = Some("stale_digest".into());
        let found = invariants(&obs);
        assert!(found.contains(&4) && found.contains(&5), "{found:?}");

        let (mut obs, _) = clean();
        obs.ended[0].trail["entries"][1]["entry"]["actor"] = json!("mallory");
        assert_eq!(invariants(&obs), [6]);
    }

    #[test]
    fn another_edit_by_the_same_person_is_another_decision() {
        let (mut obs, t0) = clean();
        let edited = json!({"order_id": "A-0", "amount": 140, "reason": "edited"});
        let mut kept = rows(&obs.ended[0].trail);
        kept[3].3 = json!({"action": "edit", "input": edited});
        obs.ended[0].trail = trail_of(&kept);
        obs.tools[2].body = edited.clone();
        let edit = |amount: u32| Asked::Decide {
            run: 0,
            call_id: "toolu_c".into(),
            principal: "rita",
            action: "edit",
            runs_with: Some(json!({"order_id": "A-0", "amount": amount, "reason": "edited"})),
            stale: false,
        };
        obs.answers[0].asked = edit(140);
        let mut again = obs.answers[0].clone();
        again.asked = edit(90);
        again.status = 409;
        again.code = Some("already_decided".into());
        again.at = t0 + Duration::from_millis(70);
        obs.answers.push(again);
        assert_eq!(check(&obs), []);
        // Had the first edit been answered as recorded with 90, the trail would contradict it.
        obs.answers[0].asked = edit(90);
        assert_eq!(invariants(&obs), [4]);
    }

    /// The clean history with its $150 refund approved by the reviewer model (run 0's
    /// reviewer approves) instead of rita: its verdict, then its decision; no answer says it.
    fn decided_by_the_model(verdict: &str, action: &str) -> Observations {
        let (mut obs, _) = clean();
        let mut kept = rows(&obs.ended[0].trail);
        let verdict_row = (
            "reviewer_verdict".to_string(),
            "toolu_c".to_string(),
            "w".to_string(),
            json!({"verdict": verdict, "mode": "live"}),
        );
        kept.insert(3, verdict_row);
        kept[4].2 = "model:fake-reviewer@v1".into();
        kept[4].3 = json!({"action": action, "input": null});
        obs.ended[0].trail = trail_of(&kept);
        obs.answers.clear();
        obs
    }

    #[test]
    fn a_model_decides_only_what_its_live_verdict_approved_inside_the_envelope() {
        assert_eq!(check(&decided_by_the_model("approve", "approve")), []);
        // A decision its verdict did not make, or not an approval.
        assert_eq!(
            invariants(&decided_by_the_model("ask_person", "approve")),
            [8]
        );
        let rejected = invariants(&decided_by_the_model("approve", "reject"));
        assert!(rejected.contains(&8), "{rejected:?}");
        // Outside the envelope: no verdict but outside_envelope, and no decision.
        let mut obs = decided_by_the_model("approve", "approve");
        let mut kept = rows(&obs.ended[0].trail);
        kept[2].3 = json!({"input": refund(450)});
        obs.ended[0].trail = trail_of(&kept);
        obs.tools[2].body = refund(450);
        assert_eq!(invariants(&obs), [8]);
        // The reviewer leaves odd runs' calls to a person.
        let mut obs = decided_by_the_model("approve", "approve");
        obs.ended[0].run = 1;
        obs.run_ids = vec![None, Some(RUN.into())];
        assert!(invariants(&obs).contains(&8));
    }

    #[test]
    fn a_refusal_the_model_explains_is_no_violation() {
        let (mut obs, t0) = clean();
        let mut late = obs.answers[0].clone();
        late.asked = Asked::Decide {
            run: 0,
            call_id: "toolu_c".into(),
            principal: "alice",
            action: "reject",
            runs_with: None,
            stale: false,
        };
        late.status = 409;
        late.code = Some("already_decided".into());
        late.at = t0 + Duration::from_millis(55);
        obs.answers.push(late.clone());
        late.asked = Asked::Decide {
            run: 0,
            call_id: "toolu_c".into(),
            principal: "rita",
            action: "approve",
            runs_with: None,
            stale: true,
        };
        obs.answers.push(late);
        assert_eq!(check(&obs), []);
    }
}
