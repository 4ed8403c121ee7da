//! A checked decision turned into what the decision script records: the decision and its
//! audit entry. An edit is checked against the schema of the tool of the call as this copy
//! of the run holds it, and the script makes sure that is the call it decides. An edit may
//! change only the fields the tool takes; its audit entry records what it changed.

use super::error::DecideError;
use super::input::{Decider, Proposed};
use crate::receipts::{DecidedBy, Issued, Receipts};
use countersign_model::agent::Catalog;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::authority::{self, Principal, RunFacts};
use countersign_model::condition::{Condition, ConditionError};
use countersign_model::digest::{MAX_EXACT_INTEGER, inexact_integer, sha256_hex};
use countersign_model::edit::{self, FieldChange};
use countersign_model::grant::{Grant, GrantTerms};
use countersign_model::limits;
use countersign_model::run::{Action, Decision, HeldCall, Run};
use countersign_store::{Proposal, Refusal, RefusalCode};
use serde_json::{Value, json};

/// What an edit of `pending` to `input` changes, once it passes the tool's checks: it may
/// change only the fields the tool takes, and the result must fit the tool's schema.
pub(super) fn checked_edit(
    catalog: &Catalog,
    run: &Run,
    pending: &HeldCall,
    input: &Value,
) -> Result<Vec<FieldChange>, DecideError> {
    // The digest and the receipt read numbers as doubles: an integer past 2^53 − 1 would
    // not be bound exactly by what the reviewer approves, so no edit writes one.
    if let Some((at, n)) = inexact_integer(input) {
        return Err(DecideError::InvalidEdit {
            message: format!(
                "the edited input for call {:?} holds an integer no digest binds exactly",
                pending.call_id
            ),
            errors: vec![format!(
                "{at} is {n}, past ±{MAX_EXACT_INTEGER} (2^53 − 1): the digest and the receipt read numbers as IEEE doubles (RFC 8785); send it as a string"
            )],
        });
    }
    if let Some(agent) = catalog.get(&run.agent) {
        let problems = agent.edit_problems(&pending.tool, &pending.input, input);
        if !problems.is_empty() {
            return Err(DecideError::InvalidEdit {
                message: format!(
                    "the edited input for call {:?} does not fit {}",
                    pending.call_id, pending.tool
                ),
                errors: problems.iter().map(ToString::to_string).collect(),
            });
        }
    }
    Ok(edit::changes(&pending.input, input))
}

/// Whether the policy of `pending`'s tool allows a grant on `terms`, and whether they make
/// sense: a condition that compiles and covers the call it is made on, and a requester to
/// limit it to when asked.
fn check_grant(
    catalog: &Catalog,
    run: &Run,
    pending: &HeldCall,
    terms: &GrantTerms,
) -> Result<(), DecideError> {
    let bad = |message: String| Err(DecideError::BadInput(message));
    let tool = catalog
        .get(&run.agent)
        .and_then(|a| a.tool(&pending.tool).cloned());
    let Some(tool) = tool else {
        return bad(format!(
            "the agent {:?} no longer has the tool {:?}: no grant can be made for it",
            run.agent, pending.tool
        ));
    };
    if let Err(e) = tool.grant_limits().check(terms) {
        return Err(DecideError::GrantRefused(e));
    }
    let condition = compiled(&terms.condition, "")?;
    match condition.check(&pending.input) {
        Ok(true) => {}
        Ok(false) => {
            return bad(format!(
                "the condition {:?} does not cover call {:?} itself",
                condition.source(),
                pending.call_id
            ));
        }
        Err(ConditionError::Limit(why)) => {
            return Err(DecideError::ConditionLimit(format!(
                "the condition cannot be evaluated for call {:?}: {why}",
                pending.call_id
            )));
        }
        Err(ConditionError::Invalid(e)) => {
            return bad(format!(
                "the condition {:?} cannot be evaluated for call {:?}: {e}",
                condition.source(),
                pending.call_id
            ));
        }
    }
    if let Some(total) = &terms.total {
        let sum = compiled(&total.sum, "total.sum: ")?;
        // It must read the calls it covers as this one: a number of at least 0.
        if let Err(e) = sum.number(&pending.input) {
            return bad(format!(
                "total.sum {:?} cannot be read for call {:?}: {e}",
                sum.source(),
                pending.call_id
            ));
        }
    }
    if terms.same_requester && run.requested_by.is_none() {
        return bad("same_requester: this run has no requester to limit the grant to".into());
    }
    Ok(())
}

/// A grant's expression compiled, or refused as bad input or too costly, `field` naming it
/// before the reason.
fn compiled(source: &str, field: &str) -> Result<Condition, DecideError> {
    Condition::compile(source).map_err(|e| match e {
        ConditionError::Invalid(why) => DecideError::BadInput(format!("{field}{why}")),
        ConditionError::Limit(why) => DecideError::ConditionLimit(format!("{field}{why}")),
    })
}

/// Whether an edit of `pending` to `edited` by `by` (named by policies as `entries`) keeps
/// within their authority limit: they must be among those the edited call would be held for
/// under its tool's limits (`countersign_model::limits`). The decision script checks that they
/// decide the call as it was held; this checks what they made of it.
fn within_limits(
    catalog: &Catalog,
    run: &Run,
    pending: &HeldCall,
    edited: &Value,
    (by, entries): (&Decider<'_>, &[String]),
) -> Result<(), DecideError> {
    let agent = catalog.get(&run.agent);
    let tool = agent.as_ref().and_then(|a| a.tool(&pending.tool));
    let Some((tool, limits)) = tool.and_then(|t| Some((t, t.approval.limits()?))) else {
        return Ok(());
    };
    let routed = limits::route(limits, &tool.reviewers(), edited);
    let Some(routed) = routed.filter(|r| !r.admits(entries)) else {
        return Ok(());
    };
    let refusal = Refusal {
        call_id: pending.call_id.clone(),
        code: RefusalCode::AboveLimit,
        detail: routed.why,
    };
    Err(DecideError::refused(
        run.run_id.as_str(),
        by.principal,
        refusal,
    ))
}

/// Whether `by` may approve `pending`, by the rule the decision script applies; refused in
/// the script's words when not.
fn authorized(run: &Run, pending: &HeldCall, by: &Decider<'_>) -> Result<(), DecideError> {
    let who = Principal {
        id: by.principal,
        role: by.role,
    };
    let Err(refused) = authority::may_decide(who, Action::Approve, pending, RunFacts::of(run))
    else {
        return Ok(());
    };
    let detail = match refused {
        RefusalCode::NotApprover => serde_json::to_string(&pending.deciders).unwrap_or_default(),
        RefusalCode::EditWithQuorum => pending.reviewers.quorum.to_string(),
        RefusalCode::RunCancelled => run.status.as_str().to_string(),
        _ => String::new(),
    };
    let refusal = Refusal {
        call_id: pending.call_id.clone(),
        code: refused,
        detail,
    };
    Err(DecideError::refused(
        run.run_id.as_str(),
        by.principal,
        refusal,
    ))
}

/// The decision, its audit entry and, when it lets the call run, its receipt. `voters` are
/// who had approved the call before, for a call that needs several approvals: its receipt is
/// signed only by the approval that completes the quorum, naming them all.
/// `entries` are how policies name the decider: their id and `role:NAME` for each of their
/// roles.
pub(super) fn prepare(
    catalog: &Catalog,
    receipts: &Receipts,
    run: &Run,
    mut p: Proposed,
    (by, entries): (&Decider<'_>, &[String]),
    voters: &[String],
) -> Result<Proposal, DecideError> {
    let pending = run.held_calls().find(|c| c.call_id == p.call_id);
    let (changes, checked_digest) = settle_edit(catalog, run, pending, &mut p)?;
    if let (Action::Edit, Some(input), Some(pending)) = (p.action, &p.input, pending) {
        within_limits(catalog, run, pending, input, (by, entries))?;
    }
    if let (Some(terms), Some(pending)) = (&p.grant, pending) {
        // Authorized first: a grant's condition is compiled and evaluated only for someone
        // who may approve the call (as this copy of the run holds it; the script checks
        // again), so nobody else makes the gateway run what they wrote.
        authorized(run, pending, by)?;
        check_grant(catalog, run, pending, terms)?;
    }
    let digest = p.digest.take().unwrap_or_default();
    let mut entry = AuditEntry::new(&run.run_id, AuditKind::Decided);
    entry.call_id = Some(p.call_id.clone());
    entry.actor = Some(by.principal.to_string());
    entry.via = Some(by.door.to_string());
    entry.digest = Some(digest.clone());
    entry.detail = json!({
        "action": p.action, "input": p.input, "note": p.note, "reason": p.reason,
    });
    if let Some(changes) = changes {
        entry.detail["changes"] = json!(changes);
    }
    let mut fingerprint = Decision::fingerprint_of(
        p.action,
        p.input.as_ref(),
        p.note.as_deref(),
        p.reason.as_deref(),
    );
    if let Some(terms) = &p.grant {
        entry.detail["grant"] = json!({
            "id": Grant::id_for(run.run_id.as_str(), &p.call_id), "terms": terms,
        });
        // Approving with a grant and without are two different decisions.
        fingerprint = sha256_hex(format!("{fingerprint}\n{}", terms.digest()));
    }
    if let Some(grant) = by.grant {
        entry.detail["under_grant"] = json!(grant.id);
    }
    if let Some(delegation) = by.delegation {
        entry.detail["delegation"] = json!({
            "id": delegation.id, "from": delegation.from, "to": delegation.to,
        });
    }
    let (receipt, receipt_for) = issue_receipt(catalog, receipts, run, pending, &p, by, voters);
    if let Some(issued) = &receipt {
        entry.detail["receipt"] = json!({"jti": issued.jti, "kid": issued.kid});
    }
    Ok(Proposal {
        decision: Decision {
            call_id: p.call_id,
            digest,
            action: p.action,
            input: p.input,
            note: p.note,
            reason: p.reason,
            decided_by: by.principal.to_string(),
            door: by.door.to_string(),
            decided_at: entry.at,
            fingerprint,
            expired: false,
            superseded: false,
            receipt: receipt.map(|issued| issued.token),
            grant: p.grant,
            under_grant: by.grant.map(|g| g.id.clone()),
            delegation: by.delegation.map(|d| d.id.clone()),
        },
        checked_digest,
        entry,
        receipt_for: receipt_for.join(", "),
    })
}

/// Checks an edit against its tool's schema: gives back its changes and the digest they
/// were checked against, or turns an edit that changes nothing into an approval.
fn settle_edit(
    catalog: &Catalog,
    run: &Run,
    pending: Option<&HeldCall>,
    p: &mut Proposed,
) -> Result<(Option<Vec<FieldChange>>, Option<String>), DecideError> {
    let mut checked_digest = None;
    let mut changes = None;
    if let (Action::Edit, Some(input), Some(pending)) = (p.action, &p.input, pending) {
        let changed = checked_edit(catalog, run, pending, input)?;
        if changed.is_empty() {
            // An edit that changes nothing runs the call as it was shown: it is an approval,
            // and is recorded and told as one (with its note).
            p.action = Action::Approve;
            p.input = None;
        } else {
            changes = Some(changed);
            checked_digest = Some(pending.digest.clone());
        }
    }
    Ok((changes, checked_digest))
}

/// The receipt the decision lets its call run with, and whom it names: none for a
/// rejection, while more approvals are needed, or when no receipt is signed.
fn issue_receipt(
    catalog: &Catalog,
    receipts: &Receipts,
    run: &Run,
    pending: Option<&HeldCall>,
    p: &Proposed,
    by: &Decider<'_>,
    voters: &[String],
) -> (Option<Issued>, Vec<String>) {
    let mut receipt_for = Vec::new();
    let mut receipt = None;
    // At a stage before the last, an approval lets nothing run: no receipt.
    if let (Some(held), Some(runs_with)) = (pending, p.input.as_ref().or(pending.map(|c| &c.input)))
        && held.lets_run(p.action)
    {
        receipt_for = match by.grant {
            Some(grant) => grant.granted_by.clone(),
            None => deciders_if_final(held.reviewers.quorum, voters, by.principal),
        };
        if !receipt_for.is_empty() {
            let agent = catalog.get(&run.agent);
            let tool = agent.as_ref().and_then(|a| a.tool(&held.tool));
            let decided_by = DecidedBy {
                names: receipt_for.clone(),
                grant: by.grant.map(|g| g.id.as_str()),
            };
            receipt = receipts.issue(run, held, tool, p.action, runs_with, decided_by);
        }
    }
    if receipt.is_none() {
        receipt_for.clear();
    }
    (receipt, receipt_for)
}

/// Everyone a decision by `principal` would name, sorted, if it completes the call's
/// approvals (given `voters` before it); none if more are still needed.
fn deciders_if_final(quorum: u32, voters: &[String], principal: &str) -> Vec<String> {
    let mut names: Vec<String> = voters.to_vec();
    if !names.iter().any(|v| v == principal) {
        names.push(principal.to_string());
    }
    if names.len() < quorum.max(1) as usize {
        return Vec::new();
    }
    names.sort();
    names
}
