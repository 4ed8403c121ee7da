//! One held call as a reviewer sees it, from the inbox or from an email link: the action in
//! plain language, the policy's reason, the agent's own words, what the agent had seen, the
//! exact input, the deadline, who asked, and the digest it was rendered from; or, once it
//! can no longer be decided, who did what and when.
//!
//! A call still held is read from the run; one decided, expired or cancelled from the run's
//! audit trail (its `requested` entry keeps what reviewers were shown), so the page still
//! says what it was after the run moved on.

use crate::decide::{DecideError, told};
use crate::error::ApiError;
use crate::state::AppState;
use crate::time::{readable, time_left};
use axum::http::StatusCode;
use countersign_model::approval::Risk;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::events::{Evidence, seen_by_agent};
use countersign_model::now_ms;
use countersign_model::run::{
    Action, Block, CallOutcome, Decision, HeldCall, Message, Recheck, Run, RunStatus, Speaker,
};
use countersign_store::RefusalCode;
use maud::{Markup, html};
use serde_json::Value;
use std::collections::HashMap;

/// What a reviewer is shown about one call.
pub(crate) struct CallView {
    pub(crate) run_id: String,
    pub(crate) call_id: String,
    pub(crate) agent: String,
    pub(crate) requested_by: Option<String>,
    pub(crate) tool: String,
    pub(crate) input: Value,
    pub(crate) digest: String,
    pub(crate) summary: String,
    pub(crate) reason: String,
    /// What the call does to the world, as its tool's entry declares it.
    pub(crate) risk: Option<Risk>,
    /// The agent's words in the turn that made the call.
    pub(crate) said: String,
    /// What the person asked the agent: the run's input.
    pub(crate) asked: String,
    pub(crate) deadline: Option<i64>,
    /// The conversation up to the call.
    pub(crate) messages: Vec<Message>,
    /// What the agent had seen when it asked: what an external agent sent with its ask, and
    /// the results of the same turn's calls that needed nobody.
    pub(crate) seen: Vec<Evidence>,
    /// The call as held, while it can still be decided.
    pub(crate) open: Option<HeldCall>,
    /// The call this one replaces, when it is asked about again because its policy changed.
    pub(crate) recheck: Option<Recheck>,
    /// How it ended, once it cannot be decided any more.
    pub(crate) outcome: Option<String>,
}

impl CallView {
    /// The call `call_id` of run `run_id`, held or once held; none if there is no such call.
    pub(crate) async fn load(
        state: &AppState,
        run_id: &str,
        call_id: &str,
    ) -> Result<Option<Self>, ApiError> {
        let Some(run) = state.run(run_id).await? else {
            return Ok(None);
        };
        let decision = state.store.decisions(&run.run_id).await?.remove(call_id);
        if let Some(call) = run.held_calls().find(|p| p.call_id == call_id) {
            return Ok(Some(Self::of_held(&run, call, decision.as_ref())));
        }
        // No longer held: what reviewers were shown is in the trail's `requested` entry.
        let trail = entries_of(state, &run, call_id).await?;
        let Some(requested) = trail.iter().rfind(|e| e.kind == AuditKind::Requested) else {
            return Ok(None);
        };
        let detail = &requested.detail;
        let text = |field: &str| detail[field].as_str().unwrap_or_default().to_string();
        // The model's answer of the call's turn (each turn adds one), which asked for it.
        let asked_in = match detail["turn"].as_u64() {
            Some(turn) => run.answer_of_turn(turn),
            // An entry written before entries named their turn: the call's id was the model's.
            None => run.messages.iter().position(|m| {
                m.content
                    .iter()
                    .any(|b| matches!(b, Block::ToolUse { id, .. } if id == call_id))
            }),
        };
        let outcome = match decision {
            Some(d) => decided(&d),
            None => match trail.iter().rfind(|e| e.kind == AuditKind::Expired) {
                Some(e) => expired(e.at),
                None => moved_on(&run),
            },
        };
        Ok(Some(Self {
            run_id: run.run_id.to_string(),
            call_id: call_id.to_string(),
            agent: run.agent.clone(),
            requested_by: run.requested_by.clone(),
            tool: text("tool"),
            input: detail["input"].clone(),
            digest: requested.digest.clone().unwrap_or_default(),
            summary: text("summary"),
            reason: text("reason"),
            risk: serde_json::from_value(detail["risk"].clone()).ok(),
            said: asked_in.map(|i| run.messages[i].text()).unwrap_or_default(),
            asked: run.input.clone(),
            deadline: detail["deadline"].as_i64(),
            recheck: None,
            messages: match asked_in {
                Some(i) => run.messages[..=i].to_vec(),
                None => run.messages.clone(),
            },
            seen: Vec::new(),
            open: None,
            outcome: Some(outcome),
        }))
    }

    /// A call still held, as its run has it; `decision` is its decision if it has one (the
    /// run has not moved on from it yet).
    fn of_held(run: &Run, call: &HeldCall, decision: Option<&Decision>) -> Self {
        let outcome = match decision {
            Some(d) => Some(decided(d)),
            None if run.status != RunStatus::AwaitingApproval || run.cancel.is_some() => {
                Some(moved_on(run))
            }
            None => None,
        };
        Self {
            run_id: run.run_id.to_string(),
            call_id: call.call_id.clone(),
            agent: run.agent.clone(),
            requested_by: run.requested_by.clone(),
            tool: call.tool.clone(),
            input: call.input.clone(),
            digest: call.digest.clone(),
            summary: call.summary.clone(),
            reason: call.reason.clone(),
            risk: call.risk,
            said: run.paused_turn_text(),
            asked: run.input.clone(),
            deadline: call.deadline,
            open: outcome.is_none().then(|| call.clone()),
            recheck: call.recheck.clone(),
            seen: seen_by_agent(run),
            messages: run.messages.clone(),
            outcome,
        }
    }

    /// The schema of the call's tool, as its agent defines it now.
    pub(crate) fn schema(&self, state: &AppState) -> Option<Value> {
        state
            .catalog()
            .get(&self.agent)
            .and_then(|a| a.tool(&self.tool).map(|t| t.input_schema.clone()))
    }

    /// The page's account of the request, under a heading that names it; `run_link` links
    /// its run page (for a reader who is signed in).
    pub(crate) fn render(&self, run_link: bool) -> Markup {
        html! {
            @if let Some(outcome) = &self.outcome {
                p.outcome { (outcome) }
            }
            (self.facts(run_link))
            (self.evidence())
        }
    }

    /// What a decision needs, meant to fit the first screen: the policy's reason, what the
    /// person asked the agent, the exact input, the time left, who asked, and the digest.
    pub(crate) fn facts(&self, run_link: bool) -> Markup {
        let now = now_ms();
        let short = |d: i64| d - now < SHORT_TIME_LEFT_MS;
        html! {
            section.request {
                p.reason { strong { "Why it needs a person: " } (self.reason) }
                @if let Some(risk) = self.risk {
                    p.risk { strong { "Risk: " } (risk.told()) }
                }
                @if let Some(before) = &self.recheck {
                    p.recheck {
                        strong { "Asked again: " }
                        "the tool's policy changed after this call was held as " code { (before.call_id) }
                        " (policy version " (before.policy_version) "). "
                        @match &before.decision {
                            Some(d) => { "What was decided then: " (decided(d)) }
                            None => "Nobody had decided it.",
                        }
                    }
                }
                @if !self.asked.is_empty() {
                    figure.asked {
                        figcaption { (self.requested_by.as_deref().unwrap_or("The requester")) " asked the agent:" }
                        blockquote.prose { (self.asked) }
                    }
                }
                h2 { "The exact input" }
                pre.input { (pretty(&self.input)) }
                dl.facts {
                    dt { "Time left" }
                    dd {
                        @match (self.deadline, self.open.is_some()) {
                            (Some(d), true) => {
                                strong.left.short[short(d)] { (time_left(d, now)) }
                                " (until " (readable(d)) ")"
                            }
                            (Some(d), false) => { "deadline " (readable(d)) }
                            (None, _) => "no deadline",
                        }
                    }
                    dt { "Asked by" } dd { (self.requested_by.as_deref().unwrap_or("unknown")) }
                    dt { "Agent · tool" } dd { (self.agent) " · " (self.tool) }
                    dt { "Run" }
                    dd.run-id {
                        @if run_link {
                            a href=(format!("/inbox/runs/{}", self.run_id)) { (self.run_id) }
                        } @else {
                            (self.run_id)
                        }
                    }
                }
                p.digest { "Digest shown: " (self.digest) }
            }
        }
    }

    /// What the agent said and had seen, below the decision and folded: the reviewer opens it
    /// when the facts above are not enough.
    pub(crate) fn evidence(&self) -> Markup {
        html! {
            details.evidence {
                summary { "What the agent said and had seen" }
                @if !self.said.is_empty() {
                    h2 { "What the agent said" }
                    div.said.prose { (self.said) }
                }
                h2 { "The conversation" }
                (conversation(&self.messages))
                @for seen in &self.seen {
                    div.turn {
                        div.who { "Seen by the agent before it asked: " code { (seen.tool) } }
                        pre { (pretty(&seen.input)) }
                        pre { (laid_out(&seen.content)) }
                    }
                }
            }
        }
    }
}

/// Less time left than this is shown highlighted.
pub(crate) const SHORT_TIME_LEFT_MS: i64 = 60 * 60 * 1000;

/// The run's trail entries about one call, oldest first.
async fn entries_of(
    state: &AppState,
    run: &Run,
    call_id: &str,
) -> Result<Vec<AuditEntry>, ApiError> {
    Ok(state
        .store
        .audit_trail(&run.run_id)
        .await?
        .unwrap_or_default()
        .into_iter()
        .filter_map(|element| serde_json::from_value::<AuditEntry>(element["entry"].clone()).ok())
        .filter(|e| e.call_id.as_deref() == Some(call_id))
        .map(AuditEntry::without_receipt)
        .collect())
}

/// A refused decision in a reviewer's words, with the status its page gets when it differs
/// from the API's.
pub(crate) fn refusal_words(e: &DecideError) -> (Option<StatusCode>, String) {
    match e {
        DecideError::Refused {
            code: RefusalCode::StaleDigest,
            ..
        } => (
            Some(StatusCode::CONFLICT),
            "This request changed since you opened it, so nothing was recorded. It is shown \
             below as it is now: check it and decide again."
                .into(),
        ),
        DecideError::Refused { code, .. } if let Some(told) = told(*code) => {
            (None, format!("Nothing was recorded: {told}."))
        }
        DecideError::InvalidEdit { errors, .. } => (
            Some(StatusCode::UNPROCESSABLE_ENTITY),
            format!(
                "The changed input does not fit the tool: {}",
                errors.join("; ")
            ),
        ),
        other => (None, format!("Nothing was recorded: {other}.")),
    }
}

/// A recorded decision in a sentence: "Approved by alice via slack at 2026-12-01 10:42 UTC."
pub(crate) fn decided(d: &Decision) -> String {
    if d.expired {
        return expired(d.decided_at);
    }
    if d.superseded {
        return format!(
            "Closed at {}: the tool's policy changed, so the call is checked again under the new one.",
            readable(d.decided_at)
        );
    }
    let what = match d.action {
        Action::Approve => "Approved",
        Action::Edit => "Approved with changes",
        Action::Reject => "Rejected",
    };
    let mut text = format!(
        "{what} by {} via {} at {}.",
        d.decided_by,
        d.door,
        readable(d.decided_at)
    );
    if let Some(reason) = d.reason.as_deref().filter(|r| !r.is_empty()) {
        text += &format!(" Reason: {reason}");
    }
    if let Some(note) = d.note.as_deref().filter(|n| !n.is_empty()) {
        text += &format!(" Note: {note}");
    }
    text
}

fn expired(at: i64) -> String {
    format!(
        "Expired at {}: nobody decided before the deadline, so it did not run.",
        readable(at)
    )
}

/// Why a call nobody decided is not waiting any more.
fn moved_on(run: &Run) -> String {
    match (&run.cancel, run.status) {
        (Some(c), _) => format!(
            "The run was cancelled by {} at {}, so this request was closed.",
            c.by,
            readable(c.at)
        ),
        (None, status) => format!(
            "This request is no longer waiting (the run is {}).",
            status.as_str().replace('_', " ")
        ),
    }
}

pub(crate) fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// A tool's answer as a person reads it: JSON laid out on lines, anything else as it is.
fn laid_out(content: &str) -> String {
    match serde_json::from_str::<Value>(content) {
        Ok(value @ (Value::Object(_) | Value::Array(_))) => pretty(&value),
        _ => content.to_string(),
    }
}

/// A conversation, message by message: who spoke, what they said, the calls the agent made
/// and what each tool answered.
pub(crate) fn conversation(messages: &[Message]) -> Markup {
    // A result answers the latest call with its id: a model may use an id again in a later
    // turn.
    let mut tools: HashMap<&str, &str> = HashMap::new();
    html! {
        @for message in messages {
            div.turn {
                @let results = message.content.iter().all(|b| matches!(b, Block::ToolResult { .. }));
                div.who {
                    @match (message.role, results) {
                        (Speaker::User, true) => "Tool results",
                        (Speaker::User, false) => "Request",
                        (Speaker::Assistant, _) => "Agent",
                    }
                }
                @for block in &message.content {
                    @match block {
                        Block::Text { text } => div.prose { (text) },
                        Block::ToolUse { id, name, input } => {
                            @let _ = tools.insert(id.as_str(), name.as_str());
                            p { "Asked to run " strong { (name) } ":" }
                            pre { (pretty(input)) }
                        }
                        Block::ToolResult { tool_use_id, content, is_error, outcome, .. } => {
                            p {
                                strong { (tools.get(tool_use_id.as_str()).copied().unwrap_or("A tool")) }
                                (result_words(*is_error, *outcome))
                            }
                            pre { (laid_out(content)) }
                        }
                    }
                }
            }
        }
    }
}

/// How a result is introduced: a call refused by a person, a deadline or a cancel did not
/// fail (it was not to run), though the model is told it as an error.
fn result_words(is_error: bool, outcome: Option<CallOutcome>) -> &'static str {
    match (is_error, outcome) {
        (false, _) => " answered:",
        (true, Some(CallOutcome::Rejected)) => " was rejected:",
        (true, Some(CallOutcome::Expired)) => " expired undecided:",
        (true, Some(CallOutcome::Cancelled)) => " did not run (the run was cancelled):",
        (true, Some(CallOutcome::Unknown)) => " has an unknown outcome:",
        (true, _) => " failed:",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_is_shown_under_the_call_it_answers_when_a_model_reuses_ids() {
        let turn = |tool: &str, answer: &str| {
            [
                Message {
                    role: Speaker::Assistant,
                    content: vec![Block::ToolUse {
                        id: "call_0".into(),
                        name: tool.into(),
                        input: Value::Null,
                    }],
                },
                Message {
                    role: Speaker::User,
                    content: vec![Block::ToolResult {
                        tool_use_id: "call_0".into(),
                        content: answer.into(),
                        is_error: false,
                        outcome: None,
                        images: Vec::new(),
                        mcp: None,
                    }],
                },
            ]
        };
        let messages: Vec<Message> = turn("get_order", "found")
            .into_iter()
            .chain(turn("issue_refund", "refunded"))
            .collect();
        let html = conversation(&messages).into_string();
        let first = html
            .find("<strong>get_order</strong> answered")
            .expect(&html);
        let second = html
            .find("<strong>issue_refund</strong> answered")
            .expect(&html);
        assert!(first < second, "{html}");
    }

    #[test]
    fn what_agents_and_tools_wrote_is_shown_as_text_never_as_markup() {
        let messages = vec![
            Message::user_text("<script>alert(1)</script>"),
            Message {
                role: Speaker::User,
                content: vec![Block::ToolResult {
                    tool_use_id: "t1".into(),
                    content: "{\"note\": \"<img src=x onerror=alert(1)>\"}".into(),
                    is_error: false,
                    outcome: None,
                    images: Vec::new(),
                    mcp: None,
                }],
            },
        ];
        let html = conversation(&messages).into_string();
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{html}"
        );
        assert!(
            html.contains("&lt;img src=x onerror=alert(1)&gt;"),
            "{html}"
        );
        assert!(
            !html.contains("<script") && !html.contains("<img"),
            "{html}"
        );
    }
}
