//! `countersign watch [--run RUN]`: follows runs as things happen to them, a line per audit
//! entry (a call held, a channel told, a decision, an execution, an expiry, the run's end),
//! until interrupted.
//!
//! It polls the gateway's API rather than subscribing to NATS: the key is the only credential
//! a reviewer's terminal holds (NATS is the services' network, with users only for them), the
//! key's role decides what it may read, and the audit trail already is each run's ordered,
//! complete history, with who acted and when, where an event subscription would see only what
//! happened while it was connected. Without `--run`, the runs followed are those that
//! appear among the held calls (runs that pause); the history of those held at the start
//! is not replayed. With `--run`, the run's trail is shown from its start and the command
//! ends with the run.

use super::audit::entry_cells;
use super::pending::all_pending;
use crate::args::WatchArgs;
use crate::client::Gateway;
use crate::error::CliError;
use crate::view::{Trail, read};
use countersign_model::audit::AuditKind;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

pub async fn run(gateway: &Gateway, args: WatchArgs, json: bool) -> Result<(), CliError> {
    tokio::select! {
        // Interrupting is how a watch ends; it is not a failure.
        _ = tokio::signal::ctrl_c() => Ok(()),
        result = follow(gateway, &args, json) => result,
    }
}

async fn follow(gateway: &Gateway, args: &WatchArgs, json: bool) -> Result<(), CliError> {
    if let Some(run) = &args.run {
        // A run that does not exist is an error now, not a wait for ever.
        gateway.get(gateway.url(&["v1", "runs", run])).await?;
    }
    // How many elements of each followed run's trail have been shown.
    let mut shown: BTreeMap<String, usize> = BTreeMap::new();
    let mut ended: BTreeSet<String> = BTreeSet::new();
    let mut first = true;
    let mut unreachable = false;
    let mut tick = tokio::time::interval(Duration::from_millis(args.interval_ms));
    loop {
        tick.tick().await;
        match poll(gateway, args, json, first, &mut shown, &mut ended).await {
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
        if args.run.as_ref().is_some_and(|run| ended.contains(run)) {
            return Ok(());
        }
    }
}

/// One look: finds the runs to follow and prints what their trails gained since the last.
async fn poll(
    gateway: &Gateway,
    args: &WatchArgs,
    json: bool,
    first: bool,
    shown: &mut BTreeMap<String, usize>,
    ended: &mut BTreeSet<String>,
) -> Result<(), CliError> {
    let runs = match &args.run {
        Some(run) => vec![run.clone()],
        None => paused_runs(gateway).await?,
    };
    let mut skip_history = BTreeSet::new();
    for run in runs {
        if !ended.contains(&run) && !shown.contains_key(&run) {
            if first && args.run.is_none() {
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
