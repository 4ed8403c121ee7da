//! `GET /inbox/runs/{run_id}`: a run's status and the calls of it that failed (a run can end
//! `completed` with a refund its tool refused: the model answered anyway), its conversation,
//! its requests and how each ended, and
//! its audit trail as the API serves it (`GET /v1/runs/{run_id}/audit`): every entry of the
//! hash chain, whether the chain verifies, and the latest refused decisions.

use super::live_view::refreshed;
use crate::error::ApiError;
use crate::pages::layout::{Page, PageError};
use crate::pages::request_view::{conversation, decided};
use crate::pages::session::Session;
use crate::state::AppState;
use crate::time::readable;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use countersign_model::audit::{AuditEntry, verify};
use countersign_model::run::{CallOutcome, Decision, Run};
use maud::{Markup, html};
use serde_json::Value;
use std::collections::HashMap;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/inbox/runs/{run_id}", get(show))
}

async fn show(
    State(state): State<AppState>,
    session: Session,
    Path(run_id): Path<String>,
) -> Result<Response, PageError> {
    let (run, decisions) = state
        .run_with_decisions(&run_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("There is no run {run_id}.")))?;
    let trail = state
        .store
        .audit_trail(&run.run_id)
        .await?
        .unwrap_or_default();
    let broken_at = verify(&trail).err();
    let refusals = state.store.refusals(&run.run_id).await?;
    let entries: Vec<AuditEntry> = trail
        .iter()
        .filter_map(|e| serde_json::from_value(e["entry"].clone()).ok())
        // Pages are for people; a receipt is a bearer token for the call's tool.
        .map(AuditEntry::without_receipt)
        .collect();
    let title = format!("Run {}", run.run_id);
    let mut page = Page::new(StatusCode::OK, &title);
    page.signed_in = Some((&session.principal, &session.csrf));
    page.scripts.push(super::live_view::SCRIPT);
    let now = now_section(&run, &decisions);
    let record = record_section(&run, &entries, broken_at, &refusals);
    // The live section stays as the page has it; the rest follows the run as it moves on.
    Ok(page.render(html! {
        (refreshed("now", now))
        (super::live_view::section(run.run_id.as_str()))
        (refreshed("record", record))
    }))
}

/// Where the run is now: its status and answer, the calls of it that failed, and the calls
/// waiting for a person.
fn now_section(run: &Run, decisions: &HashMap<String, Decision>) -> Markup {
    let failed = run.failed_calls();
    html! {
        section {
            dl {
                dt { "Status" } dd.status { (run.status.as_str().replace('_', " ")) }
                @if !failed.is_empty() {
                    dt { "Failed calls" }
                    dd.failed-count { a href="#failed-calls" { (calls_failed(failed.len())) } }
                }
                dt { "Agent" } dd { (run.agent) " (version " (run.agent_version) ")" }
                dt { "Asked by" } dd { (run.requested_by.as_deref().unwrap_or("unknown")) }
                dt { "Started" } dd { (readable(run.created_at)) }
                dt { "Last change" } dd { (readable(run.updated_at)) }
            }
            @if let Some(answer) = &run.answer { h2 { "Answer" } pre { (answer) } }
            @if let Some(error) = &run.error { h2 { "Error" } pre { (error) } }
        }
        @if !failed.is_empty() {
            section #failed-calls .failed-calls {
                h2 { (calls_failed(failed.len())) }
                p { "The agent was told each failed; what it did next is in the conversation below." }
                ul {
                    @for f in &failed {
                        li data-call=(f.call_id) {
                            strong { (f.tool) } " (" code { (f.call_id) } ") "
                            @if f.outcome == CallOutcome::Unknown { "outcome unknown: " } @else { "failed: " }
                            span.error-text { (f.error) }
                        }
                    }
                }
            }
        }
        @if run.held_calls().next().is_some() {
            section.waiting {
                h2 { "Waiting for a person" }
                ul {
                    @for call in run.held_calls() {
                        li {
                            a href=(format!("/inbox/runs/{}/calls/{}", run.run_id, call.call_id)) { (call.summary) }
                            @if let Some(d) = decisions.get(&call.call_id) { " — " (decided(d)) }
                        }
                    }
                }
            }
        }
    }
}

/// The run's record: its conversation, its audit trail and whether the chain verifies, and
/// the latest refused decisions.
fn record_section(
    run: &Run,
    entries: &[AuditEntry],
    broken_at: Option<usize>,
    refusals: &[Value],
) -> Markup {
    html! {
        section.conversation {
            h2 { "Conversation" }
            (conversation(&run.messages))
        }
        section.audit {
            h2 { "Audit trail" }
            @match broken_at {
                None => p {
                    @match entries.len() {
                        1 => "The hash chain of its one entry verifies.",
                        n => { "The hash chain of these " (n) " entries verifies." }
                    }
                },
                Some(at) => p.error { "The hash chain does not verify from entry " (at) " on." },
            }
            ol.audit {
                @for e in entries {
                    li {
                        (readable(e.at)) " · " strong { (kind(e)) }
                        @if let Some(call) = &e.call_id {
                            " · " a href=(format!("/inbox/runs/{}/calls/{call}", run.run_id)) { (call) }
                        }
                        @if let Some(actor) = &e.actor { " · by " (actor) }
                        @if let Some(channel) = &e.via { " via " (channel) }
                        @if !e.detail.is_null() {
                            details { summary { "details" } pre { (crate::pages::request_view::pretty(&e.detail)) } }
                        }
                    }
                }
            }
            @if !refusals.is_empty() {
                h2 { "Refused decisions (latest first)" }
                ul {
                    @for r in refusals {
                        li { (refusal(r)) }
                    }
                }
            }
        }
    }
}

/// "1 call failed", "2 calls failed".
pub(super) fn calls_failed(count: usize) -> String {
    match count {
        1 => "1 call failed".into(),
        n => format!("{n} calls failed"),
    }
}

/// An entry's kind as a word (`cancel requested`).
fn kind(e: &AuditEntry) -> String {
    serde_json::to_value(e.kind)
        .ok()
        .and_then(|k| k.as_str().map(|k| k.replace('_', " ")))
        .unwrap_or_default()
}

/// A refused decision in a line: who, what, why.
fn refusal(r: &Value) -> String {
    let text = |f: &str| r[f].as_str().unwrap_or("?").to_string();
    let at = r["at"].as_i64().map(readable).unwrap_or_default();
    format!(
        "{at}: {} ({}) on {} refused: {}",
        text("actor"),
        text("channel"),
        text("call_id"),
        text("code").replace('_', " ")
    )
}
