//! `countersign policy replay AGENT --candidate FILE [--since 7d]`: the gateway's
//! `POST /v1/agents/{agent}/replay`, as a table per tool, the approvals a day each approver
//! group would be asked for, examples, and what would become of the calls waiting now.
//! `countersign policy suggest AGENT [--since 30d]`: its `GET /v1/agents/{agent}/suggestions`,
//! each suggestion with its evidence and replay, a candidate file written on request.
//! `countersign policy reviewer AGENT [--since 30d] [--replay [--limit 50]]`: its `GET
//! /v1/agents/{agent}/reviewer` (or, replayed, `POST /v1/agents/{agent}/reviewer/replay`),
//! how the agent's reviewer models agreed with its people.

use crate::args::PolicyCommand;
use crate::client::Gateway;
use crate::error::CliError;
use crate::render::{Table, moment, print_json};
use countersign_model::replay::{CallRef, Report};
use countersign_model::span::Span;
use serde_json::{Value, json};

pub(super) async fn run(
    gateway: &Gateway,
    command: PolicyCommand,
    json: bool,
) -> Result<(), CliError> {
    match command {
        PolicyCommand::Replay {
            agent,
            candidate,
            since,
        } => replay(gateway, agent, candidate, since, json).await,
        PolicyCommand::Suggest {
            agent,
            since,
            min_calls,
            min_deciders,
            write,
            pick,
        } => {
            let asked = Suggest {
                since,
                min_calls,
                min_deciders,
            };
            suggest(gateway, &agent, &asked, write.as_deref(), pick, json).await
        }
        PolicyCommand::Reviewer {
            agent,
            since,
            replay,
            limit,
        } => {
            let replay = replay.then_some(limit);
            reviewer(gateway, &agent, &since, replay, json).await
        }
    }
}

/// The agreement report over `since`: the verdicts recorded, or with `replay`, the models
/// asked now about at most that many calls.
async fn reviewer(
    gateway: &Gateway,
    agent: &str,
    since: &str,
    replay: Option<usize>,
    json: bool,
) -> Result<(), CliError> {
    since
        .parse::<Span>()
        .map_err(|e| CliError::Usage(format!("--since: {e}")))?;
    let answer = match replay {
        Some(limit) => {
            let url = gateway.url(&["v1", "agents", agent, "reviewer", "replay"]);
            let body = json!({"since": since, "limit": limit});
            gateway.post(url, &body).await?
        }
        None => {
            let mut url = gateway.url(&["v1", "agents", agent, "reviewer"]);
            url.query_pairs_mut().append_pair("since", since);
            gateway.get(url).await?
        }
    };
    if json {
        print_json(&answer);
    } else {
        print!("{}", agreement_rendered(&answer, since));
    }
    Ok(())
}

/// The reviewer models' agreement for a person: a row per tool, then the disagreements.
fn agreement_rendered(answer: &Value, since: &str) -> String {
    let mut out = format!(
        "Reviewer models of {} in the last {since} ({} runs read)\n",
        answer["agent"].as_str().unwrap_or_default(),
        answer["runs"]
    );
    let replayed = &answer["replayed"];
    if replayed.is_object() {
        out += &format!(
            "Asked now about {} calls people settled ({} more left out by the limit)\n",
            replayed["asked"], replayed["left_out"]
        );
    }
    out += "\n";
    let tools = answer["tools"].as_object().cloned().unwrap_or_default();
    if tools.is_empty() {
        return out + "No verdict in the window.\n";
    }
    let count = |v: &Value, key: &str| v[key].as_u64().unwrap_or(0).to_string();
    let mut table = Table::new(&[
        "TOOL",
        "REVIEWED",
        "APPROVE",
        "ASK",
        "OUTSIDE",
        "ERROR",
        "AGREED",
        "MS MEAN",
        "TOKENS IN/OUT",
        "DECIDED",
    ]);
    for (tool, t) in &tools {
        table.row(vec![
            tool.clone(),
            count(t, "reviewed"),
            count(&t["verdicts"], "approve"),
            count(&t["verdicts"], "ask_person"),
            count(&t["verdicts"], "outside_envelope"),
            count(&t["verdicts"], "error"),
            t["agreement"]
                .as_f64()
                .map_or("-".into(), |a| format!("{:.0}%", a * 100.0)),
            format!("{:.0}", t["ms_mean"].as_f64().unwrap_or(0.0)),
            format!(
                "{}/{}",
                count(&t["tokens"], "input"),
                count(&t["tokens"], "output")
            ),
            count(t, "decided"),
        ]);
    }
    out += &format!("{table}");
    for (tool, t) in &tools {
        for d in t["approved_but_refused"].as_array().into_iter().flatten() {
            out += &format!(
                "\n{tool}: would have approved, a person {}: {} {} {}\n  its reason: {}\n",
                d["settled"].as_str().unwrap_or_default(),
                d["run_id"].as_str().unwrap_or_default(),
                d["call_id"].as_str().unwrap_or_default(),
                d["input"],
                d["reason"].as_str().unwrap_or_default()
            );
        }
    }
    out
}

async fn replay(
    gateway: &Gateway,
    agent: String,
    candidate: std::path::PathBuf,
    since: String,
    json: bool,
) -> Result<(), CliError> {
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

/// What `policy suggest` asks the gateway for.
struct Suggest {
    since: String,
    min_calls: usize,
    min_deciders: usize,
}

async fn suggest(
    gateway: &Gateway,
    agent: &str,
    asked: &Suggest,
    write: Option<&std::path::Path>,
    pick: usize,
    json: bool,
) -> Result<(), CliError> {
    asked
        .since
        .parse::<Span>()
        .map_err(|e| CliError::Usage(format!("--since: {e}")))?;
    let mut url = gateway.url(&["v1", "agents", agent, "suggestions"]);
    url.query_pairs_mut()
        .append_pair("since", &asked.since)
        .append_pair("min_calls", &asked.min_calls.to_string())
        .append_pair("min_deciders", &asked.min_deciders.to_string());
    let answer = gateway.get(url).await?;
    if let Some(path) = write {
        let listed = answer["suggestions"].as_array().map_or(0, Vec::len);
        let Some(chosen) = pick
            .checked_sub(1)
            .and_then(|i| answer["suggestions"].get(i))
        else {
            return Err(CliError::Usage(format!(
                "--pick {pick}: there are {listed} suggestions"
            )));
        };
        let text = chosen["candidate"].as_str().unwrap_or_default();
        std::fs::write(path, text).map_err(|e| {
            CliError::Usage(format!("--write: cannot write {}: {e}", path.display()))
        })?;
    }
    if json {
        print_json(&answer);
    } else {
        print!("{}", suggestions_rendered(&answer, &asked.since));
        if let Some(path) = write {
            println!(
                "\nWrote suggestion {pick}'s candidate to {}",
                path.display()
            );
        }
    }
    Ok(())
}

/// The suggestions for a person: each bound, its evidence, what its replay changes.
fn suggestions_rendered(answer: &Value, since: &str) -> String {
    let mut out = format!(
        "{} held calls settled in {} runs of {} in the last {since} ({} runs no longer retained)\n",
        answer["held"],
        answer["runs"],
        answer["agent"].as_str().unwrap_or_default(),
        answer["runs_not_retained"]
    );
    let listed = answer["suggestions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if listed.is_empty() {
        out += "\nNo suggestion: no tool has enough approvals below every call a person refused.\n";
    }
    for (n, s) in listed.iter().enumerate() {
        let e = &s["evidence"];
        let deciders: Vec<&str> = e["deciders"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let verdict = if s["disqualified"] == true {
            "DISQUALIFIED: it would have run calls a person refused"
        } else {
            "no outcome a person chose would change"
        };
        out += &format!(
            "\n{}. {}: let run without asking when {}  ({verdict})\n",
            n + 1,
            s["tool"].as_str().unwrap_or_default(),
            s["release"].as_str().unwrap_or_default(),
        );
        out += &format!(
            "   {} approved as asked, none rejected or edited, by {} ({}), {} to {}\n",
            e["approved"],
            deciders.len(),
            deciders.join(", "),
            moment(e["first_at"].as_i64().unwrap_or_default()),
            moment(e["last_at"].as_i64().unwrap_or_default()),
        );
        if e["unanswered"].as_u64().unwrap_or(0) > 0 {
            out += &format!(
                "   {} within it nobody decided in time; it would have run them\n",
                e["unanswered"]
            );
        }
        match e["nearest_refused"].as_object() {
            Some(near) => {
                out += &format!(
                    "   nearest refused: {} {} {} = {} ({})\n",
                    near["run_id"].as_str().unwrap_or_default(),
                    near["call_id"].as_str().unwrap_or_default(),
                    s["field"].as_str().unwrap_or_default(),
                    near["value"],
                    near["settled"].as_str().unwrap_or_default(),
                );
            }
            None => out += "   nothing was refused; the bound is the largest value approved\n",
        }
        let r = &s["replay"];
        out += &format!(
            "   replayed: {} of {} calls newly released, {} unchanged\n",
            r["newly_released"], r["calls"], r["unchanged"]
        );
        for d in s["disqualifiers"].as_array().into_iter().flatten() {
            out += &format!(
                "   would have run: {} {} {}\n",
                d["run_id"].as_str().unwrap_or_default(),
                d["call_id"].as_str().unwrap_or_default(),
                d["input"]
            );
        }
        out += &format!(
            "   when: {}\n      → {}\n",
            s["when"]["before"].as_str().unwrap_or_default(),
            s["when"]["after"].as_str().unwrap_or_default()
        );
        if let Some(g) = s["grant"].as_object() {
            let text = |k: &str| g[k].as_str().unwrap_or_default().to_string();
            out += &format!(
                "   or as a standing grant, approving a call waiting now:\n      countersign grant {} {} --digest {} --when '{}' --uses {} --for {}\n",
                text("run_id"),
                text("call_id"),
                text("digest"),
                text("condition"),
                g["max_uses"],
                text("expires_in")
            );
        }
    }
    out
}
