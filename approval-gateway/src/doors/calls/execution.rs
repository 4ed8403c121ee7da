//! The execution record of a call released to the external agent that asked for it: the
//! agent runs such a call itself, so it says so, `POST /v1/runs/{run}/calls/{call}/execution`:
//! first `started` (claimed by one attempt, before the side effect), then `succeeded` with
//! the result or `failed` with the error. The claim is what keeps a call asked again (the
//! same idempotency key from another process, after a crash) from running twice: that
//! process finds it claimed, in the answer's `execution`, and does not run it. Each step is
//! written with its audit entry in one script step (`countersign_store::AgentStep`); only the
//! key that may hold the call's receipt (the one that asked, or an admin) writes it.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use axum::http::StatusCode;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::door::{DoorCall, ExecEnd, ExecStart, ExecStatus};
use countersign_model::one_call;
use countersign_model::run::{CallOutcome, Run};
use countersign_store::{AgentStep, AgentStepped};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::warn;

/// The longest attempt id taken.
const MAX_ATTEMPT_CHARS: usize = 128;

/// A step the agent reports.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Report {
    /// The agent's id for this attempt (random per attempt), the same for its claim and end.
    attempt: String,
    status: ExecStatus,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<String>,
}

/// Writes the reported step of `call_id` of `run`, once the caller may and the call was
/// released to the agent; `Ok` when it is written, or was already, as reported.
pub(super) async fn report(
    state: &AppState,
    caller: &Caller,
    run: &Run,
    call_id: &str,
    report: Report,
) -> Result<(), ApiError> {
    let status = status(&report)?;
    if !caller.holds_receipts(run.requested_by.as_deref()) {
        return Err(ApiError::for_status(
            StatusCode::FORBIDDEN,
            format!(
                "only the key that asked for the call (or an admin) reports how it ran; {} \
                 may not",
                caller.principal
            ),
        ));
    }
    if one_call::outcome(&run.messages) != Some(CallOutcome::Released) {
        return Err(ApiError::conflict(
            "not_released",
            format!(
                "call {call_id:?} is not released to the agent: it waits for its outcome, did \
                 not get one that lets it run, or countersign runs it (look at its status)"
            ),
        ));
    }
    let entry = audited(caller, run, call_id, &report);
    let now = entry.at;
    let start;
    let end;
    let step = match status {
        ExecStatus::Started => {
            start = ExecStart {
                attempt: report.attempt.clone(),
                reported_by: caller.principal.clone(),
                at: now,
            };
            AgentStep::Start(&start)
        }
        status => {
            end = ExecEnd {
                status,
                at: now,
                result: report.result.clone(),
                error: report.error.clone(),
            };
            AgentStep::End {
                attempt: &report.attempt,
                end: &end,
            }
        }
    };
    match state
        .store
        .agent_exec(&run.run_id, call_id, step, &entry)
        .await?
    {
        AgentStepped::Written(queued) => {
            if let Err(e) = state.outbox.publish(&run.run_id, &queued).await {
                warn!(error = %e, "a reported execution's audit copy waits in the outbox");
            }
            Ok(())
        }
        AgentStepped::Repeat(kept) => repeated(&report, &kept),
        AgentStepped::Taken(other) => Err(ApiError::conflict(
            "execution_taken",
            format!(
                "call {call_id:?} was claimed by another attempt ({:?}, by {}): it may have \
                 run; it is not to be run again",
                other.attempt, other.reported_by
            ),
        )
        .with_details(json!({"execution": other}))),
        AgentStepped::NotStarted => Err(ApiError::conflict(
            "not_started",
            format!(
                "attempt {:?} never claimed call {call_id:?}: report `started` before running it",
                report.attempt
            ),
        )),
        AgentStepped::Missing => Err(ApiError::not_found(format!(
            "no run {:?} (or no longer retained)",
            run.run_id
        ))),
    }
}

/// The step a report asks for, once its fields fit it.
fn status(report: &Report) -> Result<ExecStatus, ApiError> {
    let attempt = report.attempt.trim();
    if attempt.is_empty() || attempt.chars().count() > MAX_ATTEMPT_CHARS {
        return Err(ApiError::bad_request(format!(
            "attempt must be the attempt's id, 1 to {MAX_ATTEMPT_CHARS} characters"
        )));
    }
    let fits = match report.status {
        ExecStatus::Started => report.result.is_none() && report.error.is_none(),
        ExecStatus::Succeeded => report.error.is_none(),
        ExecStatus::Failed => {
            report.result.is_none() && report.error.as_deref().is_some_and(|e| !e.is_empty())
        }
    };
    if !fits {
        return Err(ApiError::bad_request(
            "a report is `started` (no result nor error), `succeeded` (a result, no error) or \
             `failed` (an error, no result)",
        ));
    }
    Ok(report.status)
}

/// A step this attempt had written already: answered as written if it is the same report
/// (its answer was lost), refused if it says otherwise.
fn repeated(report: &Report, kept: &str) -> Result<(), ApiError> {
    if report.status == ExecStatus::Started {
        return Ok(());
    }
    let end: ExecEnd = serde_json::from_str(kept).map_err(ApiError::unavailable)?;
    if end.status == report.status && end.result == report.result && end.error == report.error {
        return Ok(());
    }
    Err(ApiError::conflict(
        "already_reported",
        format!(
            "attempt {:?} reported its call {} already",
            report.attempt,
            end.status.as_str()
        ),
    )
    .with_details(json!({"end": end})))
}

/// The audit entry of a report: `started`, or `executed` by the agent with how it ended.
fn audited(caller: &Caller, run: &Run, call_id: &str, report: &Report) -> AuditEntry {
    let kind = match report.status {
        ExecStatus::Started => AuditKind::Started,
        _ => AuditKind::Executed,
    };
    let mut entry = AuditEntry::new(&run.run_id, kind);
    entry.call_id = Some(call_id.to_string());
    entry.actor = Some(caller.principal.clone());
    entry.via = Some("door".into());
    entry.detail = json!({
        "tool": DoorCall::of_run(&run.metadata).ok().map(|c| c.tool),
        "executed_by": "agent",
        "attempt": report.attempt,
        "status": report.status,
        "result": report.result,
        "error": report.error,
    });
    entry
}
