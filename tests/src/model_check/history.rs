//! Histories: the runs of one test (each with the script its fake model plays) and the
//! operations played against the services, generated from a seed. A history prints as JSON,
//! which `MODEL_CHECK_HISTORY` takes back, so a failure found once can be played again.

use super::rng::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The refund limit the agent starts with: refunds above it wait for a person.
pub const INITIAL_LIMIT: u32 = 100;
/// The limit a policy reload switches to (and back from): a $150 refund is held under one and
/// free under the other; $12 is always free and $450 always held.
pub const OTHER_LIMIT: u32 = 200;
/// The refund amounts a script asks for.
pub const AMOUNTS: [u32; 3] = [12, 150, 450];
/// The amounts an edit sets: under, between and over the limits.
pub const EDITED_AMOUNTS: [u32; 4] = [5, 90, 140, 300];
/// The refund tool's reviewer model, live, is put only calls up to this amount (its
/// envelope): a held $150 refund is inside, a $450 one outside.
pub const ENVELOPE: u32 = 300;

/// Whether the reviewer model approves the calls of run `run` (it reads the run from the
/// call's order id): those of even runs; it leaves those of odd runs to a person.
pub fn reviewer_approves(run: usize) -> bool {
    run.is_multiple_of(2)
}

/// One call a script's turn asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallSpec {
    /// `get_order`: free, and idempotent (a lookup).
    Lookup,
    /// `issue_refund` of this many dollars: free up to the limit, held above it; not
    /// idempotent.
    Refund(u32),
}

/// What the fake model answers for one run: a turn of calls per entry, then a final answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Script {
    pub turns: Vec<Vec<CallSpec>>,
}

impl Script {
    /// `L R12 R150 | R450`: calls separated by spaces, turns by `|`.
    pub fn parse(text: &str) -> Option<Self> {
        let turns = text
            .split('|')
            .map(|turn| {
                turn.split_whitespace()
                    .map(|call| match call {
                        "L" => Some(CallSpec::Lookup),
                        _ => Some(CallSpec::Refund(call.strip_prefix('R')?.parse().ok()?)),
                    })
                    .collect::<Option<Vec<_>>>()
            })
            .collect::<Option<Vec<_>>>()?;
        turns
            .iter()
            .all(|t| !t.is_empty())
            .then_some(Self { turns })
    }

    pub fn text(&self) -> String {
        let turns: Vec<String> = self
            .turns
            .iter()
            .map(|turn| {
                let calls: Vec<String> = turn
                    .iter()
                    .map(|c| match c {
                        CallSpec::Lookup => "L".to_string(),
                        CallSpec::Refund(amount) => format!("R{amount}"),
                    })
                    .collect();
                calls.join(" ")
            })
            .collect();
        turns.join(" | ")
    }
}

/// The run's input: its index and its script, which the fake model reads back.
pub fn input_text(run: usize, script: &str) -> String {
    format!("Model check run {run}: {script}")
}

/// The run index and script an input names.
pub fn parse_input(input: &str) -> Option<(usize, Script)> {
    let rest = input.strip_prefix("Model check run ")?;
    let (run, script) = rest.split_once(": ")?;
    Some((run.parse().ok()?, Script::parse(script)?))
}

/// A call's tool and input, as the model asks for it in run `run`.
pub fn call_of(run: usize, spec: CallSpec) -> (&'static str, Value) {
    let order = format!("A-{run}");
    match spec {
        CallSpec::Lookup => ("get_order", json!({"order_id": order})),
        CallSpec::Refund(amount) => (
            "issue_refund",
            json!({"order_id": order, "amount": amount, "reason": "model check"}),
        ),
    }
}

/// The input an edit of a held refund sends.
pub fn edited_input(shown: &Value, amount: u32) -> Value {
    json!({"order_id": shown["order_id"], "amount": amount, "reason": "edited by the model check"})
}

/// Which way a decision comes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Door {
    /// The reviewer's key (rita), at `POST /v1/runs/{id}/decisions`.
    Reviewer,
    /// The integration key deciding as alice, at the same route.
    Integration,
    /// The integration key deciding as bob, at the batch route `POST /v1/decisions`.
    Batch,
}

impl Door {
    pub const ALL: [Door; 3] = [Door::Reviewer, Door::Integration, Door::Batch];

    /// Who the decision is recorded as.
    pub fn principal(self) -> &'static str {
        match self {
            Door::Reviewer => "rita",
            Door::Integration => "alice",
            Door::Batch => "bob",
        }
    }
}

/// What a decision says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Act {
    Approve,
    /// The refund with another amount (a valid input).
    Edit {
        amount: u32,
    },
    Reject,
}

impl Act {
    pub fn name(self) -> &'static str {
        match self {
            Act::Approve => "approve",
            Act::Edit { .. } => "edit",
            Act::Reject => "reject",
        }
    }
}

/// One operation of a history. Runs are named by their index in [`History::runs`]; an
/// operation on a run not started (a shrunk history drops starts) is skipped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Starts the run (its requester: the requester key, as rick).
    Start {
        run: usize,
    },
    /// Decides the `call`-th waiting call (modulo how many) of the run once it pauses, or of
    /// another run that waits while this one does not, through each door at once, each with
    /// its action: one door, or two racing.
    Decide {
        run: usize,
        call: usize,
        by: Vec<(Door, Act)>,
    },
    /// Like `Decide`, once, as the reviewer, approving with a digest that is not the call's.
    Stale {
        run: usize,
        call: usize,
    },
    /// The requester cancels the run: at once, or once a worker is driving it (`running`).
    Cancel {
        run: usize,
        running: bool,
    },
    /// Lets time pass, so deadlines expire and calls finish.
    Wait {
        ms: u64,
    },
    /// Rewrites the agent file with this refund limit; both services load it.
    Reload {
        limit: u32,
    },
    /// SIGKILLs a worker process, and starts another: the worker sending a tool request at
    /// that moment when `in_flight` (waiting a while for one), else worker `worker`; with
    /// `after_verdict`, worker `worker` as soon as the reviewer model has answered about a
    /// held call (between its verdict and the pause that saves it, if that worker asked).
    Kill {
        worker: usize,
        in_flight: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        after_verdict: bool,
    },
    RestartNats,
    RestartRedis,
}

/// The operations' weights, in the order [`generate`] draws them.
pub const WEIGHTS: [(&str, u64); 9] = [
    ("start", 40),
    ("decide", 30),
    ("stale", 4),
    ("cancel", 7),
    ("wait", 8),
    ("reload", 4),
    ("kill", 8),
    ("restart_nats", 2),
    ("restart_redis", 2),
];

/// How big the histories are.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub runs: (u64, u64),
    pub ops: (u64, u64),
}

/// One history: its seed (for the record), its runs' scripts and its operations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub seed: u64,
    /// Each run's script, as [`Script::text`] writes it.
    pub runs: Vec<String>,
    pub ops: Vec<Op>,
}

impl History {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a history serializes")
    }

    pub fn from_json(text: &str) -> Result<Self, String> {
        let history: Self = serde_json::from_str(text).map_err(|e| e.to_string())?;
        match history.runs.iter().find(|s| Script::parse(s).is_none()) {
            Some(bad) => Err(format!("run script {bad:?} does not parse")),
            None => Ok(history),
        }
    }

    /// Every refund limit the agent has during the history.
    pub fn limits(&self) -> Vec<u32> {
        let mut limits = vec![INITIAL_LIMIT];
        limits.extend(self.ops.iter().filter_map(|op| match op {
            Op::Reload { limit } => Some(*limit),
            _ => None,
        }));
        limits
    }

    /// Whether a worker may die mid-step: killed, or its Redis or NATS taken away.
    pub fn disrupted(&self) -> bool {
        self.ops
            .iter()
            .any(|op| matches!(op, Op::Kill { .. } | Op::RestartNats | Op::RestartRedis))
    }

    /// Whether a server the gateway needs goes away (then a 503 is an honest answer).
    pub fn restarts(&self) -> bool {
        self.ops
            .iter()
            .any(|op| matches!(op, Op::RestartNats | Op::RestartRedis))
    }
}

/// A history drawn from `seed`.
pub fn generate(seed: u64, size: Size) -> History {
    let mut rng = Rng::new(seed);
    let run_count = rng.between(size.runs.0, size.runs.1) as usize;
    let runs = (0..run_count).map(|_| script(&mut rng).text()).collect();
    let op_count = rng.between(size.ops.0, size.ops.1) as usize;
    let mut ops = vec![Op::Start { run: 0 }];
    let mut started = 1;
    let mut limit = INITIAL_LIMIT;
    while ops.len() < op_count {
        let mut weights: Vec<u64> = WEIGHTS.iter().map(|(_, w)| *w).collect();
        if started == run_count {
            weights[0] = 0;
        }
        let run = rng.below(started as u64) as usize;
        let op = match WEIGHTS[rng.weighted(&weights)].0 {
            "start" => {
                started += 1;
                Op::Start { run: started - 1 }
            }
            "decide" => {
                let first = Door::ALL[rng.below(3) as usize];
                let mut by = vec![(first, act(&mut rng))];
                if rng.chance(40) {
                    let others: Vec<Door> = Door::ALL.into_iter().filter(|d| *d != first).collect();
                    by.push((others[rng.below(2) as usize], act(&mut rng)));
                }
                Op::Decide {
                    run,
                    call: rng.below(3) as usize,
                    by,
                }
            }
            "stale" => Op::Stale {
                run,
                call: rng.below(3) as usize,
            },
            "cancel" => Op::Cancel {
                run,
                running: rng.chance(50),
            },
            "wait" => Op::Wait {
                ms: rng.between(200, 3500),
            },
            "reload" => {
                limit = if limit == INITIAL_LIMIT {
                    OTHER_LIMIT
                } else {
                    INITIAL_LIMIT
                };
                Op::Reload { limit }
            }
            "kill" => {
                let worker = rng.below(2) as usize;
                match rng.weighted(&[45, 30, 25]) {
                    0 => Op::Kill {
                        worker,
                        in_flight: true,
                        after_verdict: false,
                    },
                    1 => Op::Kill {
                        worker,
                        in_flight: false,
                        after_verdict: true,
                    },
                    _ => Op::Kill {
                        worker,
                        in_flight: false,
                        after_verdict: false,
                    },
                }
            }
            "restart_nats" => Op::RestartNats,
            _ => Op::RestartRedis,
        };
        ops.push(op);
    }
    ops.extend((started..run_count).map(|run| Op::Start { run }));
    History { seed, runs, ops }
}

/// A run's script: one or two turns of one to three calls.
fn script(rng: &mut Rng) -> Script {
    let turns = (0..rng.between(1, 2))
        .map(|_| {
            (0..rng.between(1, 3))
                .map(|_| match rng.weighted(&[2, 3, 3, 3]) {
                    0 => CallSpec::Lookup,
                    i => CallSpec::Refund(AMOUNTS[i - 1]),
                })
                .collect()
        })
        .collect();
    Script { turns }
}

fn act(rng: &mut Rng) -> Act {
    match rng.weighted(&[45, 25, 30]) {
        0 => Act::Approve,
        1 => Act::Edit {
            amount: EDITED_AMOUNTS[rng.below(EDITED_AMOUNTS.len() as u64) as usize],
        },
        _ => Act::Reject,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: Size = Size {
        runs: (3, 6),
        ops: (10, 30),
    };

    #[test]
    fn a_seed_makes_the_same_history_and_its_json_plays_it_back() {
        let history = generate(42, SIZE);
        assert_eq!(history, generate(42, SIZE));
        assert_ne!(history, generate(43, SIZE));
        assert_eq!(History::from_json(&history.to_json()).unwrap(), history);
    }

    #[test]
    fn every_run_is_started_once_and_operations_name_started_runs() {
        for seed in 0..200 {
            let history = generate(seed, SIZE);
            let mut started = Vec::new();
            for op in &history.ops {
                match op {
                    Op::Start { run } => {
                        assert!(!started.contains(run), "seed {seed}: {op:?} twice");
                        started.push(*run);
                    }
                    Op::Decide { run, by, .. } => {
                        assert!(started.contains(run), "seed {seed}: {op:?}");
                        assert!(by.len() == 1 || by[0].0 != by[1].0, "two doors race");
                    }
                    Op::Stale { run, .. } | Op::Cancel { run, .. } => {
                        assert!(started.contains(run), "seed {seed}: {op:?}");
                    }
                    _ => {}
                }
            }
            started.sort();
            assert_eq!(started, (0..history.runs.len()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_script_reads_back_from_its_run_s_input() {
        let script = Script::parse("L R12 R150 | R450").unwrap();
        assert_eq!(script.turns.len(), 2);
        assert_eq!(script.turns[1], [CallSpec::Refund(450)]);
        let input = input_text(3, &script.text());
        assert_eq!(parse_input(&input), Some((3, script)));
        assert_eq!(Script::parse("L | "), None);
        assert_eq!(Script::parse("X1"), None);
        assert!(History::from_json(r#"{"seed":1,"runs":["Q"],"ops":[]}"#).is_err());
    }
}
