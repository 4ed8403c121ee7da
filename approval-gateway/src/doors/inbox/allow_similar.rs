//! The request page's "Approve and allow similar" form: it approves the call in front of the
//! reviewer with the terms of a standing grant (see `crate::grants`), so that calls like it
//! are approved without asking anyone, within the limits the reviewer sets. It is offered
//! where the reviewer may approve the call and the tool's policy allows grants, prefilled to
//! cover the call (`condition::suggested`), a few uses and a duration within the policy's
//! caps, and limited to the run's requester when the reviewer ticks it.
//!
//! It is posted to the request's own path with `action=allow`, through the same session,
//! CSRF and same-origin checks as the other forms, and decided as they are
//! (`decide::decide_one`, channel `web`), the terms riding on the approval: whatever the
//! policy or the condition refuses (not CEL, not covering the call, past the caps, no grants
//! on this tool) is refused there with nothing recorded, and the form comes back with why.
//! Only the inbox reads these fields: the email pages share the other forms, not this one.

use super::grants_page;
use crate::decide::{DecideError, Proposed};
use crate::error::ApiError;
use crate::pages::forms::{FieldErrors, Tie, Typed};
use crate::pages::layout::Page;
use crate::pages::request_view::{CallView, refusal_words};
use crate::pages::session::Session;
use crate::state::AppState;
use axum::http::StatusCode;
use axum::response::Response;
use countersign_model::condition;
use countersign_model::grant::{GrantLimits, GrantTerms};
use countersign_model::now_ms;
use countersign_model::run::Action;
use countersign_model::span::Span;
use countersign_store::{CallDecided, DecidedStatus};
use maud::{Markup, html};
use serde::Deserialize;

/// The form's `action`.
pub(super) const ACTION: &str = "allow";

/// Where the form's errors as a whole are kept among the page's errors; its fields' are
/// `grant.<field>`.
pub(super) const ERRORS: &str = "grant";

/// The durations offered, in seconds, those within the policy's cap (and the cap itself).
const DURATIONS: [u64; 4] = [3600, 8 * 3600, 86400, 7 * 86400];

/// The duration chosen at first, when the policy allows it.
const DEFAULT_DURATION: u64 = 8 * 3600;

/// The uses proposed at first, when the policy allows as many.
const DEFAULT_USES: u32 = 10;

/// The form as offered on one open call.
pub(super) struct Offer<'a> {
    limits: GrantLimits,
    tool: &'a str,
    requester: Option<&'a str>,
    quorum: u32,
    suggested: String,
}

/// The form for `view`'s call, if it is open, the reviewer may approve it (`actions`) and
/// the tool's policy allows grants.
pub(super) fn offer<'a>(
    state: &AppState,
    view: &'a CallView,
    actions: &[Action],
) -> Option<Offer<'a>> {
    let call = view.open.as_ref()?;
    if !actions.contains(&Action::Approve) {
        return None;
    }
    let limits = state
        .catalog()
        .get(&view.agent)?
        .tool(&view.tool)?
        .grant_limits();
    limits.allowed.then(|| Offer {
        limits,
        tool: &view.tool,
        requester: view.requested_by.as_deref(),
        quorum: call.reviewers.quorum,
        suggested: condition::suggested(&call.input),
    })
}

/// `secs` as a person reads it: `8 hours`.
fn span_words(secs: u64) -> String {
    let (n, unit) = match secs {
        s if s % 86400 == 0 => (s / 86400, "day"),
        s if s % 3600 == 0 => (s / 3600, "hour"),
        s if s % 60 == 0 => (s / 60, "minute"),
        s => (s, "second"),
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

/// The durations offered under a cap of `max` seconds, shortest first.
fn durations(max: u64) -> Vec<u64> {
    let mut offered: Vec<u64> = DURATIONS.into_iter().filter(|d| *d <= max).collect();
    if !offered.contains(&max) {
        offered.push(max);
    }
    offered
}

impl Offer<'_> {
    /// The action bar's link to the form.
    pub(super) fn link(&self) -> Markup {
        html! { a.action href="#allow" { "Approve and allow similar…" } }
    }

    /// What the grant does, and, for a call that needs several approvals, that each
    /// approver must allow similar calls with the same terms.
    fn explained(&self) -> Markup {
        html! {
            p {
                "Approves this call, and approves without asking anyone later " code { (self.tool) }
                " calls of this agent whose input satisfies the condition, up to the uses \
                 and for the time you set. You can revoke it on the "
                a href=(grants_page::PATH) { "grants page" } "."
            }
            @if self.quorum > 1 {
                p.notice {
                    "This call needs " (self.quorum) " approvals: the grant is made once each \
                     of them allows similar calls with the same terms."
                }
            }
        }
    }

    /// The form, showing what was typed when it comes back with `errors`, else what is
    /// proposed.
    pub(super) fn render(
        &self,
        csrf: &str,
        digest: &str,
        typed: &Typed,
        errors: &FieldErrors,
    ) -> Markup {
        let again = typed.get("action").is_some_and(|a| a == ACTION);
        let value = |name: &str, proposed: String| match typed.get(name) {
            Some(v) if again => v.clone(),
            _ => proposed,
        };
        let condition = value("condition", self.suggested.clone());
        let uses = value(
            "max_uses",
            DEFAULT_USES.min(self.limits.max_uses).to_string(),
        );
        let offered = durations(self.limits.max_duration_secs);
        let default = match offered.contains(&DEFAULT_DURATION) {
            true => DEFAULT_DURATION,
            false => offered.last().copied().unwrap_or(DEFAULT_DURATION),
        };
        let lasts = value("expires_in", Span::of_secs(default).to_string());
        let same_requester = again && typed.contains_key("same_requester");
        let condition_tie = Tie::new(errors, "grant.condition", "grant-condition", true);
        let uses_tie = Tie::new(errors, "grant.max_uses", "grant-max-uses", true);
        let lasts_tie = Tie::new(errors, "grant.expires_in", "grant-expires-in", false);
        html! {
            // The fragment brings a page sent back with errors to the form that has them.
            form #allow .decide method="post" action="#allow" {
                h2 { "Approve and allow similar" }
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="digest" value=(digest);
                input type="hidden" name="action" value=(ACTION);
                (self.explained())
                @if let Some(errors) = errors.get(ERRORS) {
                    @for e in errors { p.error role="alert" { (e) } }
                }
                label for="grant-condition" { "Condition on the input (CEL, as in policies)" }
                p.hint id=(condition_tie.hint_id) {
                    "Proposed to cover this call: each number at most its value, each text and \
                     truth value equal to its own. It must cover this call."
                }
                (condition_tie.errors())
                textarea #grant-condition .condition name="condition" rows="3" required
                    aria-describedby=[condition_tie.described_by()] aria-invalid=[condition_tie.invalid()] { (condition) }
                label for="grant-max-uses" { "Uses" }
                p.hint id=(uses_tie.hint_id) {
                    "How many later calls it may approve: at most " (self.limits.max_uses) " for this tool."
                }
                (uses_tie.errors())
                input #grant-max-uses type="number" name="max_uses" value=(uses) min="1"
                    max=(self.limits.max_uses) step="1" required
                    aria-describedby=[uses_tie.described_by()] aria-invalid=[uses_tie.invalid()];
                label for="grant-expires-in" { "Lasts" }
                (lasts_tie.errors())
                select #grant-expires-in name="expires_in"
                    aria-describedby=[lasts_tie.described_by()] aria-invalid=[lasts_tie.invalid()] {
                    @for secs in &offered {
                        @let text = Span::of_secs(*secs).to_string();
                        option value=(text) selected[text == lasts] { (span_words(*secs)) }
                    }
                }
                @if let Some(requester) = self.requester {
                    label.check {
                        input type="checkbox" name="same_requester" value="true" checked[same_requester];
                        " Only runs requested by " (requester)
                    }
                }
                button.approve type="submit" { "Approve and allow similar" }
            }
        }
    }
}

/// The approval the form asks for on `view`'s call, shown `digest`, carrying the grant's
/// terms as typed; what cannot be read as terms, by field. Whether the terms are allowed is
/// for the decision to say.
pub(super) fn grant_from_form(
    view: &CallView,
    typed: &Typed,
    digest: &str,
) -> Result<Proposed, FieldErrors> {
    let mut errors = FieldErrors::new();
    let field = |name: &str| typed.get(name).map(|v| v.trim()).unwrap_or_default();
    let max_uses = field("max_uses").parse::<u32>().ok();
    if max_uses.is_none() {
        errors
            .entry("grant.max_uses".into())
            .or_default()
            .push("Write how many later calls it may approve, as a whole number.".into());
    }
    let expires_in = Span::deserialize(
        serde::de::value::StrDeserializer::<serde::de::value::Error>::new(field("expires_in")),
    )
    .ok();
    if expires_in.is_none() {
        errors
            .entry("grant.expires_in".into())
            .or_default()
            .push("Choose how long it lasts.".into());
    }
    let (Some(max_uses), Some(expires_in)) = (max_uses, expires_in) else {
        return Err(errors);
    };
    Ok(Proposed {
        call_id: view.call_id.clone(),
        digest: Some(digest.to_string()),
        action: Action::Approve,
        input: None,
        note: None,
        reason: None,
        grant: Some(GrantTerms {
            condition: field("condition").to_string(),
            same_requester: typed.contains_key("same_requester"),
            max_uses,
            expires_in,
            total: None,
        }),
    })
}

/// A refused approval with grant terms in a reviewer's words, with the status of its page
/// (the API's: 400 for a condition that is not CEL or does not cover the call, 403 for terms
/// the policy does not allow), and whether the refusal is about the terms, so that it
/// belongs beside the form's fields rather than above the page's forms.
pub(super) fn refused(e: DecideError) -> (StatusCode, String, bool) {
    let (status, message, about_terms) = match &e {
        DecideError::BadInput(why)
        | DecideError::GrantRefused(why)
        | DecideError::ConditionLimit(why) => (
            None,
            format!("Nothing was recorded and no grant was made: {why}."),
            true,
        ),
        other => {
            let (status, message) = refusal_words(other);
            (status, message, false)
        }
    };
    let status = status.unwrap_or_else(|| ApiError::from(e).status);
    (status, message, about_terms)
}

/// The page answering the form once the approval is recorded: the grant made, or, for a call
/// that needs several approvals, that this one is counted and the grant waits for the others
/// with the same terms; `next` is where the reviewer goes on to.
pub(super) fn answered(
    state: &AppState,
    session: &Session,
    view: &CallView,
    call: &CallDecided,
    terms: &GrantTerms,
    next: &str,
) -> Response {
    let now = now_ms();
    let waiting = matches!(
        call.status,
        DecidedStatus::ApprovalRecorded | DecidedStatus::AlreadyVoted
    );
    let title = match (&call.grant, waiting) {
        (Some(_), _) => "Approved, and similar calls allowed",
        (None, true) => "Your approval is counted",
        (None, false) => "Approved, but no grant was made",
    };
    let mut page = Page::new(StatusCode::OK, title);
    page.signed_in = Some((&session.principal, &session.csrf));
    let request = format!("/inbox/runs/{}/calls/{}", view.run_id, view.call_id);
    let go_on = match next.starts_with("/inbox/runs/") {
        true => "Next request",
        false => "Back to the queue",
    };
    page.render(html! {
        @match (&call.grant, waiting) {
            (Some(grant), _) => {
                p.outcome #granted role="status" data-grant=(grant.id) {
                    "You approved " a href=(request) { (view.summary) } ", and made grant "
                    strong { (grant.id) } ": until it expires, is used up or is revoked, it \
                     approves the calls it covers in the name of " (grant.granted_by.join(", ")) "."
                }
                (grants_page::facts(grant, crate::grants::status(state, grant, now), now))
            }
            (None, true) => {
                p.outcome #counted role="status" {
                    "Your approval of " a href=(request) { (view.summary) } " is counted"
                    @if let (Some(a), Some(q)) = (call.approvals, call.quorum) { ": " (a) " of " (q) " needed" }
                    ". The grant is made once the call's other approvers approve it with the same \
                     terms, and it runs once its approvals are complete."
                }
                (terms_facts(terms))
            }
            (None, false) => {
                p.notice role="status" {
                    "You approved " a href=(request) { (view.summary) } ", but no grant was made: \
                     its approvers did not all allow similar calls with the same terms."
                }
            }
        }
        p {
            a href=(grants_page::PATH) { "See the grants" } " · " a href=(next) { (go_on) }
        }
    })
}

/// Terms sent, before the grant they ask for is made.
fn terms_facts(terms: &GrantTerms) -> Markup {
    html! {
        dl.facts {
            dt { "Condition" } dd { code.condition { (terms.condition.trim()) } }
            dt { "Uses" } dd { (terms.max_uses) }
            dt { "Lasts" } dd { (span_words(terms.expires_in.duration.as_secs())) " from when it is made" }
            @if terms.same_requester { dt { "Runs" } dd { "only this run's requester's" } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_durations_offered_keep_within_the_policy_and_offer_its_cap() {
        assert_eq!(durations(86400), [3600, 8 * 3600, 86400]);
        assert_eq!(
            durations(30 * 86400),
            [3600, 8 * 3600, 86400, 7 * 86400, 30 * 86400]
        );
        assert_eq!(durations(1800), [1800]);
        assert_eq!(durations(2 * 3600), [3600, 2 * 3600]);
        assert_eq!(Span::of_secs(1800).to_string(), "30m");
        assert_eq!(Span::of_secs(7 * 86400).to_string(), "7d");
        assert_eq!(Span::of_secs(90).to_string(), "90s");
        assert_eq!(span_words(3600), "1 hour");
        assert_eq!(span_words(8 * 3600), "8 hours");
    }
}
