//! `countersign watch [--run RUN]`: follows runs as things happen to them until interrupted.
//!
//! With `--run`, it follows the run's live events (`GET /v1/runs/{id}/events`, server-sent
//! events) from its start: the model's text as it is written, each tool call and result, the
//! pause, each decision, the resume and the end, with which the command ends. A connection
//! that drops (a gateway restarting, a cut-off) is made again with `Last-Event-ID`, so
//! nothing is shown twice or missed.
//!
//! Without `--run`, it follows the runs that appear among the held calls (runs that pause),
//! a line per audit entry (a call held, a channel told, a decision, an execution, an expiry,
//! the run's end), by asking the API every `--interval-ms`; the history of runs held at the
//! start is not replayed. Both go through the API rather than NATS: the key is the only
//! credential a reviewer's terminal holds, and its role decides what it may read.

use super::audit::entry_cells;
use super::pending::all_pending;
use crate::args::WatchArgs;
use crate::client::Gateway;
use crate::error::CliError;
use crate::view::{Trail, read};
use countersign_model::audit::AuditKind;
use countersign_model::live::ENDINGS;
use countersign_model::sse::{Decoder, Event};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

pub(super) async fn run(gateway: &Gateway, args: WatchArgs, json: bool) -> Result<(), CliError> {
    tokio::select! {
        // Interrupting is how a watch ends; it is not a failure.
        _ = tokio::signal::ctrl_c() => Ok(()),
        result = follow(gateway, &args, json) => result,
    }
}

async fn follow(gateway: &Gateway, args: &WatchArgs, json: bool) -> Result<(), CliError> {
    if let Some(run) = &args.run {
        return follow_run(gateway, run, args.interval_ms, json).await;
    }
    // How many elements of each followed run's trail have been shown.
    let mut shown: BTreeMap<String, usize> = BTreeMap::new();
    let mut ended: BTreeSet<String> = BTreeSet::new();
    let mut first = true;
    let mut unreachable = false;
    let mut tick = tokio::time::interval(Duration::from_millis(args.interval_ms));
    loop {
        tick.tick().await;
        match poll(gateway, json, first, &mut shown, &mut ended).await {
            Ok(()) => {
                if unreachable {
                    eprintln!("countersign: the gateway answers again");
                }
                // From here on, a run that pauses is followed from its start.
                if first {
                    eprintln!("countersign: watching; interrupt to stop");
                }
                unreachable = false;
                first = false;
            }
            // A gateway away for a moment (restarting, or waiting for Redis) is waited for.
            Err(e) if is_transient(&e) => {
                if !unreachable {
                    eprintln!("countersign: {e}; still trying");
                }
                unreachable = true;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Follows one run's live events until it ends, connecting again after what it has shown
/// when a connection drops; a gateway away is waited for, `interval_ms` between tries.
async fn follow_run(
    gateway: &Gateway,
    run: &str,
    interval_ms: u64,
    json: bool,
) -> Result<(), CliError> {
    let url = gateway.url(&["v1", "runs", run, "events"]);
    let mut shown = Shown::default();
    let mut away = false;
    loop {
        match gateway.events(url.clone(), shown.last_id.as_deref()).await {
            // Everything has been shown and the run has ended.
            Ok(None) => return Ok(()),
            Ok(Some(mut response)) => {
                if away {
                    eprintln!("countersign: the gateway answers again");
                    away = false;
                }
                let mut decoder = Decoder::default();
                loop {
                    match response.chunk().await {
                        Ok(Some(bytes)) => {
                            for event in decoder.push(&bytes) {
                                if shown.show(run, &event, json) {
                                    return Ok(());
                                }
                            }
                        }
                        // Cut off, or the gateway is going away: connect again.
                        Ok(None) => break,
                        Err(e) => {
                            eprintln!("countersign: the stream broke ({e}); connecting again");
                            break;
                        }
                    }
                }
            }
            Err(e) if is_transient(&e) => {
                if !away {
                    eprintln!("countersign: {e}; still trying");
                }
                away = true;
                tokio::time::sleep(Duration::from_millis(interval_ms)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// What `watch --run` has shown: the last event's id, and whether the model's text is
/// mid-line.
#[derive(Default)]
struct Shown {
    last_id: Option<String>,
    in_text: bool,
}

impl Shown {
    /// Shows one event: its JSON with `--json`, else the model's text as it comes and a line
    /// for anything else. Whether it was the run's last.
    fn show(&mut self, run: &str, event: &Event, json: bool) -> bool {
        use std::io::Write;
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            return false;
        };
        if event.id.is_some() {
            self.last_id.clone_from(&event.id);
        }
        if json {
            println!("{data}");
        } else if event.event == "text.delta" {
            print!("{}", data["text"].as_str().unwrap_or_default());
            let _ = std::io::stdout().flush();
            self.in_text = true;
        } else {
            if std::mem::take(&mut self.in_text) {
                println!();
            }
            println!(
                "{run}  {:18}  {}",
                event.event,
                summary(&event.event, &data)
            );
        }
        ENDINGS.contains(&event.event.as_str())
    }
}

/// One event's gist, for a person.
fn summary(kind: &str, data: &Value) -> String {
    let s = |key: &str| data[key].as_str().unwrap_or_default().to_string();
    match kind {
        "turn.started" | "run.resumed" => format!("turn {}", data["turn"]),
        "tool.call" => format!(
            "{} {} {} ({})",
            s("call_id"),
            s("tool"),
            data["input"],
            match data["disposition"].as_str() {
                Some("held") => "waits for a person",
                Some("refused") => "refused",
                _ => "runs now",
            }
        ),
        "tool.result" => format!("{} {}: {}", s("call_id"), s("outcome"), s("content")),
        "approval.requested" => {
            let calls = data["calls"].as_array().into_iter().flatten();
            let calls: Vec<String> = calls
                .map(|c| {
                    format!(
                        "{} {}",
                        c["call_id"].as_str().unwrap_or_default(),
                        c["tool"].as_str().unwrap_or_default()
                    )
                })
                .collect();
            format!("waiting for a person: {}", calls.join(", "))
        }
        "approval.decided" => format!(
            "{} {} by {} ({})",
            s("call_id"),
            s("action"),
            s("decided_by"),
            s("door")
        ),
        "run.completed" => {
            // A run completes when the model answers, also after a call of it failed.
            let failed: Vec<String> = data["failed_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let text = |key: &str| c[key].as_str().unwrap_or_default().to_string();
                    format!("{} {}", text("call_id"), text("tool"))
                })
                .collect();
            match failed.len() {
                0 => s("answer"),
                n => format!(
                    "{} ({n} failed call(s): {})",
                    s("answer"),
                    failed.join(", ")
                ),
            }
        }
        "run.failed" => s("error"),
        "run.cancelled" => format!("by {}", s("cancelled_by")),
        "stream.cut" => "reading too slowly; connecting again".to_string(),
        _ => data.to_string(),
    }
}

/// One look: finds the runs to follow and prints what their trails gained since the last.
async fn poll(
    gateway: &Gateway,
    json: bool,
    first: bool,
    shown: &mut BTreeMap<String, usize>,
    ended: &mut BTreeSet<String>,
) -> Result<(), CliError> {
    let runs = paused_runs(gateway).await?;
    let mut skip_history = BTreeSet::new();
    for run in runs {
        if !ended.contains(&run) && !shown.contains_key(&run) {
            if first {
                skip_history.insert(run.clone());
            }
            shown.insert(run, 0);
        }
    }
    for (run, seen) in shown.iter_mut() {
        let Some(trail) = trail(gateway, run).await? else {
            continue;
        };
        if skip_history.contains(run) {
            *seen = trail.entries.len();
        }
        for element in trail.entries.iter().skip(*seen) {
            print_element(run, element, json);
        }
        *seen = trail.entries.len();
        if trail.entries.iter().any(is_end) {
            ended.insert(run.clone());
        }
    }
    shown.retain(|run, _| !ended.contains(run));
    Ok(())
}

/// The runs with calls waiting (every page: the newest come last).
async fn paused_runs(gateway: &Gateway) -> Result<Vec<String>, CliError> {
    let approvals = all_pending(gateway).await?;
    let runs = approvals
        .iter()
        .filter_map(|a| a["run_id"].as_str().map(str::to_string));
    Ok(runs.collect::<BTreeSet<_>>().into_iter().collect())
}

/// The run's trail, or `None` while it has none (a run that has not yet paused).
async fn trail(gateway: &Gateway, run: &str) -> Result<Option<Trail>, CliError> {
    match gateway
        .get(gateway.url(&["v1", "runs", run, "audit"]))
        .await
    {
        Ok(answer) => read(answer).map(Some),
        Err(CliError::Refused(r)) if r.status == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

fn is_transient(error: &CliError) -> bool {
    match error {
        CliError::Unreachable(_) => true,
        CliError::Refused(r) => r.status == 503,
        _ => false,
    }
}

fn is_end(element: &Value) -> bool {
    Trail::entry(element).is_some_and(|e| {
        matches!(
            e.kind,
            AuditKind::Completed | AuditKind::Failed | AuditKind::Cancelled
        )
    })
}

/// One line: the element as JSON with `--json`, else when, which run, what, and the rest.
fn print_element(run: &str, element: &Value, json: bool) {
    if json {
        println!("{element}");
        return;
    }
    let (at, rest) = match Trail::entry(element) {
        Some(entry) => {
            let mut cells = entry_cells(&entry);
            // The kind padded, so that most lines line up.
            cells[1] = format!("{:9}", cells[1]);
            (cells.remove(0), cells)
        }
        None => (String::new(), vec!["(unreadable entry)".to_string()]),
    };
    let line: Vec<String> = [at, run.to_string()]
        .into_iter()
        .chain(rest)
        .filter(|cell| !cell.is_empty())
        .collect();
    println!("{}", line.join("  "));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_completed_run_says_which_of_its_calls_failed() {
        let done = json!({"answer": "All done.", "failed_calls": []});
        assert_eq!(summary("run.completed", &done), "All done.");
        let failed = json!({"answer": "I could not refund it.", "failed_calls": [
            {"call_id": "toolu_2", "tool": "issue_refund", "outcome": "failed", "error": "401"},
        ]});
        assert_eq!(
            summary("run.completed", &failed),
            "I could not refund it. (1 failed call(s): toolu_2 issue_refund)"
        );
    }
}
