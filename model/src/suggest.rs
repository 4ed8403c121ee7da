//! Suggesting policies from a team's own decisions: where people approved every call of a
//! tool up to some value of one of its arguments, and rejected or edited none of them, a
//! condition that lets those calls run without asking would have asked fewer questions and
//! changed no outcome a person chose. This module finds such bounds in the settled calls
//! and writes the candidate agent file; the gateway replays each candidate over the same
//! window ([`crate::replay`]) before it shows it, and nothing ships by itself.

use crate::replay::Recorded;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

/// How people settled a held call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Settled {
    /// Approved as asked.
    Approved,
    /// Approved with other arguments.
    Edited,
    /// Rejected.
    Rejected,
    /// Nobody decided it: it expired, or its run was cancelled first.
    Unanswered,
}

impl Settled {
    /// The word the API and the reports use for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Settled::Approved => "approved",
            Settled::Edited => "edited",
            Settled::Rejected => "rejected",
            Settled::Unanswered => "unanswered",
        }
    }

    /// Whether a person chose not to let the call run as asked: a suggestion that would
    /// have let it run is disqualified.
    pub fn refused(self) -> bool {
        matches!(self, Settled::Edited | Settled::Rejected)
    }
}

/// A call a policy held, and how it was settled.
#[derive(Clone, Debug)]
pub struct HeldRecord {
    /// The call as the model asked for it, when it was held.
    pub call: Recorded,
    /// How it was settled.
    pub settled: Settled,
    /// Who decided it (every approver of a quorum); empty if nobody did.
    pub deciders: Vec<String>,
}

/// A refused call next to a suggested bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Nearest {
    /// The run that made the call.
    pub run_id: String,
    /// The call's id in its run.
    pub call_id: String,
    /// The argument's value in it.
    pub value: f64,
    /// How a person settled it.
    pub settled: Settled,
}

/// What a suggestion rests on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// Calls within the bound people approved as asked.
    pub approved: usize,
    /// Who approved them, each once.
    pub deciders: Vec<String>,
    /// When the first of them was made (ms since the epoch).
    pub first_at: i64,
    /// When the last of them was made (ms since the epoch).
    pub last_at: i64,
    /// Calls within the bound nobody decided (expired, or their run cancelled): the
    /// suggestion would have run them.
    pub unanswered: usize,
    /// The refused call with the smallest value above the bound, if any was refused.
    pub nearest_refused: Option<Nearest>,
}

/// A bound found in the settled calls of one tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bound {
    /// The tool.
    pub tool: String,
    /// The argument (a top-level number of the input).
    pub field: String,
    /// The largest value people approved below every refused one.
    pub at_most: f64,
    /// The CEL condition of the calls it would release: `input.FIELD <= AT_MOST`.
    pub release: String,
    /// What it rests on.
    pub evidence: Evidence,
}

/// What a suggestion needs before it is made.
#[derive(Clone, Copy, Debug)]
pub struct Thresholds {
    /// Approved calls within the bound, at least.
    pub min_calls: usize,
    /// Distinct people who approved them, at least.
    pub min_deciders: usize,
}

/// The bounds `held` supports, per tool and numeric argument, most approvals first.
pub fn bounds(held: &[HeldRecord], thresholds: Thresholds) -> Vec<Bound> {
    let mut by_tool: BTreeMap<&str, Vec<&HeldRecord>> = BTreeMap::new();
    for h in held {
        by_tool.entry(&h.call.tool).or_default().push(h);
    }
    let mut found: Vec<Bound> = by_tool
        .into_iter()
        .flat_map(|(tool, calls)| {
            numeric_fields(&calls)
                .into_iter()
                .filter_map(move |field| bound(tool, &field, &calls, thresholds))
                .collect::<Vec<_>>()
        })
        .collect();
    found.sort_by(|a, b| {
        (b.evidence.approved, &a.tool, &a.field).cmp(&(a.evidence.approved, &b.tool, &b.field))
    });
    found
}

/// The top-level arguments that are numbers in some call and may be named in CEL as they are.
fn numeric_fields(calls: &[&HeldRecord]) -> BTreeSet<String> {
    calls
        .iter()
        .filter_map(|h| h.call.input.as_object())
        .flat_map(|input| input.iter())
        .filter(|(name, value)| value.is_number() && crate::condition::is_identifier(name))
        .map(|(name, _)| name.clone())
        .collect()
}

/// The bound on `field` of `tool`'s calls, if the thresholds are met. A call without the
/// field as a number is left out of the bound's evidence; the replay still sorts it.
fn bound(tool: &str, field: &str, calls: &[&HeldRecord], thresholds: Thresholds) -> Option<Bound> {
    let valued: Vec<(f64, &HeldRecord)> = calls
        .iter()
        .filter_map(|h| Some((h.call.input.get(field)?.as_f64()?, *h)))
        .collect();
    let nearest_refused = valued
        .iter()
        .filter(|(_, h)| h.settled.refused())
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let below = |v: f64| nearest_refused.is_none_or(|(refused, _)| v < *refused);
    let at_most = valued
        .iter()
        .filter(|(v, h)| h.settled == Settled::Approved && below(*v))
        .map(|(v, _)| *v)
        .max_by(f64::total_cmp)?;
    let within = || valued.iter().filter(move |(v, _)| *v <= at_most);
    let approved: Vec<&HeldRecord> = within()
        .filter(|(_, h)| h.settled == Settled::Approved)
        .map(|(_, h)| *h)
        .collect();
    let deciders: BTreeSet<&String> = approved.iter().flat_map(|h| &h.deciders).collect();
    if approved.len() < thresholds.min_calls || deciders.len() < thresholds.min_deciders {
        return None;
    }
    let times = approved.iter().map(|h| h.call.at);
    Some(Bound {
        tool: tool.to_string(),
        field: field.to_string(),
        at_most,
        release: format!("input.{field} <= {at_most:?}"),
        evidence: Evidence {
            approved: approved.len(),
            deciders: deciders.into_iter().cloned().collect(),
            first_at: times.clone().min().unwrap_or_default(),
            last_at: times.max().unwrap_or_default(),
            unanswered: within()
                .filter(|(_, h)| h.settled == Settled::Unanswered)
                .count(),
            nearest_refused: nearest_refused.map(|(value, h)| Nearest {
                run_id: h.call.run_id.clone(),
                call_id: h.call.call_id.clone(),
                value: *value,
                settled: h.settled,
            }),
        },
    })
}

/// Why a candidate file could not be written.
#[derive(Debug, Error)]
pub enum RewriteError {
    /// The file is not TOML.
    #[error("the agent file does not parse as TOML: {0}")]
    Toml(#[from] toml_edit::TomlError),
    /// No `[[tools]]` entry has the name.
    #[error("the agent file has no tool named {0:?} in its [[tools]]")]
    NoTool(String),
    /// The tool holds no call already.
    #[error("tool {0:?} asks for nothing (approval = \"never\")")]
    NeverAsks(String),
    /// The tool's `approval` is of a shape no agent file loads with.
    #[error("tool {0:?} has an approval the suggestion cannot read: {1}")]
    Unreadable(String, String),
}

/// A candidate agent file and the `when` it changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Rewritten {
    /// The file, whole.
    pub text: String,
    /// The tool's `when` in the live file (`always` where it had none).
    pub before: String,
    /// Its `when` in the candidate.
    pub after: String,
}

/// The agent file `source` with `tool`'s calls matching `release` let run without asking:
/// its `when` becomes `(WHEN) && !(RELEASE)`, the rest of the file as it was (comments too).
pub fn rewrite(source: &str, tool: &str, release: &str) -> Result<Rewritten, RewriteError> {
    let mut doc: toml_edit::DocumentMut = source.parse()?;
    let table = doc
        .get_mut("tools")
        .and_then(|t| t.as_array_of_tables_mut())
        .and_then(|tools| {
            tools
                .iter_mut()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some(tool))
        })
        .ok_or_else(|| RewriteError::NoTool(tool.to_string()))?;
    let unreadable = |why: &str| RewriteError::Unreadable(tool.to_string(), why.to_string());
    let when = match table.get("approval") {
        None => "always".to_string(),
        Some(item) => match item.as_str() {
            Some(word) => word.to_string(),
            None => item
                .as_table_like()
                .ok_or_else(|| unreadable("neither a word nor a table"))?
                .get("when")
                .map_or(Some("always"), |w| w.as_str())
                .ok_or_else(|| unreadable("`when` is not a string"))?
                .to_string(),
        },
    };
    let after = match when.trim() {
        "never" => return Err(RewriteError::NeverAsks(tool.to_string())),
        "always" => format!("!({release})"),
        other => format!("({other}) && !({release})"),
    };
    match table.get_mut("approval") {
        Some(item) if item.is_table_like() => {
            let rule = item.as_table_like_mut().expect("checked a table");
            rule.insert("when", toml_edit::value(&after));
        }
        _ => {
            let mut rule = toml_edit::Table::new();
            rule.insert("when", toml_edit::value(&after));
            table.insert("approval", toml_edit::Item::Table(rule));
        }
    }
    Ok(Rewritten {
        text: doc.to_string(),
        before: when,
        after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn held(i: usize, input: Value, settled: Settled, by: &str) -> HeldRecord {
        HeldRecord {
            call: Recorded {
                run_id: format!("run_{i}"),
                call_id: "call_1_0".into(),
                tool: "issue_refund".into(),
                input,
                metadata: json!({}),
                requester: "rick".into(),
                at: 1_000 * i as i64,
                ran: settled == Settled::Approved,
            },
            settled,
            deciders: if by.is_empty() {
                vec![]
            } else {
                vec![by.into()]
            },
        }
    }

    const LOOSE: Thresholds = Thresholds {
        min_calls: 3,
        min_deciders: 2,
    };

    #[test]
    fn the_bound_stops_below_the_smallest_refused_call() {
        let people = ["alice", "bob", "carol"];
        let mut calls: Vec<HeldRecord> = [25, 30, 12, 28, 40, 90]
            .iter()
            .enumerate()
            .map(|(i, amount)| {
                held(
                    i,
                    json!({"amount": amount, "order_id": format!("A-{i}")}),
                    Settled::Approved,
                    people[i % 3],
                )
            })
            .collect();
        calls.push(held(6, json!({"amount": 35}), Settled::Rejected, "alice"));
        calls.push(held(7, json!({"amount": 60}), Settled::Edited, "bob"));
        calls.push(held(8, json!({"amount": 20}), Settled::Unanswered, ""));
        let found = bounds(&calls, LOOSE);
        assert_eq!(found.len(), 1, "{found:?}");
        let b = &found[0];
        assert_eq!((b.field.as_str(), b.at_most), ("amount", 30.0));
        assert_eq!(b.release, "input.amount <= 30.0");
        let e = &b.evidence;
        assert_eq!((e.approved, e.unanswered), (4, 1));
        assert_eq!(e.deciders, ["alice", "bob", "carol"]);
        assert_eq!((e.first_at, e.last_at), (0, 3_000));
        let nearest = e.nearest_refused.as_ref().unwrap();
        assert_eq!((nearest.run_id.as_str(), nearest.value), ("run_6", 35.0));
        assert_eq!(nearest.settled, Settled::Rejected);
    }

    #[test]
    fn too_few_approvals_or_approvers_suggest_nothing() {
        let calls: Vec<HeldRecord> = (0..5)
            .map(|i| held(i, json!({"amount": 10}), Settled::Approved, "alice"))
            .collect();
        assert!(
            bounds(&calls, LOOSE).is_empty(),
            "one approver is not enough"
        );
        let few = [
            held(0, json!({"amount": 10}), Settled::Approved, "alice"),
            held(1, json!({"amount": 10}), Settled::Approved, "bob"),
        ];
        assert!(
            bounds(&few, LOOSE).is_empty(),
            "two approvals are not enough"
        );
        // The smallest call was rejected: no value is below every refused one.
        let mut refused: Vec<HeldRecord> = (1..6)
            .map(|i| {
                held(
                    i,
                    json!({"amount": 10 + i}),
                    Settled::Approved,
                    ["a", "b"][i % 2],
                )
            })
            .collect();
        refused.push(held(0, json!({"amount": 5}), Settled::Rejected, "a"));
        assert!(bounds(&refused, LOOSE).is_empty());
    }

    #[test]
    fn without_a_refusal_the_bound_is_the_largest_approved_value() {
        let calls: Vec<HeldRecord> = [5.5, 7.25, 3.0]
            .iter()
            .enumerate()
            .map(|(i, a)| {
                held(
                    i,
                    json!({"amount": a, "weird key": 1}),
                    Settled::Approved,
                    ["x", "y"][i % 2],
                )
            })
            .collect();
        let found = bounds(&calls, LOOSE);
        assert_eq!(
            found.len(),
            1,
            "a key CEL cannot name is not suggested: {found:?}"
        );
        assert_eq!(found[0].release, "input.amount <= 7.25");
        assert_eq!(found[0].evidence.nearest_refused, None);
    }

    const FILE: &str = r#"name = "refunds"

[[tools]]
name = "get_order"
approval = "never"

[[tools]]
name = "issue_refund"
# money moves: ask above 20
[tools.approval]
when = "input.amount > 20.0"
reason = "Refund of ${{ input.amount }}"

[[tools]]
name = "close_account"
"#;

    #[test]
    fn the_candidate_changes_the_tool_s_when_and_nothing_else() {
        let out = rewrite(FILE, "issue_refund", "input.amount <= 30.0").unwrap();
        assert_eq!(out.before, "input.amount > 20.0");
        assert_eq!(
            out.after,
            "(input.amount > 20.0) && !(input.amount <= 30.0)"
        );
        let out = out.text;
        let expected = FILE.replace(
            "when = \"input.amount > 20.0\"",
            "when = \"(input.amount > 20.0) && !(input.amount <= 30.0)\"",
        );
        assert_eq!(out, expected);
        // A tool with no approval asks always; the table is added.
        let out = rewrite(FILE, "close_account", "input.days <= 3.0")
            .unwrap()
            .text;
        assert!(
            out.ends_with(
                "name = \"close_account\"\n\n[tools.approval]\nwhen = \"!(input.days <= 3.0)\"\n"
            ),
            "{out}"
        );
        assert!(matches!(
            rewrite(FILE, "get_order", "input.x <= 1.0"),
            Err(RewriteError::NeverAsks(_))
        ));
        assert!(matches!(
            rewrite(FILE, "nope", "input.x <= 1.0"),
            Err(RewriteError::NoTool(_))
        ));
    }
}
