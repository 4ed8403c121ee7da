//! `countersign approve | reject --from FILE|-`: a decision on each call a listing names, the
//! listing being what `countersign pending --json` printed (`-` reads it from standard input,
//! so `pending … --json | approve --from -` decides exactly what was listed). Each decision
//! quotes the digest the listing gives for its call, never one looked up now, so a call that
//! changed since it was listed is refused by the gateway while the others are recorded. The
//! decisions go in `POST /v1/decisions`, 100 a request (the most the gateway takes).

use crate::client::Gateway;
use crate::error::CliError;
use crate::render::print_json;
use serde::Deserialize;
use serde_json::{Value, json};
use std::io::Read;

/// The most decisions the gateway takes in one request.
const MAX_BATCH: usize = 100;

/// A call as the listing gives it; whatever else it says is not needed to decide it.
#[derive(Deserialize)]
pub(super) struct Listed {
    pub(super) run_id: String,
    pub(super) call_id: String,
    pub(super) digest: String,
}

/// What `pending --json` prints.
#[derive(Deserialize)]
struct Listing {
    approvals: Vec<Listed>,
}

/// The calls of the listing in `from` (a file, or `-` for standard input).
fn read_listing(from: &str) -> Result<Vec<Listed>, CliError> {
    let text = if from == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| CliError::Usage(format!("could not read standard input: {e}")))?;
        text
    } else {
        std::fs::read_to_string(from)
            .map_err(|e| CliError::Usage(format!("could not read {from}: {e}")))?
    };
    let listing: Listing = serde_json::from_str(&text).map_err(|e| {
        CliError::Usage(format!(
            "--from takes what `countersign pending --json` prints, {{\"approvals\": [{{\"run_id\", \
             \"call_id\", \"digest\", …}}]}}; {} is not that ({e}), so nothing was sent",
            if from == "-" { "standard input" } else { from }
        ))
    })?;
    Ok(listing.approvals)
}

/// The one call of the listing in `from`: a grant is made from one call the person saw.
pub(super) fn one(from: &str) -> Result<Listed, CliError> {
    let mut listed = read_listing(from)?;
    match listed.len() {
        1 => Ok(listed.remove(0)),
        n => Err(CliError::Usage(format!(
            "a grant is made from one call, and the listing names {n}: narrow `countersign \
             pending` (--agent, --tool, --where) to the call meant; nothing was sent"
        ))),
    }
}

/// Sends `decision` (its action and reason) on each listed call, quoting its listed digest,
/// and prints what became of each; any refused makes it fail (exit 1), listing them.
pub(super) async fn send(
    gateway: &Gateway,
    from: &str,
    decision: Value,
    decided_by: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let listed = read_listing(from)?;
    if listed.is_empty() {
        if !json {
            println!("The listing names no call: nothing was sent.");
        }
        return Ok(());
    }
    let mut results = Vec::with_capacity(listed.len());
    let mut by = None;
    for chunk in listed.chunks(MAX_BATCH) {
        let decisions: Vec<Value> = chunk
            .iter()
            .map(|call| {
                let mut one = decision.clone();
                one["run_id"] = call.run_id.clone().into();
                one["call_id"] = call.call_id.clone().into();
                one["digest"] = call.digest.clone().into();
                one
            })
            .collect();
        let mut body = json!({ "decisions": decisions });
        if let Some(by) = &decided_by {
            body["decided_by"] = by.clone().into();
        }
        let mut answer = gateway
            .post(gateway.url(&["v1", "decisions"]), &body)
            .await?;
        by = answer["decided_by"].as_str().map(String::from);
        if let Some(list) = answer["results"].as_array_mut() {
            results.append(list);
        }
    }
    if json {
        print_json(&json!({"decided_by": by, "results": results}));
    } else {
        let done = match decision["action"].as_str() {
            Some("reject") => "rejected",
            _ => "approved",
        };
        let by = by.as_deref().unwrap_or_default();
        for r in &results {
            println!("{}", said(r, by, done));
        }
    }
    let refused: Vec<String> = results
        .iter()
        .filter(|r| r["status"] == "refused")
        .map(|r| format!("  {}: {}", call_of(r), why(r)))
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    Err(CliError::Failed(format!(
        "{} of the {} listed calls were not decided:\n{}\nA call that changed since it was listed is \
         decided only on what it shows now: look again with `countersign show RUN`.",
        refused.len(),
        results.len(),
        refused.join("\n")
    )))
}

/// One result as a line: `RUN CALL: approved by rita, recorded`.
fn said(result: &Value, by: &str, done: &str) -> String {
    let call = call_of(result);
    match result["status"].as_str() {
        Some("refused") => format!("{call}: refused: {}", why(result)),
        Some("approval_recorded") => format!(
            "{call}: {by}'s approval is recorded, {} of {} needed",
            result["approvals"], result["quorum"]
        ),
        Some("already_recorded") => format!("{call}: {by} had already {done} it, nothing changed"),
        _ => format!("{call}: {done} by {by}, recorded"),
    }
}

/// `RUN CALL` of a result.
fn call_of(result: &Value) -> String {
    format!(
        "{} {}",
        result["run_id"].as_str().unwrap_or_default(),
        result["call_id"].as_str().unwrap_or_default()
    )
}

/// Why a result was refused: the gateway's message, its status and code.
fn why(result: &Value) -> String {
    format!(
        "{} ({} {})",
        result["error"]["message"].as_str().unwrap_or("refused"),
        result["http_status"],
        result["error"]["code"].as_str().unwrap_or_default()
    )
}
