//! Replaying recorded calls against a candidate policy: what a change of an agent's file
//! would have done to the calls it made, and would do to the calls waiting now, before it
//! ships. Each call is sorted by the live agent's policies and by the candidate's, exactly
//! as a worker sorts a call; nothing is written.

use crate::agent::{Agent, ToolDef};
use crate::limits;
use crate::policy::{Gate, Policy, PolicyError};
use crate::run::HeldCall;
use crate::window::{self, Facts, Share};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// How a report names the approvers of a call above every authority limit.
const NOBODY: &str = "nobody (above every limit)";

/// A tool call a run made, as the model asked for it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The run that made the call.
    pub run_id: String,
    /// The call's id in its run.
    pub call_id: String,
    /// The tool called.
    pub tool: String,
    /// The arguments the model gave.
    pub input: Value,
    /// The run's metadata, which policies may read.
    pub metadata: Value,
    /// Who requested the run ("" if nobody is named), which a window may count by.
    pub requester: String,
    /// When it ran, or was asked for if it did not (ms): windows count calls in this order.
    pub at: i64,
    /// Whether it ran (at once, approved or edited): a call a side holds counts in that
    /// side's windows only if a person let it run.
    pub ran: bool,
}

/// A call waiting for a person now.
#[derive(Clone, Debug)]
pub struct Waiting {
    /// The run paused on the call.
    pub run_id: String,
    /// The call as it was held, under the live policy.
    pub held: HeldCall,
    /// The run's metadata, which policies may read.
    pub metadata: Value,
    /// Who requested the run ("" if nobody is named).
    pub requester: String,
}

/// How many calls of one tool each kind of difference took.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCounts {
    /// Calls of the tool replayed.
    pub calls: usize,
    /// Run at once live, held by the candidate.
    pub newly_held: usize,
    /// Held live, run at once by the candidate.
    pub newly_released: usize,
    /// Held by both, for other approvers or another quorum.
    pub other_reviewers: usize,
    /// Refused by the candidate (its tool gone, or the input does not fit its schema) and
    /// not live.
    pub refused: usize,
    /// Sorted alike by both policies.
    pub unchanged: usize,
}

/// One call of a kind, to look at.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Example {
    /// The run that made the call.
    pub run_id: String,
    /// The call's id in its run.
    pub call_id: String,
    /// The tool called.
    pub tool: String,
    /// The arguments the model gave.
    pub input: Value,
}

impl Example {
    /// The recorded `call`, to look at.
    pub fn of(call: &Recorded) -> Self {
        Self {
            run_id: call.run_id.clone(),
            call_id: call.call_id.clone(),
            tool: call.tool.clone(),
            input: call.input.clone(),
        }
    }
}

/// A waiting call named.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallRef {
    /// The run paused on the call.
    pub run_id: String,
    /// The call's id in its run.
    pub call_id: String,
    /// The tool called.
    pub tool: String,
}

/// What the candidate would do to the calls waiting now, were it loaded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitingReport {
    /// It would let them run.
    pub released: Vec<CallRef>,
    /// Its version differs and it still holds them: they would be asked about again.
    pub reheld: Vec<CallRef>,
    /// Their tool is gone or their input does not fit: the model would be told.
    pub refused: Vec<CallRef>,
    /// How many the candidate would leave as they are.
    pub unchanged: usize,
}

/// The report of a replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The agent replayed.
    pub agent: String,
    /// Recorded calls replayed, of every tool.
    pub calls: usize,
    /// The counts of each tool, by tool name.
    pub tools: BTreeMap<String, ToolCounts>,
    /// Approvals asked for per day, by approver group (`anyone` when the policy names
    /// nobody): each held call counts its quorum, over the window's days.
    pub approvals_per_day: Forecast,
    /// Up to [`EXAMPLES`] calls of each kind of difference.
    pub examples: BTreeMap<String, Vec<Example>>,
    /// What the candidate would do to the calls waiting now.
    pub waiting: WaitingReport,
}

/// Approvals asked for per day under each policy, by approver group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Forecast {
    /// Under the live policies.
    pub live: BTreeMap<String, f64>,
    /// Under the candidate's.
    pub candidate: BTreeMap<String, f64>,
}

/// How many examples of each kind a report keeps.
pub const EXAMPLES: usize = 3;

/// How one side sorted a call.
#[derive(Debug, PartialEq)]
enum Sorted {
    Run,
    /// Held: who is asked and how many of them must approve, at each stage in order (one
    /// without stages).
    Hold(Vec<(Vec<String>, u32)>),
    /// Unknown tool, or an input its schema refuses.
    Refused,
}

/// An agent with its policies compiled, and its windows' shares as it would have counted them.
struct Side<'a> {
    agent: &'a Agent,
    policies: HashMap<String, Policy>,
    tally: Tally,
}

/// Windows' shares as one side counts them: per window and key, when and how much.
#[derive(Default)]
struct Tally(HashMap<String, Vec<(i64, f64)>>);

impl Tally {
    /// The total of `share`'s window at `at`.
    fn before(&self, share: &Share, at: i64) -> f64 {
        self.0.get(&share.id).map_or(0.0, |counted| {
            counted
                .iter()
                .filter(|(t, _)| *t <= at && *t > at - share.over_ms)
                .map(|(_, amount)| amount)
                .sum()
        })
    }

    fn count(&mut self, shares: &[Share], at: i64) {
        for share in shares {
            self.0
                .entry(share.id.clone())
                .or_default()
                .push((at, share.amount));
        }
    }
}

impl<'a> Side<'a> {
    fn new(agent: &'a Agent) -> Result<Self, PolicyError> {
        let env = Arc::new(cel::Env::stdlib());
        let mut policies = HashMap::new();
        for tool in &agent.def.tools {
            let policy = Policy::compile(env.clone(), &tool.name, &tool.approval)?;
            policies.insert(tool.name.clone(), policy);
        }
        Ok(Self {
            agent,
            policies,
            tally: Tally::default(),
        })
    }

    /// As [`Side::sort`], counting the call's shares in this side's windows if this side
    /// runs it at once, or holds it and a person let it run (`ran`).
    fn sorted(&mut self, tool: &str, facts: &Facts<'_>, at: i64, ran: bool) -> Sorted {
        let (sorted, shares) = self.sort(tool, facts, at);
        let runs = match sorted {
            Sorted::Run => true,
            Sorted::Hold(_) => ran,
            Sorted::Refused => false,
        };
        if runs {
            self.tally.count(&shares, at);
        }
        sorted
    }

    /// How this side sorts a call made at `at` (`facts`: its input, its run's metadata and
    /// requester), and its shares of the policy's windows, their totals as this side counted
    /// the calls before it.
    fn sort(&self, tool: &str, facts: &Facts<'_>, at: i64) -> (Sorted, Vec<Share>) {
        let Some(def) = self.agent.tool(tool) else {
            return (Sorted::Refused, Vec::new());
        };
        if self.agent.validate_input(tool, facts.input).is_err() {
            return (Sorted::Refused, Vec::new());
        }
        let policy = &self.policies[tool];
        let (gate, shares) = if policy.has_windows() {
            match policy.shares(&self.agent.def.name, facts) {
                Ok(mut shares) => {
                    for share in &mut shares {
                        share.before = self.tally.before(share, at);
                    }
                    let totals = window::totals(&shares);
                    (
                        policy.gate_with(facts.input, facts.metadata, &totals),
                        shares,
                    )
                }
                Err(why) => (policy.unreadable(&why), Vec::new()),
            }
        } else {
            (policy.gate(facts.input, facts.metadata), Vec::new())
        };
        let input = facts.input;
        let sorted = match gate {
            Gate::Run => Sorted::Run,
            Gate::Ask { .. } => {
                let reviewers = def.reviewers();
                // Who the authority limits leave to decide it, as a worker holds it.
                let routed = def
                    .approval
                    .limits()
                    .and_then(|limits| limits::route(limits, &reviewers, input));
                let approvers = match routed {
                    Some(routed) if routed.approvers.is_empty() => vec![NOBODY.to_string()],
                    Some(routed) => routed.approvers,
                    None => reviewers.approvers,
                };
                // With stages, each is asked in turn (a policy with stages has no limits).
                let later = (2..=def.approval.stages().len() as u32).map(|n| {
                    let at = def.approval.reviewers_at(n);
                    (at.approvers, at.quorum)
                });
                Sorted::Hold(
                    std::iter::once((approvers, reviewers.quorum))
                        .chain(later)
                        .collect(),
                )
            }
        };
        (sorted, shares)
    }
}

/// The kind of difference of a call the candidate runs at once and the live policy held.
pub const NEWLY_RELEASED: &str = "newly_released";

/// Sorts `recorded` (made over `days`) and `waiting` under `live` and `candidate`.
pub fn replay(
    live: &Agent,
    candidate: &Agent,
    recorded: &[Recorded],
    waiting: &[Waiting],
    days: f64,
) -> Result<Report, PolicyError> {
    replay_each(live, candidate, recorded, waiting, days, |_, _| {})
}

/// [`replay`], telling `each` every recorded call and its kind of difference (`unchanged`,
/// [`NEWLY_RELEASED`], ...) as it is sorted.
pub fn replay_each(
    live: &Agent,
    candidate: &Agent,
    recorded: &[Recorded],
    waiting: &[Waiting],
    days: f64,
    mut each: impl FnMut(&Recorded, &str),
) -> Result<Report, PolicyError> {
    let (mut live_side, mut candidate_side) = (Side::new(live)?, Side::new(candidate)?);
    // Windows count the calls in the order they were made.
    let mut recorded: Vec<&Recorded> = recorded.iter().collect();
    recorded.sort_by_key(|call| call.at);
    let mut tools: BTreeMap<String, ToolCounts> = BTreeMap::new();
    let mut examples: BTreeMap<String, Vec<Example>> = BTreeMap::new();
    // Approvals asked for, by approver group, now and with the candidate.
    let (mut asked_live, mut asked_candidate) = (BTreeMap::new(), BTreeMap::new());
    let count = |held: &Sorted, into: &mut BTreeMap<String, u64>| {
        if let Sorted::Hold(stages) = held {
            for (approvers, quorum) in stages {
                let group = if approvers.is_empty() {
                    "anyone".to_string()
                } else {
                    approvers.join(", ")
                };
                *into.entry(group).or_default() += u64::from(*quorum);
            }
        }
    };
    for call in &recorded {
        let facts = Facts {
            input: &call.input,
            metadata: &call.metadata,
            requester: &call.requester,
        };
        let before = live_side.sorted(&call.tool, &facts, call.at, call.ran);
        let after = candidate_side.sorted(&call.tool, &facts, call.at, call.ran);
        count(&before, &mut asked_live);
        count(&after, &mut asked_candidate);
        let counts = tools.entry(call.tool.clone()).or_default();
        counts.calls += 1;
        // The kind of difference, and its count.
        let (kind, count) = match (&before, &after) {
            (Sorted::Run, Sorted::Hold(_)) => ("newly_held", &mut counts.newly_held),
            (Sorted::Hold(_), Sorted::Run) => (NEWLY_RELEASED, &mut counts.newly_released),
            (Sorted::Hold(_), Sorted::Hold(_)) if before != after => {
                ("other_reviewers", &mut counts.other_reviewers)
            }
            (Sorted::Run | Sorted::Hold(_), Sorted::Refused) => ("refused", &mut counts.refused),
            _ => ("unchanged", &mut counts.unchanged),
        };
        *count += 1;
        each(call, kind);
        if kind != "unchanged" {
            let kept = examples.entry(kind.to_string()).or_default();
            if kept.len() < EXAMPLES {
                kept.push(Example::of(call));
            }
        }
    }
    let per_day = |asked: BTreeMap<String, u64>| {
        asked
            .into_iter()
            .map(|(group, n)| (group, n as f64 / days.max(f64::MIN_POSITIVE)))
            .collect()
    };
    let forecast = Forecast {
        live: per_day(asked_live),
        candidate: per_day(asked_candidate),
    };
    let now = waiting_now(&candidate_side, candidate, waiting);
    Ok(Report {
        agent: live.def.name.clone(),
        calls: recorded.len(),
        tools,
        approvals_per_day: forecast,
        examples,
        waiting: now,
    })
}

/// What would become of the calls waiting now under `candidate`: refused, released, held
/// again under a changed policy, or unchanged.
fn waiting_now(candidate_side: &Side<'_>, candidate: &Agent, waiting: &[Waiting]) -> WaitingReport {
    let mut now = WaitingReport::default();
    for call in waiting {
        let held = &call.held;
        let named = CallRef {
            run_id: call.run_id.clone(),
            call_id: held.call_id.clone(),
            tool: held.tool.clone(),
        };
        let facts = Facts {
            input: &held.input,
            metadata: &call.metadata,
            requester: &call.requester,
        };
        match candidate_side.sort(&held.tool, &facts, crate::now_ms()).0 {
            Sorted::Refused => now.refused.push(named),
            Sorted::Run => now.released.push(named),
            Sorted::Hold(_) => {
                let version = candidate.tool(&held.tool).map(ToolDef::policy_version);
                if version.as_deref() == Some(held.policy_version.as_str()) {
                    now.unchanged += 1;
                } else {
                    now.reheld.push(named);
                }
            }
        }
    }
    now
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

    fn agent(approval: &str) -> Agent {
        let text = format!(
            r#"
name = "refunds"
[model]
provider = "scripted"
name = "x"
[[tools]]
name = "issue_refund"
input_schema = {{ type = "object", properties = {{ amount = {{ type = "number", maximum = 500 }} }}, required = ["amount"] }}
http = {{ url = "http://127.0.0.1:1/" }}
{approval}
"#
        );
        Agent::from_toml(&text, Path::new(".")).unwrap()
    }

    fn calls(amounts: &[u32]) -> Vec<Recorded> {
        amounts
            .iter()
            .enumerate()
            .map(|(i, amount)| Recorded {
                run_id: format!("run_{i}"),
                call_id: "toolu_1".into(),
                tool: "issue_refund".into(),
                input: json!({"amount": amount}),
                metadata: json!({}),
                requester: "rick".into(),
                at: 1_000 * i as i64,
                ran: true,
            })
            .collect()
    }

    #[test]
    fn every_stage_is_counted_among_the_approvals_asked() {
        let live = agent(
            "[tools.approval]\nwhen = \"input.amount > 20.0\"\napprovers = [\"role:support\"]",
        );
        let candidate = agent(
            "[tools.approval]\nwhen = \"input.amount > 20.0\"\n\
             [[tools.approval.stages]]\napprovers = [\"role:support\"]\n\
             [[tools.approval.stages]]\napprovers = [\"role:finance\"]\nquorum = 2",
        );
        let report = replay(&live, &candidate, &calls(&[50, 180]), &[], 1.0).unwrap();
        assert_eq!(report.tools["issue_refund"].other_reviewers, 2);
        let asked = &report.approvals_per_day.candidate;
        assert_eq!((asked["role:support"], asked["role:finance"]), (2.0, 4.0));
    }

    #[test]
    fn windows_are_replayed_in_the_order_calls_were_made() {
        // Live, every refund ran at once; the candidate lets through 100 a day.
        let live = agent("approval = \"never\"");
        let candidate = agent(
            "[tools.approval]\nwhen = \"window.daily > 100.0\"\n\
             [tools.approval.windows.daily]\nsum = \"input.amount\"\nover = \"24h\"",
        );
        let mut made = calls(&[40, 40, 40, 10, 30]);
        // The third refund was made last: the window holds 40 + 40 + 10 before it.
        made[2].at = 10_000;
        // A held refund a person rejected does not count: it never ran.
        made[4].ran = false;
        let report = replay(&live, &candidate, &made, &[], 1.0).unwrap();
        let counts = &report.tools["issue_refund"];
        assert_eq!((counts.unchanged, counts.newly_held), (3, 2), "{report:?}");
        let held: Vec<&str> = report.examples["newly_held"]
            .iter()
            .map(|e| e.run_id.as_str())
            .collect();
        assert_eq!(held, ["run_4", "run_2"]);
    }

    #[test]
    fn other_approvers_and_a_tighter_schema_are_counted_apart() {
        let live = agent("[tools.approval]\nwhen = \"input.amount > 20.0\"");
        let candidate = agent(
            "[tools.approval]\nwhen = \"input.amount > 20.0\"\napprovers = [\"role:finance\"]\nquorum = 2",
        )
        .def
        .clone();
        let text = toml::to_string(&candidate).unwrap();
        let candidate = Agent::from_toml(
            &text.replace("maximum = 500", "maximum = 100"),
            Path::new("."),
        )
        .unwrap();
        let report = replay(&live, &candidate, &calls(&[5, 50, 180]), &[], 2.0).unwrap();
        let counts = &report.tools["issue_refund"];
        assert_eq!(
            (counts.unchanged, counts.other_reviewers, counts.refused),
            (1, 1, 1)
        );
        // Two held live, one approval each; one held by the candidate, two approvals.
        assert_eq!(report.approvals_per_day.live["anyone"], 1.0);
        assert_eq!(report.approvals_per_day.candidate["role:finance"], 1.0);
    }

    #[test]
    fn limits_are_replayed_as_who_would_have_been_asked() {
        let live = agent(
            "[tools.approval]\nwhen = \"input.amount > 20.0\"\napprovers = [\"role:support\"]",
        );
        let candidate = agent(
            "[tools.approval]\nwhen = \"input.amount > 20.0\"\napprovers = [\"role:support\"]\n\
             limits = { \"role:support\" = \"input.amount <= 100.0\", \
             \"role:finance\" = \"input.amount <= 400.0\" }",
        );
        let report = replay(&live, &candidate, &calls(&[50, 180, 450]), &[], 1.0).unwrap();
        let counts = &report.tools["issue_refund"];
        assert_eq!((counts.unchanged, counts.other_reviewers), (1, 2));
        let asked = &report.approvals_per_day.candidate;
        assert_eq!(asked["role:support"], 1.0);
        assert_eq!(asked["role:finance"], 1.0);
        assert_eq!(asked[NOBODY], 1.0);
    }

    #[test]
    fn each_call_is_told_with_its_kind_of_difference() {
        let live = agent("[tools.approval]\nwhen = \"input.amount > 20.0\"");
        let candidate = agent("[tools.approval]\nwhen = \"input.amount > 100.0\"");
        let mut told = Vec::new();
        replay_each(
            &live,
            &candidate,
            &calls(&[5, 50, 180]),
            &[],
            1.0,
            |call, kind| {
                told.push((call.run_id.clone(), kind.to_string()));
            },
        )
        .unwrap();
        let expected = [
            ("run_0", "unchanged"),
            ("run_1", NEWLY_RELEASED),
            ("run_2", "unchanged"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(r, k)| (r.to_string(), k.to_string()))
            .collect();
        assert_eq!(told, expected);
    }

    #[test]
    fn a_call_the_candidate_no_longer_takes_is_refused() {
        let live = agent("[tools.approval]\nwhen = \"never\"");
        let candidate = agent("[tools.approval]\nwhen = \"never\"").def.clone();
        let mut candidate = candidate;
        candidate.tools.clear();
        let text = toml::to_string(&candidate).unwrap();
        let candidate = Agent::from_toml(&text, Path::new(".")).unwrap();
        let report = replay(&live, &candidate, &calls(&[5]), &[], 1.0).unwrap();
        assert_eq!(report.tools["issue_refund"].refused, 1);
        assert_eq!(report.examples["refused"][0].run_id, "run_0");
    }
}
