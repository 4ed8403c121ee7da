//! Delegations: `countersign delegate TO --for SPAN` hands your approvals to another person
//! (`POST /v1/delegations`); `delegations` lists those you made or received, `delegations ID`
//! shows one with the calls decided under it, and `undelegate ID` ends one.

use crate::args::{DelegateArgs, DelegationsArgs};
use crate::client::Gateway;
use crate::error::CliError;
use crate::render::{Table, clip, fields, moment, print_json, time_left};
use crate::view::{DelegationView, read};
use countersign_model::delegation::{Delegation, DelegationStatus};
use countersign_model::span::Span;
use serde_json::{Value, json};

pub(super) async fn delegate(
    gateway: &Gateway,
    args: DelegateArgs,
    json: bool,
) -> Result<(), CliError> {
    // A span that cannot be read is a usage error; nothing is sent.
    args.lasts
        .parse::<Span>()
        .map_err(|e| CliError::Usage(format!("--for: {e}")))?;
    let mut body = json!({"to": args.to, "for": args.lasts});
    for (name, value) in [
        ("reason", args.reason),
        ("from", args.from),
        ("by", args.by),
    ] {
        if let Some(value) = value {
            body[name] = value.into();
        }
    }
    let answer = gateway
        .post(gateway.url(&["v1", "delegations"]), &body)
        .await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let view: DelegationView = read(answer)?;
    let d = &view.delegation;
    println!(
        "{} decides in {}'s place until {} ({}): delegation {}",
        d.to,
        d.from,
        moment(d.ends_at),
        time_left(d.ends_at),
        d.id
    );
    Ok(())
}

pub(super) async fn list(
    gateway: &Gateway,
    args: DelegationsArgs,
    json: bool,
) -> Result<(), CliError> {
    if let Some(id) = &args.delegation {
        return show(gateway, id, json).await;
    }
    let mut url = gateway.url(&["v1", "delegations"]);
    if args.active {
        url.query_pairs_mut().append_pair("status", "active");
    }
    if let Some(person) = &args.person {
        url.query_pairs_mut().append_pair("person", person);
    }
    let answer = gateway.get(url).await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let listed: Vec<DelegationView> = read(answer["delegations"].clone())?;
    let mut table = Table::new(&["DELEGATION", "STATUS", "FROM", "TO", "ENDS", "REASON"]);
    for view in listed {
        let d = &view.delegation;
        table.row(vec![
            d.id.clone(),
            status(view.status).to_string(),
            d.from.clone(),
            d.to.clone(),
            ends(d, view.status),
            clip(d.reason.as_deref().unwrap_or_default(), 50),
        ]);
    }
    if table.is_empty() {
        println!("No delegations.");
    } else {
        print!("{table}");
    }
    Ok(())
}

/// One delegation and the calls decided under it.
async fn show(gateway: &Gateway, id: &str, json: bool) -> Result<(), CliError> {
    let answer = gateway.get(gateway.url(&["v1", "delegations", id])).await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let view: DelegationView = read(answer)?;
    let d = &view.delegation;
    let ended = d.ended.as_ref().map_or_else(String::new, |e| {
        let why = e
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        format!("by {} at {}{why}", e.by, moment(e.at))
    });
    print!(
        "{}",
        fields(&[
            ("delegation", d.id.clone()),
            ("status", status(view.status).to_string()),
            ("hands", format!("{}'s approvals to {}", d.from, d.to)),
            (
                "made",
                format!("by {} at {}", d.created_by, moment(d.created_at))
            ),
            ("ends", ends(d, view.status)),
            ("ended", ended),
            ("reason", d.reason.clone().unwrap_or_default()),
        ])
    );
    if view.used_by.is_empty() {
        println!("\nNothing was decided under it.");
    } else {
        let mut table = Table::new(&["DECIDED AT", "RUN", "CALL"]);
        for used in &view.used_by {
            table.row(vec![
                moment(used.at),
                used.run_id.clone(),
                used.call_id.clone(),
            ]);
        }
        print!("\nThe calls decided under it:\n{table}");
    }
    Ok(())
}

pub(super) async fn end(
    gateway: &Gateway,
    id: &str,
    reason: Option<String>,
    by: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let mut body = json!({});
    for (name, value) in [("reason", reason), ("by", by)] {
        if let Some(value) = value {
            body[name] = value.into();
        }
    }
    let url = gateway.url(&["v1", "delegations", id, "end"]);
    let answer: Value = gateway.post(url, &body).await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let view: DelegationView = read(answer)?;
    let d = &view.delegation;
    let by = d.ended.as_ref().map_or("", |e| e.by.as_str());
    println!(
        "delegation {} is ended (by {by}): {} no longer decides in {}'s place",
        d.id, d.to, d.from
    );
    Ok(())
}

fn status(status: DelegationStatus) -> &'static str {
    match status {
        DelegationStatus::Active => "active",
        DelegationStatus::Ended => "ended",
        DelegationStatus::Expired => "expired",
    }
}

/// When an active delegation ends, as time left; when another was to end, as a moment.
fn ends(d: &Delegation, status: DelegationStatus) -> String {
    match status {
        DelegationStatus::Active => time_left(d.ends_at),
        _ => moment(d.ends_at),
    }
}
