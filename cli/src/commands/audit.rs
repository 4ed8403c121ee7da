//! `countersign audit RUN [--verify]`: the run's audit trail, whether its hash chain holds, and
//! the latest refused decisions. `--verify` does not take the gateway's word for the chain: it
//! recomputes every link here, with the same code the services use, and fails if one breaks;
//! and it checks every countersignature receipt the trail kept (the one each approved call
//! was sent with) against the gateway's published keys: signed by one of them, for this run
//! and call, the receipt its decision named. Only an admin key is shown receipts; with any
//! other the chain still verifies (a withheld entry by its `entry_sha256`), and the receipts
//! are counted as withheld.

use crate::client::Gateway;
use crate::error::CliError;
use crate::render::{Table, clip, moment, print_json};
use crate::view::{Trail, read};
use countersign_model::audit::{AuditEntry, AuditKind, verify};
use countersign_receipt::KeySet;
use serde_json::Value;

pub(super) async fn run(
    gateway: &Gateway,
    run: &str,
    check: bool,
    json: bool,
) -> Result<(), CliError> {
    let answer = gateway
        .get(gateway.url(&["v1", "runs", run, "audit"]))
        .await?;
    if json {
        print_json(&answer);
    }
    let trail: Trail = read(answer)?;
    if !json {
        print_trail(&trail);
    }
    if check {
        verify(&trail.entries).map_err(|at| {
            CliError::Failed(format!(
                "the audit chain of run {run} is broken at element {at} (of {}): it was changed \
                 after it was written",
                trail.entries.len()
            ))
        })?;
        let keys = gateway
            .get(gateway.url(&[".well-known", "jwks.json"]))
            .await?;
        let keys: KeySet = read(keys)?;
        let (receipts, withheld) =
            check_receipts(run, &trail.entries, &keys).map_err(CliError::Failed)?;
        if !json {
            println!("chain: verified here, {} links hold", trail.entries.len());
            println!("receipts: {receipts} verified here against the gateway's published keys");
            if withheld > 0 {
                println!("receipts: {withheld} withheld (only an admin key is shown receipts)");
            }
        }
    }
    if !json {
        print_refusals(&trail.refusals);
    }
    Ok(())
}

/// Checks the receipt of every execution entry: signed by a key of `keys`, naming this run
/// and call, and the one the call's decision entry named (by `jti`). How many held, and how
/// many were withheld from this key.
fn check_receipts(run: &str, elements: &[Value], keys: &KeySet) -> Result<(usize, usize), String> {
    let entries: Vec<AuditEntry> = elements.iter().filter_map(Trail::entry).collect();
    let (mut checked, mut withheld) = (0, 0);
    for (i, entry) in entries.iter().enumerate() {
        if entry.detail["receipt"] == countersign_model::audit::withheld() {
            withheld += 1;
            continue;
        }
        let Some(token) = entry.detail["receipt"].as_str() else {
            continue;
        };
        let call = entry.call_id.as_deref().unwrap_or_default();
        let claims = countersign_receipt::signed_by(token, keys)
            .map_err(|refusal| format!("the receipt of call {call} ({i}) fails: {refusal}"))?;
        let decided = entries[..i]
            .iter()
            .rev()
            .find(|e| e.kind == AuditKind::Decided && e.call_id.as_deref() == Some(call))
            .map(|e| &e.detail["receipt"]["jti"]);
        if claims.run_id != run || claims.call_id != call {
            return Err(format!(
                "the receipt sent with call {call} ({i}) is for call {} of run {}",
                claims.call_id, claims.run_id
            ));
        }
        if decided.and_then(Value::as_str) != Some(claims.jti.as_str()) {
            return Err(format!(
                "the receipt sent with call {call} ({i}) is not the one its decision recorded"
            ));
        }
        checked += 1;
    }
    Ok((checked, withheld))
}

fn print_trail(trail: &Trail) {
    let mut table = Table::new(&["#", "AT", "WHAT", "CALL", "WHO", "CHANNEL", "DETAIL"]);
    for (i, element) in trail.entries.iter().enumerate() {
        let mut row = vec![i.to_string()];
        row.extend(match Trail::entry(element) {
            Some(entry) => entry_cells(&entry),
            None => vec![String::new(), "(unreadable entry)".into()],
        });
        table.row(row);
    }
    print!("{table}");
    match (trail.verified, trail.broken_at) {
        (true, _) => println!("chain: holds, by the gateway's check"),
        (false, Some(at)) => println!("chain: BROKEN at element {at}, by the gateway's check"),
        (false, None) => println!("chain: BROKEN, by the gateway's check"),
    }
}

fn print_refusals(refusals: &[Value]) {
    if !refusals.is_empty() {
        println!("\nRefused decisions, newest first:");
        let mut refused = Table::new(&["AT", "WHO", "CHANNEL", "CALL", "ACTION", "WHY"]);
        for r in refusals {
            refused.row(vec![
                r["at"].as_i64().map(moment).unwrap_or_default(),
                text(&r["actor"]),
                text(&r["channel"]),
                text(&r["call_id"]),
                text(&r["action"]),
                text(&r["code"]),
            ]);
        }
        print!("{refused}");
    }
}

/// An entry as the cells after `#`: when, what, the call, who, the channel and its detail.
pub(super) fn entry_cells(entry: &AuditEntry) -> Vec<String> {
    let kind = serde_json::to_value(entry.kind).unwrap_or_default();
    vec![
        moment(entry.at),
        text(&kind),
        entry.call_id.clone().unwrap_or_default(),
        entry.actor.clone().unwrap_or_default(),
        entry.via.clone().unwrap_or_default(),
        detail(&entry.detail),
    ]
}

/// An entry's detail on one line: `key: value` pairs, texts unquoted, moments as moments,
/// empty values left out.
fn detail(value: &Value) -> String {
    let line = match value {
        Value::Object(fields) => fields
            .iter()
            .filter(|(_, value)| !is_empty(value))
            .map(|(key, value)| match value.as_i64() {
                Some(ms) if key == "deadline" || key.ends_with("_at") => {
                    format!("{key}: {}", moment(ms))
                }
                _ => format!("{key}: {}", text(value)),
            })
            .collect::<Vec<_>>()
            .join(", "),
        other => text(other),
    };
    clip(&line, 80)
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => fields.is_empty(),
        _ => false,
    }
}

/// A JSON value as text: strings without their quotes, anything else as JSON.
fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
