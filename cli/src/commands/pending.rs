//! `countersign pending`: every call waiting for a decision, across the gateway's pages, most
//! urgent first (the nearest deadline, then the longest wait), kept by agent, tool, requester
//! and a CEL condition on the input. `--json` prints the calls kept, each with its run, call
//! and digest: what `approve --from` decides.

use crate::args::PendingArgs;
use crate::client::Gateway;
use crate::error::CliError;
use crate::render::{Table, clip, parse_moment, print_json, time_left, waiting};
use crate::view::{Approval, read};
use countersign_model::condition::Condition;
use serde_json::{Value, json};

/// The most calls the gateway gives in one page.
const PAGE: &str = "500";

pub(super) async fn run(gateway: &Gateway, args: PendingArgs, json: bool) -> Result<(), CliError> {
    // Checked before anything is asked: a condition that does not compile is a usage error.
    let condition = args
        .condition
        .as_deref()
        .map(Condition::compile)
        .transpose()
        .map_err(|e| CliError::Usage(format!("--where: {e}")))?;
    let mut approvals = all_pending(gateway).await?;
    let in_all = approvals.len();
    approvals.retain(|a| {
        args.agent.as_ref().is_none_or(|agent| a["agent"] == *agent)
            && args.tool.as_ref().is_none_or(|tool| a["tool"] == *tool)
            && args
                .requested_by
                .as_ref()
                .is_none_or(|who| a["requested_by"] == *who)
            && condition.as_ref().is_none_or(|c| c.matches(&a["input"]))
    });
    if json {
        print_json(&json!({ "approvals": approvals }));
        return Ok(());
    }
    let mut calls: Vec<Approval> = approvals.into_iter().map(read).collect::<Result<_, _>>()?;
    calls.sort_by_key(|a| (a.deadline.unwrap_or(i64::MAX), a.paused_at.clone()));
    let mut table = Table::new(&["SUMMARY", "AGENT", "ASKED BY", "TIME LEFT", "RUN", "CALL"]);
    for call in calls {
        // Every held call has a deadline; a gateway that does not list it shows the wait.
        let left = match call.deadline {
            Some(deadline) => time_left(deadline),
            None => parse_moment(&call.paused_at)
                .map(waiting)
                .unwrap_or_default(),
        };
        table.row(vec![
            clip(&call.summary, 60),
            call.agent,
            call.requested_by.unwrap_or_default(),
            left,
            call.run_id,
            call.call_id,
        ]);
    }
    if table.is_empty() && in_all > 0 {
        // Said, so a misspelt agent or tool is not taken for an empty queue.
        println!(
            "Nothing waiting matches {}; {in_all} {} in all.",
            filters(&args),
            if in_all == 1 {
                "call waits"
            } else {
                "calls wait"
            }
        );
    } else if table.is_empty() {
        println!("Nothing is waiting for a decision.");
    } else {
        print!("{table}");
    }
    Ok(())
}

/// The filters given, as typed: `--agent billing --where 'input.amount < 50'`.
fn filters(args: &PendingArgs) -> String {
    [
        ("--agent", &args.agent),
        ("--tool", &args.tool),
        ("--requested-by", &args.requested_by),
        ("--where", &args.condition),
    ]
    .iter()
    .filter_map(|(flag, value)| value.as_ref().map(|v| format!("{flag} {v:?}")))
    .collect::<Vec<_>>()
    .join(" ")
}

/// Every held call, following the gateway's cursor to the last page.
pub(super) async fn all_pending(gateway: &Gateway) -> Result<Vec<Value>, CliError> {
    let mut approvals = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = gateway.url(&["v1", "approvals"]);
        url.query_pairs_mut()
            .append_pair("status", "pending")
            .append_pair("limit", PAGE);
        if let Some(cursor) = &cursor {
            url.query_pairs_mut().append_pair("cursor", cursor);
        }
        let mut page = gateway.get(url).await?;
        if let Some(list) = page["approvals"].as_array_mut() {
            approvals.append(list);
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return Ok(approvals),
        }
    }
}
