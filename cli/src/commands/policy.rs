//! `countersign policy replay AGENT --candidate FILE [--since 7d]`: the gateway's
//! `POST /v1/agents/{agent}/replay`, as a table per tool, the approvals a day each approver
//! group would be asked for, examples, and what would become of the calls waiting now.

use crate::args::PolicyCommand;
use crate::client::Gateway;
use crate::error::CliError;
use crate::render::{Table, print_json};
use countersign_model::replay::{CallRef, Report};
use countersign_model::span::Span;
use serde_json::{Value, json};

pub(super) async fn run(
    gateway: &Gateway,
    command: PolicyCommand,
    json: bool,
) -> Result<(), CliError> {
    let PolicyCommand::Replay {
        agent,
        candidate,
        since,
    } = command;
    since
        .parse::<Span>()
        .map_err(|e| CliError::Usage(format!("--since: {e}")))?;
    let text = std::fs::read_to_string(&candidate).map_err(|e| {
        CliError::Usage(format!(
            "--candidate: cannot read {}: {e}",
            candidate.display()
        ))
    })?;
    let url = gateway.url(&["v1", "agents", &agent, "replay"]);
    let answer = gateway
        .post(url, &json!({"candidate": text, "since": since}))
        .await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let report: Report = serde_json::from_value(answer.clone())
        .map_err(|e| CliError::Unreachable(format!("an answer that is not a report: {e}")))?;
    print!("{}", rendered(&report, &answer, &since));
    Ok(())
}

/// The report for a person.
fn rendered(report: &Report, answer: &Value, since: &str) -> String {
    let mut out = format!(
        "{} calls of {} runs of {} in the last {since} ({} runs no longer retained)\n\n",
        report.calls, answer["runs"], report.agent, answer["runs_not_retained"]
    );
    let mut tools = Table::new(&[
        "TOOL",
        "CALLS",
        "NEWLY HELD",
        "NEWLY RELEASED",
        "OTHER APPROVERS",
        "REFUSED",
        "UNCHANGED",
    ]);
    for (tool, c) in &report.tools {
        tools.row(vec![
            tool.clone(),
            c.calls.to_string(),
            c.newly_held.to_string(),
            c.newly_released.to_string(),
            c.other_reviewers.to_string(),
            c.refused.to_string(),
            c.unchanged.to_string(),
        ]);
    }
    out += &format!("{tools}\n");
    let mut load = Table::new(&["APPROVERS", "APPROVALS/DAY NOW", "WITH THE CANDIDATE"]);
    let forecast = &report.approvals_per_day;
    let groups: std::collections::BTreeSet<&String> = forecast
        .live
        .keys()
        .chain(forecast.candidate.keys())
        .collect();
    for group in groups {
        let per_day = |m: &std::collections::BTreeMap<String, f64>| {
            format!("{:.1}", m.get(group).copied().unwrap_or(0.0))
        };
        load.row(vec![
            group.clone(),
            per_day(&forecast.live),
            per_day(&forecast.candidate),
        ]);
    }
    if !load.is_empty() {
        out += &format!("{load}\n");
    }
    for (kind, examples) in &report.examples {
        out += &format!("{}, for example:\n", kind.replace('_', " "));
        for e in examples {
            out += &format!("  {} {} {} {}\n", e.run_id, e.call_id, e.tool, e.input);
        }
    }
    let waiting = &report.waiting;
    out += &format!(
        "\nWaiting now: {} released, {} held again, {} refused, {} unchanged\n",
        waiting.released.len(),
        waiting.reheld.len(),
        waiting.refused.len(),
        waiting.unchanged
    );
    let named = |label: &str, calls: &[CallRef]| {
        calls
            .iter()
            .map(|c| format!("  {label}: {} {} {}\n", c.run_id, c.call_id, c.tool))
            .collect::<String>()
    };
    out += &named("released", &waiting.released);
    out += &named("held again", &waiting.reheld);
    out += &named("refused", &waiting.refused);
    out
}
