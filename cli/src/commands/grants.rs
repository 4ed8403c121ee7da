//! Standing grants: `countersign grant RUN CALL --digest D --when CEL --uses N --for SPAN`
//! approves the call and lets a grant approve later calls like it (`POST /v1/grants`); with
//! `--from` instead of the call, the one call a `pending --json` listing names;
//! `grants` lists them, `grants ID` shows one with the calls it approved, and `revoke ID`
//! ends one. The condition is compiled here first, so a typo is a usage error and nothing is
//! sent; whether it covers the call, and what the policy allows, the gateway decides.

use super::decide::digest;
use super::listed;
use crate::args::{Decide, GrantArgs, GrantsArgs};
use crate::client::Gateway;
use crate::error::CliError;
use crate::render::{Table, clip, fields, indent, moment, print_json, time_left};
use crate::view::{GrantView, read};
use countersign_model::condition::Condition;
use countersign_model::grant::{Grant, GrantStatus};
use serde_json::{Value, json};

pub(super) async fn grant(gateway: &Gateway, args: GrantArgs, json: bool) -> Result<(), CliError> {
    let condition =
        Condition::compile(&args.condition).map_err(|e| CliError::Usage(format!("--when: {e}")))?;
    let (run, call, digest) = match (args.call.shown, &args.call.from) {
        (Some(shown), _) => {
            let decide = Decide {
                shown,
                decided_by: None,
            };
            let quoted = digest(&decide)?.to_string();
            (decide.shown.run, decide.shown.call, quoted)
        }
        (None, Some(from)) => {
            let one = listed::one(from)?;
            (one.run_id, one.call_id, one.digest)
        }
        (None, None) => {
            return Err(CliError::Usage(
                "name the call (RUN CALL --digest D) or a listing of one call (--from FILE)".into(),
            ));
        }
    };
    let mut body = json!({
        "run_id": run, "call_id": call, "digest": digest,
        "condition": condition.source(), "max_uses": args.uses,
        "expires_in": args.expires_in, "same_requester": args.same_requester,
    });
    if let (Some(sum), Some(max)) = (&args.total_of, args.max_total) {
        Condition::compile(sum).map_err(|e| CliError::Usage(format!("--total-of: {e}")))?;
        body["total"] = json!({"sum": sum, "max": max});
    }
    if let Some(by) = &args.call.decided_by {
        body["decided_by"] = by.clone().into();
    }
    let answer = gateway.post(gateway.url(&["v1", "grants"]), &body).await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let by = answer["decided_by"].as_str().unwrap_or_default();
    match answer.get("grant") {
        Some(made) => {
            let made: GrantView = read(made.clone())?;
            println!(
                "{by} approved call {call} of run {run} and made grant {}:",
                made.grant.id
            );
            print!("{}", indent(&terms(&made.grant)));
        }
        None if answer.get("quorum").is_some() => println!(
            "{by}'s approval of call {} is counted: {} of {} needed; the grant is made once \
             they all approve it with the same terms",
            call, answer["approvals"], answer["quorum"]
        ),
        None => println!("{}", answer["message"].as_str().unwrap_or_default()),
    }
    if answer["resumes"] == true {
        println!("Every call of the turn is decided: run {run} resumes.");
    }
    Ok(())
}

pub(super) async fn list(gateway: &Gateway, args: GrantsArgs, json: bool) -> Result<(), CliError> {
    if let Some(id) = &args.grant {
        return show(gateway, id, json).await;
    }
    let mut url = gateway.url(&["v1", "grants"]);
    if args.active {
        url.query_pairs_mut().append_pair("status", "active");
    }
    for (name, value) in [("agent", &args.agent), ("tool", &args.tool)] {
        if let Some(value) = value {
            url.query_pairs_mut().append_pair(name, value);
        }
    }
    let answer = gateway.get(url).await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let grants: Vec<GrantView> = read(answer["grants"].clone())?;
    let mut table = Table::new(&[
        "GRANT",
        "STATUS",
        "USES",
        "EXPIRES",
        "TOOL",
        "MADE BY",
        "CONDITION",
    ]);
    for view in grants {
        let g = &view.grant;
        table.row(vec![
            g.id.clone(),
            status(view.status).to_string(),
            format!("{}/{}", g.uses, g.max_uses),
            expiry(g.expires_at, view.status),
            format!("{}/{}", g.agent, g.tool),
            g.granted_by.join(", "),
            clip(&g.condition, 60),
        ]);
    }
    if table.is_empty() {
        println!("No standing grants.");
    } else {
        print!("{table}");
    }
    Ok(())
}

/// One grant, its terms and the calls it approved.
async fn show(gateway: &Gateway, id: &str, json: bool) -> Result<(), CliError> {
    let answer = gateway.get(gateway.url(&["v1", "grants", id])).await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let view: GrantView = read(answer)?;
    let g = &view.grant;
    let revoked = g.revoked.as_ref().map_or_else(String::new, |r| {
        let why = r
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        format!("by {} at {}{why}", r.by, moment(r.at))
    });
    print!(
        "{}",
        fields(&[
            ("grant", g.id.clone()),
            ("status", status(view.status).to_string()),
            (
                "made on",
                format!("run {}, call {} ({})", g.run_id, g.call_id, g.channel)
            ),
            ("made at", moment(g.created_at)),
            ("revoked", revoked),
        ])
    );
    print!("{}", terms(g));
    if view.used_by.is_empty() {
        println!("\nIt has approved no call yet.");
    } else {
        let mut table = Table::new(&["APPROVED AT", "RUN", "CALL"]);
        for used in &view.used_by {
            table.row(vec![
                moment(used.at),
                used.run_id.clone(),
                used.call_id.clone(),
            ]);
        }
        print!("\nThe calls it approved:\n{table}");
    }
    Ok(())
}

pub(super) async fn revoke(
    gateway: &Gateway,
    id: &str,
    reason: Option<String>,
    revoked_by: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let mut body = json!({});
    if let Some(reason) = reason {
        body["reason"] = reason.into();
    }
    if let Some(by) = revoked_by {
        body["revoked_by"] = by.into();
    }
    let url = gateway.url(&["v1", "grants", id, "revoke"]);
    let answer: Value = gateway.post(url, &body).await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let view: GrantView = read(answer)?;
    let g = &view.grant;
    let by = g.revoked.as_ref().map_or("", |r| r.by.as_str());
    println!(
        "grant {} is revoked (by {by}): it approved {} of {} calls and approves no more",
        g.id, g.uses, g.max_uses
    );
    Ok(())
}

/// What a grant approves, one term a line.
fn terms(g: &Grant) -> String {
    fields(&[
        (
            "covers",
            format!("{} calls of {} where {}", g.agent, g.tool, g.condition),
        ),
        (
            "requester",
            g.requester
                .as_ref()
                .map(|r| format!("only runs of {r}"))
                .unwrap_or_default(),
        ),
        ("uses", format!("{} of {}", g.uses, g.max_uses)),
        (
            "total",
            g.total
                .as_ref()
                .map(|t| format!("{} of {}, the sum of {}", g.spent, t.max, t.sum))
                .unwrap_or_default(),
        ),
        (
            "expires",
            format!("{} ({})", moment(g.expires_at), time_left(g.expires_at)),
        ),
        ("made by", g.granted_by.join(", ")),
    ])
}

fn status(status: GrantStatus) -> &'static str {
    match status {
        GrantStatus::Active => "active",
        GrantStatus::UsedUp => "used up",
        GrantStatus::Expired => "expired",
        GrantStatus::Revoked => "revoked",
        GrantStatus::MakerGone => "maker gone",
    }
}

/// When an active grant ends, as time left; when an ended one was to end, as a moment.
fn expiry(expires_at: i64, status: GrantStatus) -> String {
    match status {
        GrantStatus::Active => time_left(expires_at),
        _ => moment(expires_at),
    }
}
