//! Authority limits: an approver of a policy (a person, or `role:NAME`) whose decisions count
//! only for calls within a limit, a condition over the call's input written beside the
//! approvers (`[tools.approval.limits]`, e.g. `"role:support" = "input.amount <= 100.0"`).
//!
//! A call is held for the approvers whose limits cover it (an approver without a limit has
//! none). A call above the limit of every approver the policy lists goes to the other entries
//! of `limits` whose limits cover it: the groups above, which the policy names only there.
//! A call above every limit goes to nobody: it waits until its deadline and expires, and
//! never runs. Escalation keeps to the same limits. The reviewer is told why.
//!
//! The held call keeps who may decide it, and the decision script refuses anyone else, so a
//! standing grant, which decides in its makers' names, is held to the limits too. An edit is
//! held to them by [`edit_allowed`]: its decider must be among those the edited call would be
//! held for.

use crate::approval::Reviewers;
use crate::condition::Condition;
use serde_json::Value;
use std::collections::BTreeMap;

/// Who decides a held call once limits are applied, and why, when a limit left out an
/// approver the policy names.
#[derive(Clone, Debug, PartialEq)]
pub struct Routed {
    /// The approver entries whose limits cover the call; empty: nobody may decide it.
    pub approvers: Vec<String>,
    /// The escalation entries whose limits cover it.
    pub escalate_to: Vec<String>,
    /// Why, as a reviewer reads it.
    pub why: String,
}

/// Checks a policy's limits: each a condition that compiles within the bounds of every
/// condition, on a policy that lists its approvers (a limit narrows a list; "anyone" has
/// none to narrow).
pub fn check(limits: &BTreeMap<String, String>, approvers: &[String]) -> Result<(), String> {
    if limits.is_empty() {
        return Ok(());
    }
    if approvers.is_empty() {
        return Err(
            "limits narrow the approvers the policy lists: list them in approvers".to_string(),
        );
    }
    for (entry, source) in limits {
        Condition::compile(source).map_err(|e| format!("the limit of {entry}: {e}"))?;
    }
    Ok(())
}

/// Who decides a call with `input` held under `reviewers` (its policy's) and `limits`: `None`
/// when no approver or escalation entry the policy names is above its limit.
pub fn route(
    limits: &BTreeMap<String, String>,
    reviewers: &Reviewers,
    input: &Value,
) -> Option<Routed> {
    // Each limit evaluated once: an entry without one has none, and one that cannot be
    // evaluated covers nothing.
    let within: BTreeMap<&str, bool> = limits
        .iter()
        .map(|(entry, source)| {
            let holds = Condition::compile(source).is_ok_and(|limit| limit.matches(input));
            (entry.as_str(), holds)
        })
        .collect();
    let covers = |entry: &String| within.get(entry.as_str()).copied().unwrap_or(true);
    let named = reviewers.approvers.iter().chain(&reviewers.escalate_to);
    let above: Vec<&String> = named.filter(|e| !covers(e)).collect();
    if above.is_empty() {
        return None;
    }
    let mut approvers: Vec<String> = reviewers
        .approvers
        .iter()
        .filter(|e| covers(e))
        .cloned()
        .collect();
    if approvers.is_empty() {
        approvers = limits
            .keys()
            .filter(|e| !reviewers.approvers.contains(e) && covers(e))
            .cloned()
            .collect();
    }
    let escalate_to = reviewers
        .escalate_to
        .iter()
        .filter(|e| covers(e) && !approvers.contains(e))
        .cloned()
        .collect();
    // The limits the reviewer is told of: those of the entries left out, or, when nobody is
    // left, every limit the call is above.
    let mut told: Vec<&String> = match approvers.is_empty() {
        true => limits.keys().filter(|e| !covers(e)).collect(),
        false => above,
    };
    told.sort();
    told.dedup();
    let limited: Vec<String> = told
        .into_iter()
        .map(|e| format!("{e}: {}", limits[e]))
        .collect();
    let limited = limited.join("; ");
    let why = match approvers.is_empty() {
        true => format!(
            "It is above every approver's limit ({limited}): nobody may approve it, and it \
             expires at its deadline."
        ),
        false => format!(
            "It is above the limit of {limited}: asked {}.",
            approvers.join(", ")
        ),
    };
    Some(Routed {
        approvers,
        escalate_to,
        why,
    })
}

/// Whether someone who is `decider`'s entries (their id and `role:NAME` for each of their
/// roles) may edit a call of a policy with `reviewers` and `limits` to `edited`: they must be
/// among those the edited call would be held for.
pub fn edit_allowed(
    limits: &BTreeMap<String, String>,
    reviewers: &Reviewers,
    edited: &Value,
    decider: &[String],
) -> bool {
    route(limits, reviewers, edited).is_none_or(|routed| routed.admits(decider))
}

impl Routed {
    /// Whether someone named by policies as `entries` (their id, `role:NAME` for each of
    /// their roles) is among those the call is held for.
    pub fn admits(&self, entries: &[String]) -> bool {
        self.approvers.iter().any(|e| entries.contains(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("role:support".into(), "input.amount <= 100.0".into()),
            ("role:finance".into(), "input.amount <= 5000.0".into()),
            ("role:cfo".into(), "true".into()),
        ])
    }

    fn asked(approvers: &[&str], escalate_to: &[&str]) -> Reviewers {
        Reviewers {
            approvers: approvers.iter().map(ToString::to_string).collect(),
            escalate_to: escalate_to.iter().map(ToString::to_string).collect(),
            ..Reviewers::default()
        }
    }

    /// Who a call is held for and who is escalated to, when a limit left someone out.
    type Asked<'a> = Option<(&'a [&'a str], &'a [&'a str])>;

    /// Each row: the amount, then who is asked and the escalation.
    #[test]
    fn a_call_goes_to_the_approvers_whose_limits_cover_it() {
        let policy = asked(&["role:support", "role:finance", "rita"], &["role:support"]);
        let rows: [(f64, Asked); 3] = [
            (80.0, None),
            (500.0, Some((&["role:finance", "rita"], &[]))),
            (9000.0, Some((&["rita"], &[]))),
        ];
        for (amount, expected) in rows {
            let routed = route(&limits(), &policy, &json!({"amount": amount}));
            let got = routed
                .as_ref()
                .map(|r| (r.approvers.clone(), r.escalate_to.clone()));
            let want = expected.map(|(a, e)| {
                (
                    a.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    e.iter().map(ToString::to_string).collect::<Vec<_>>(),
                )
            });
            assert_eq!(got, want, "${amount}");
        }
        let routed = route(&limits(), &policy, &json!({"amount": 500.0})).unwrap();
        assert_eq!(
            routed.why,
            "It is above the limit of role:support: input.amount <= 100.0: asked role:finance, rita."
        );
    }

    #[test]
    fn above_every_listed_limit_the_groups_above_decide_and_above_all_nobody() {
        let policy = asked(&["role:support", "role:finance"], &[]);
        let routed = route(&limits(), &policy, &json!({"amount": 9000.0})).unwrap();
        assert_eq!(routed.approvers, ["role:cfo"]);
        let only = BTreeMap::from([("role:support".into(), "input.amount <= 100.0".into())]);
        let nobody = route(
            &only,
            &asked(&["role:support"], &[]),
            &json!({"amount": 101}),
        );
        let nobody = nobody.unwrap();
        assert!(nobody.approvers.is_empty());
        assert!(
            nobody.why.contains("nobody may approve it"),
            "{}",
            nobody.why
        );
        // A limit that cannot be evaluated (no amount) covers nothing.
        let unread = route(&only, &asked(&["role:support"], &[]), &json!({}));
        assert!(unread.unwrap().approvers.is_empty());
    }

    #[test]
    fn an_edit_counts_only_from_someone_the_edited_call_would_be_held_for() {
        let policy = asked(&["role:support", "role:finance"], &[]);
        let support = ["sam".to_string(), "role:support".to_string()];
        let finance = ["fay".to_string(), "role:finance".to_string()];
        for (amount, sam, fay) in [
            (90.0, true, true),
            (900.0, false, true),
            (9e6, false, false),
        ] {
            let edited = json!({"amount": amount});
            assert_eq!(
                edit_allowed(&limits(), &policy, &edited, &support),
                sam,
                "${amount}"
            );
            assert_eq!(
                edit_allowed(&limits(), &policy, &edited, &finance),
                fay,
                "${amount}"
            );
        }
    }

    #[test]
    fn limits_need_listed_approvers_and_conditions_that_compile() {
        assert!(check(&limits(), &[]).is_err());
        assert!(check(&limits(), &["role:support".into()]).is_ok());
        let bad = BTreeMap::from([("role:support".into(), "input.amount <=".into())]);
        let err = check(&bad, &["role:support".into()]).unwrap_err();
        assert!(err.starts_with("the limit of role:support"), "{err}");
    }
}
