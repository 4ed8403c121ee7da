//! Slack Block Kit for approval requests: the message with its buttons (and, where the policy
//! allows standing grants, "Approve + allow similar" presets), the short message posted when
//! Slack refuses the full one, the message once decided (buttons gone), the reject and edit
//! modals, and the view that shows an edit's change before it is sent. Buttons and modals
//! carry the run, call and digest the reviewer was shown, so the decision is bound to exactly
//! that.
//!
//! Nothing the model, a tool or a requester wrote is markup. In `mrkdwn` text it is escaped
//! (`&`, `<` and `>` are Slack's control characters), so `<!channel>`, `<@U…>` or
//! `<https://…|label>` show as typed and ping or link nothing; tool output and arguments go in
//! `rich_text` blocks, whose `text` elements Slack does not parse at all, so no fence can be
//! closed from inside. Only what we write ourselves (labels, date tokens, mentions of the
//! configured approvers) is markup.
//!
//! Every message stays within Slack's limits: at most 50 blocks (the evidence shown is capped,
//! the rest summed up in one line), every text under its own limit (a section's is 3,000
//! characters) and all of them together well under the ~12,000 characters of block text Slack
//! accepts in one message. Texts are clipped by characters, never inside one, and clipped as
//! they are escaped, so an escape is never cut in half.

use countersign_model::authority::{self, RunFacts};
use countersign_model::condition;
use countersign_model::edit::{self, FieldChange};
use countersign_model::events::Evidence;
use countersign_model::grant::{Grant, GrantLimits, GrantTerms};
use countersign_model::run::{Action, HeldCall};
use countersign_model::span::Span;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What a button or modal is about.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Target {
    #[serde(rename = "r")]
    pub(crate) run_id: String,
    #[serde(rename = "c")]
    pub(crate) call_id: String,
    #[serde(rename = "d")]
    pub(crate) digest: String,
}

/// What an "Approve + allow similar" preset carries: the call, and the grant's number of uses
/// and how long it lasts. Its condition is the one suggested for the call's input, worked out
/// again from the call as held when the button is clicked (the digest binds it to the input
/// shown). Buttons, not a menu: a menu option's value holds only 150 characters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct GrantPreset {
    #[serde(flatten)]
    pub(crate) target: Target,
    #[serde(rename = "u")]
    pub(crate) max_uses: u32,
    #[serde(rename = "e")]
    pub(crate) expires_in: Span,
}

/// The presets offered, as (uses, span); each only where the tool's policy allows it.
const PRESETS: [(u32, &str); 2] = [(10, "1h"), (50, "8h")];

/// The block and the start of the action ids of the presets' buttons.
pub(crate) const APPROVE_GRANT: &str = "approve_grant";

/// An edit as the reviewer wrote it, carried by the view that shows its change until they
/// confirm it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct EditToConfirm {
    #[serde(flatten)]
    pub(crate) target: Target,
    #[serde(rename = "i")]
    pub(crate) input: Value,
    #[serde(rename = "n")]
    pub(crate) note: String,
}

/// Slack's limit for a section's (and a context element's) text.
pub(crate) const MAX_SECTION_TEXT: usize = 3000;
/// Slack's limit for the blocks of one message.
pub(crate) const MAX_BLOCKS: usize = 50;
/// Slack's limit for what a `plain_text_input` holds (`max_length` at most 3,000).
pub(crate) const MAX_INPUT: usize = 3000;
/// Slack's limit for a view's `private_metadata`.
const MAX_METADATA: usize = 3000;
/// Tool results shown in a request; the others are counted in one line.
pub(crate) const MAX_EVIDENCE_SHOWN: usize = 8;

// What each part of a request may take, in characters once escaped. Together (with the
// labels, the context line, the buttons and the grant presets' line) they stay under ~10,000
// characters of block text.
const SUMMARY_CHARS: usize = 1000;
const REASON_CHARS: usize = 1000;
const WORDS_CHARS: usize = 1500;
/// A name: an agent's, a person's, a tool's.
pub(crate) const NAME_CHARS: usize = 100;
const APPROVERS_CHARS: usize = 300;
/// One tool result, and all of them together.
const EVIDENCE_CHARS: usize = 1200;
const EVIDENCE_BUDGET: usize = 4500;
/// A tool result is shown only with at least this much of it.
const EVIDENCE_MIN: usize = 200;
const ARGUMENTS_CHARS: usize = 200;
/// The condition a preset's grant would have, as shown beside the presets.
const CONDITION_CHARS: usize = 300;
/// The message's `text`: the notification and the fallback where blocks cannot show. Slack
/// truncates `text` past 40,000 characters and asks for far less; a notification needs little.
const FALLBACK_CHARS: usize = 300;
/// The ellipsis that ends a clipped text.
const CUT: char = '…';

/// Escapes Slack's control characters, so the text shows as typed.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        c => out.push(c),
    }
}

fn escaped_len(c: char) -> usize {
    match c {
        '&' => 5,
        '<' | '>' => 4,
        _ => 1,
    }
}

/// `text` escaped, in at most `max` characters: cut between characters (never inside an
/// escape) and ended with `…` when it does not fit whole.
pub(crate) fn escaped(text: &str, max: usize) -> String {
    if text.chars().map(escaped_len).sum::<usize>() <= max {
        return escape(text);
    }
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let len = escaped_len(c);
        if used + len > max.saturating_sub(1) {
            break;
        }
        push_escaped(&mut out, c);
        used += len;
    }
    out.push(CUT);
    out
}

/// `text` in at most `max` characters, ended with `…` when cut: for text Slack does not parse.
pub(crate) fn clipped(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push(CUT);
    out
}

/// A section of our `label` (markup) followed by someone else's words (escaped).
fn section(label: &str, untrusted: &str, max: usize) -> Value {
    let room = MAX_SECTION_TEXT - label.chars().count();
    mrkdwn_section(format!("{label}{}", escaped(untrusted, max.min(room))))
}

/// A section of text that is markup by construction (ours, or escaped already).
fn mrkdwn_section(text: String) -> Value {
    debug_assert!(text.chars().count() <= MAX_SECTION_TEXT);
    json!({"type": "section", "text": {"type": "mrkdwn", "text": text}})
}

/// A moment as Slack shows it, in each reader's own time zone, with UTC for clients that
/// cannot format dates.
pub(crate) fn slack_date(ms: i64) -> String {
    let fallback = chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%d %H:%M UTC");
    format!(
        "<!date^{}^{{date_short_pretty}} at {{time}}|{fallback}>",
        ms.div_euclid(1000)
    )
}

/// When the call expires, as people read it (markup: a Slack date).
pub(crate) fn deadline(call: &HeldCall) -> String {
    match call.deadline {
        Some(ms) => format!("decide by {}", slack_date(ms)),
        None => "no deadline".into(),
    }
}

pub(crate) struct Request<'a> {
    pub(crate) channel: &'a str,
    pub(crate) agent: &'a str,
    pub(crate) requested_by: Option<&'a str>,
    pub(crate) text: &'a str,
    pub(crate) call: &'a HeldCall,
    pub(crate) evidence: &'a [Evidence],
    pub(crate) target: &'a Target,
    /// What the tool's policy allows of standing grants; None offers none.
    pub(crate) grant_limits: Option<GrantLimits>,
}

/// The message's `text`, which Slack parses like any other.
fn fallback(summary: &str) -> String {
    format!("Approval needed: {}", escaped(summary, FALLBACK_CHARS))
}

pub(crate) fn request_message(r: &Request) -> Value {
    let mut blocks = vec![
        section("*Approval needed:* ", &r.call.summary, SUMMARY_CHARS),
        section("*Why:* ", &r.call.reason, REASON_CHARS),
    ];
    if let Some(risk) = r.call.risk {
        blocks.push(section("*Risk:* ", risk.told(), REASON_CHARS));
    }
    if !r.text.is_empty() {
        blocks.push(section("*The agent said:* ", r.text, WORDS_CHARS));
    }
    blocks.extend(evidence_blocks(r.evidence, &r.target.run_id));
    let approvers = if r.call.nobody_decides() {
        "nobody".to_string()
    } else if r.call.reviewers.approvers.is_empty() {
        "any reviewer".to_string()
    } else {
        r.call.reviewers.approvers.join(", ")
    };
    blocks.push(
        json!({"type": "context", "elements": [{"type": "mrkdwn", "text": format!(
            "Agent {} · run {} · requested by {} · approvers: {} · {}",
            escaped(r.agent, NAME_CHARS),
            escape(&r.target.run_id),
            escaped(r.requested_by.unwrap_or("unknown"), NAME_CHARS),
            escaped(&approvers, APPROVERS_CHARS),
            deadline(r.call),
        )}]}),
    );
    blocks.extend(decision_blocks(r.target, r.call, r.grant_limits));
    debug_assert!(blocks.len() <= MAX_BLOCKS);
    json!({"channel": r.channel, "text": fallback(&r.call.summary), "blocks": blocks})
}

/// The tool results of the turn, each a `rich_text` block: a bold heading with the arguments
/// in code style, then the result preformatted. The first few, as long as the budget lasts;
/// then one line counting the rest.
fn evidence_blocks(evidence: &[Evidence], run_id: &str) -> Vec<Value> {
    let mut blocks = Vec::new();
    let mut budget = EVIDENCE_BUDGET;
    for e in evidence {
        if blocks.len() == MAX_EVIDENCE_SHOWN || budget < EVIDENCE_MIN {
            break;
        }
        let arguments = clipped(&e.input.to_string(), ARGUMENTS_CHARS);
        let content = if e.content.is_empty() {
            "(empty)".to_string()
        } else {
            clipped(&e.content, EVIDENCE_CHARS.min(budget))
        };
        budget = budget.saturating_sub(content.chars().count() + arguments.chars().count());
        let mut heading = vec![
            json!({"type": "text", "text": format!("Evidence — {}", clipped(&e.tool, NAME_CHARS)), "style": {"bold": true}}),
        ];
        if e.is_error {
            heading.push(json!({"type": "text", "text": " (failed)"}));
        }
        heading.push(json!({"type": "text", "text": " "}));
        heading.push(json!({"type": "text", "text": arguments, "style": {"code": true}}));
        blocks.push(json!({"type": "rich_text", "elements": [
            {"type": "rich_text_section", "elements": heading},
            {"type": "rich_text_preformatted", "elements": [{"type": "text", "text": content}]},
        ]}));
    }
    let more = evidence.len() - blocks.len();
    if more > 0 {
        blocks.push(
            json!({"type": "context", "elements": [{"type": "mrkdwn", "text": format!(
                "…and {more} more: see the run `{}`", escape(run_id)
            )}]}),
        );
    }
    blocks
}

/// A button for each action someone may take on the call (`authority::offered`: no Edit on
/// a call that needs several approvals); each click is checked for the person who made it.
fn buttons(target: &Target, call: &HeldCall) -> Value {
    let value = serde_json::to_string(target).expect("targets serialize");
    let run = RunFacts {
        requested_by: None,
        cancelling: false,
    };
    let elements: Vec<Value> = authority::offered(call, run)
        .into_iter()
        .map(|action| match action {
            Action::Approve => json!({"type": "button", "action_id": "approve", "style": "primary",
                "text": {"type": "plain_text", "text": "Approve"}, "value": value}),
            Action::Reject => json!({"type": "button", "action_id": "reject", "style": "danger",
                "text": {"type": "plain_text", "text": "Reject"}, "value": value}),
            Action::Edit => json!({"type": "button", "action_id": "edit",
                "text": {"type": "plain_text", "text": "Edit"}, "value": value}),
        })
        .collect();
    json!({"type": "actions", "block_id": "decision", "elements": elements})
}

/// The buttons, then, where the call can be approved and its tool's policy allows a preset
/// grant, the "Approve + allow similar" presets with the condition their grant would have.
fn decision_blocks(target: &Target, call: &HeldCall, limits: Option<GrantLimits>) -> Vec<Value> {
    let mut blocks = vec![buttons(target, call)];
    let run = RunFacts {
        requested_by: None,
        cancelling: false,
    };
    if !authority::offered(call, run).contains(&Action::Approve) {
        return blocks;
    }
    let presets: Vec<Value> = presets(limits)
        .into_iter()
        .enumerate()
        .map(|(i, (max_uses, expires_in))| {
            let label = format!("{max_uses} more for {expires_in}");
            let preset = GrantPreset {
                target: target.clone(),
                max_uses,
                expires_in,
            };
            let value = serde_json::to_string(&preset).expect("presets serialize");
            json!({"type": "button", "action_id": format!("{APPROVE_GRANT}_{i}"),
                "text": {"type": "plain_text", "text": label}, "value": value})
        })
        .collect();
    if presets.is_empty() {
        return blocks;
    }
    blocks.push(
        json!({"type": "context", "elements": [{"type": "mrkdwn", "text": format!(
            "*Approve + allow similar:* approve this call, and let later `{}` calls where `{}` \
             through without asking, as many and for as long as the button says.",
            escaped(&call.tool, NAME_CHARS),
            escaped(&condition::suggested(&call.input), CONDITION_CHARS),
        )}]}),
    );
    blocks.push(json!({"type": "actions", "block_id": APPROVE_GRANT, "elements": presets}));
    blocks
}

/// The presets `limits` allow (none without limits, or where grants are off).
fn presets(limits: Option<GrantLimits>) -> Vec<(u32, Span)> {
    let Some(limits) = limits else {
        return Vec::new();
    };
    PRESETS
        .iter()
        .filter_map(|&(max_uses, span)| {
            let expires_in: Span = span.parse().expect("the presets' spans parse");
            let terms = GrantTerms {
                condition: String::new(),
                same_requester: false,
                max_uses,
                expires_in,
                total: None,
            };
            limits
                .check(&terms)
                .is_ok()
                .then_some((terms.max_uses, terms.expires_in))
        })
        .collect()
}

/// What a standing grant an approval made lets through, for the decided message (markup: the
/// condition is escaped).
pub(crate) fn grant_made(grant: &Grant) -> String {
    format!(
        "Grant `{}` made: it approves up to {} more `{}` calls where `{}`, until {}.",
        escape(&grant.id),
        grant.max_uses,
        escaped(&grant.tool, NAME_CHARS),
        escaped(&grant.condition, CONDITION_CHARS),
        slack_date(grant.expires_at),
    )
}

/// What is posted when Slack refuses the full request (`why` is Slack's error): the summary,
/// a line with the run id, and the same buttons.
pub(crate) fn short_request_message(
    channel: &str,
    call: &HeldCall,
    target: &Target,
    limits: Option<GrantLimits>,
    why: &str,
) -> Value {
    let summary = &call.summary;
    let mut blocks = vec![
        section("*Approval needed:* ", summary, SUMMARY_CHARS),
        mrkdwn_section(format!(
            "Slack would not show the whole request ({}). The run `{}` has everything: the \
             arguments, the agent's words and the evidence.",
            escaped(why, NAME_CHARS),
            escape(&target.run_id),
        )),
    ];
    blocks.extend(decision_blocks(target, call, limits));
    json!({"channel": channel, "text": fallback(summary), "blocks": blocks})
}

/// The message once decided or expired: what was asked, the outcome (markup we wrote, with
/// any names in it escaped), and no buttons.
pub(crate) fn decided_message(channel: &str, ts: &str, summary: &str, outcome: &str) -> Value {
    let mut message = ended_message(channel, summary, outcome);
    message["ts"] = ts.into();
    message
}

/// The same, posted as a new message: for a call nobody was asked about (a standing grant
/// decided it), so there is no request to replace.
pub(crate) fn ended_message(channel: &str, summary: &str, outcome: &str) -> Value {
    json!({
        "channel": channel,
        "text": format!("{}: {outcome}", escaped(summary, FALLBACK_CHARS)),
        "blocks": [
            section("*Approval request:* ", summary, SUMMARY_CHARS),
            mrkdwn_section(outcome.to_string()),
        ],
    })
}

pub(crate) const REJECT: &str = "reject";
pub(crate) const EDIT: &str = "edit";
pub(crate) const CONFIRM_EDIT: &str = "confirm_edit";
/// Block and action ids of the modals' inputs.
pub(crate) const REASON: &str = "reason";
pub(crate) const INPUT: &str = "input";
pub(crate) const NOTE: &str = "note";

fn input_block(id: &str, label: &str, multiline: bool, initial: Option<String>) -> Value {
    let mut element = json!({"type": "plain_text_input", "action_id": id, "multiline": multiline, "max_length": MAX_INPUT});
    if let Some(initial) = initial {
        element["initial_value"] = initial.into();
    }
    json!({"type": "input", "block_id": id, "label": {"type": "plain_text", "text": label}, "element": element})
}

fn modal(
    trigger_id: &str,
    callback: &str,
    title: &str,
    submit: &str,
    target: &Target,
    blocks: Vec<Value>,
) -> Value {
    json!({"trigger_id": trigger_id, "view": {
        "type": "modal", "callback_id": callback,
        "title": {"type": "plain_text", "text": title},
        "submit": {"type": "plain_text", "text": submit},
        "close": {"type": "plain_text", "text": "Cancel"},
        "private_metadata": serde_json::to_string(target).expect("targets serialize"),
        "blocks": blocks,
    }})
}

pub(crate) fn reject_modal(trigger_id: &str, target: &Target) -> Value {
    let reason = input_block(REASON, "Why? The agent is told.", true, None);
    modal(
        trigger_id,
        REJECT,
        "Reject request",
        "Reject",
        target,
        vec![reason],
    )
}

/// Slack's limits count what its clients count; UTF-16 units are never fewer than
/// characters, so counting them errs on the side of refusing.
fn fits(text: &str, max: usize) -> bool {
    text.encode_utf16().count() <= max
}

/// The edit modal with the arguments as JSON; or, when they are too long for a text field,
/// a modal that says to edit the call through the API (a field that cannot hold the
/// arguments would lose some of them).
pub(crate) fn edit_modal(trigger_id: &str, target: &Target, input: &Value) -> Value {
    let pretty = serde_json::to_string_pretty(input).unwrap_or_default();
    let json = if fits(&pretty, MAX_INPUT) {
        pretty
    } else {
        let compact = input.to_string();
        if !fits(&compact, MAX_INPUT) {
            return edit_by_api_modal(trigger_id, target, compact.chars().count());
        }
        compact
    };
    let blocks = vec![
        input_block(INPUT, "Arguments (JSON)", true, Some(json)),
        input_block(NOTE, "Note for the agent", true, None),
    ];
    modal(
        trigger_id,
        EDIT,
        "Edit request",
        "Approve edited",
        target,
        blocks,
    )
}

/// What the edit modal's submission answers (Slack's `push` response action): a view that
/// shows the edit as a change, field by field, and the note, and whose submission records it.
/// `None` when the edit does not fit the view's `private_metadata`.
pub(crate) fn confirm_edit_view(edit: &EditToConfirm, changes: &[FieldChange]) -> Option<Value> {
    let metadata = serde_json::to_string(edit).expect("edits serialize");
    if !fits(&metadata, MAX_METADATA) {
        return None;
    }
    let blocks = vec![
        section(
            "*Your change:*\n",
            &edit::described(changes),
            MAX_SECTION_TEXT,
        ),
        section("*Note for the agent:* ", &edit.note, MAX_SECTION_TEXT),
        mrkdwn_section("Approve to run the call with this change; Back to change it again.".into()),
    ];
    Some(json!({"response_action": "push", "view": {
        "type": "modal", "callback_id": CONFIRM_EDIT,
        "title": {"type": "plain_text", "text": "Confirm edit"},
        "submit": {"type": "plain_text", "text": "Approve edited"},
        "close": {"type": "plain_text", "text": "Back"},
        "private_metadata": metadata,
        "blocks": blocks,
    }}))
}

/// What a submission of a view with no inputs answers when it records nothing (Slack shows
/// `errors` only under inputs): the view, updated to say why. Closing it closes the modal.
pub(crate) fn not_recorded_view(why: &str) -> Value {
    json!({"response_action": "update", "view": {
        "type": "modal", "callback_id": "not_recorded", "clear_on_close": true,
        "title": {"type": "plain_text", "text": "Not recorded"},
        "close": {"type": "plain_text", "text": "Close"},
        "blocks": [section("*Nothing was recorded:* ", why, MAX_SECTION_TEXT)],
    }})
}

/// Says where to edit a call whose arguments no Slack text field can hold. Nothing to submit.
fn edit_by_api_modal(trigger_id: &str, target: &Target, chars: usize) -> Value {
    let text = format!(
        "These arguments are {chars} characters long, more than a Slack text field holds \
         ({MAX_INPUT}), so they cannot be edited here. Edit the call through the API instead: \
         `POST /v1/runs/{}/decisions` with `call_id` `{}`, `action` `edit` and the new `input`. \
         Approve and Reject still work from the message.",
        escape(&target.run_id),
        escaped(&target.call_id, NAME_CHARS),
    );
    json!({"trigger_id": trigger_id, "view": {
        "type": "modal", "callback_id": "edit_by_api",
        "title": {"type": "plain_text", "text": "Edit through the API"},
        "close": {"type": "plain_text", "text": "Close"},
        "blocks": [mrkdwn_section(text)],
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_nothing_else() {
        assert_eq!(
            escape("<!channel> & <@U1|x> *bold*"),
            "&lt;!channel&gt; &amp; &lt;@U1|x&gt; *bold*"
        );
    }

    #[test]
    fn clipping_never_cuts_an_escape_or_a_character_and_fits() {
        let text = "é&".repeat(2000);
        for max in [1, 2, 5, 6, 7, 100, 2999, 3000] {
            let out = escaped(&text, max);
            assert!(out.chars().count() <= max, "{max}: {}", out.chars().count());
            assert!(out.ends_with(CUT));
            let body = out.trim_end_matches(CUT);
            assert_eq!(body.matches('&').count(), body.matches("&amp;").count());
        }
        assert_eq!(escaped("a<b", 6), "a&lt;b");
        assert_eq!(escaped("a<b", 5), "a…");
        assert_eq!(clipped("ééé", 2), "é…");
        assert_eq!(clipped("ééé", 3), "ééé");
    }

    /// Every text Slack parses in a message, with `rich_text` text elements left out.
    fn mrkdwn_texts(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Array(items) => items.iter().for_each(|v| mrkdwn_texts(v, out)),
            Value::Object(fields) if fields.get("type") == Some(&json!("text")) => {}
            Value::Object(fields) => {
                if let Some(Value::String(text)) = fields.get("text") {
                    out.push(text.clone());
                }
                fields.values().for_each(|v| mrkdwn_texts(v, out));
            }
            _ => {}
        }
    }

    #[test]
    fn a_request_of_anything_fits_slacks_limits_and_pings_nobody() {
        // `&` grows fivefold when escaped: the worst case for clipping.
        let huge = "&<!channel>".repeat(2000);
        let call: HeldCall = serde_json::from_value(json!({
            "call_id": "toolu_2", "tool": "issue_refund", "input": {"order_id": huge},
            "digest": "d", "summary": huge, "reason": huge, "approvers": [huge],
            "deadline": 1_700_000_000_000i64,
        }))
        .unwrap();
        let evidence: Vec<Evidence> = (0..100)
            .map(|i| Evidence {
                call_id: format!("toolu_{i}"),
                tool: huge.clone(),
                input: json!({"order_id": huge}),
                content: huge.clone(),
                is_error: i % 2 == 0,
            })
            .collect();
        let target = Target {
            run_id: "run_1".into(),
            call_id: "toolu_2".into(),
            digest: "d".into(),
        };
        let message = request_message(&Request {
            channel: "#refunds",
            agent: &huge,
            requested_by: Some(&huge),
            text: &huge,
            call: &call,
            evidence: &evidence,
            target: &target,
            grant_limits: Some(GrantLimits {
                allowed: true,
                max_uses: 100,
                max_duration_secs: 86400,
            }),
        });
        let blocks = message["blocks"].as_array().unwrap();
        assert!(
            blocks.iter().any(|b| b["block_id"] == APPROVE_GRANT),
            "the presets are offered"
        );
        assert!(blocks.len() <= MAX_BLOCKS);
        let mut texts = Vec::new();
        mrkdwn_texts(&message, &mut texts);
        for text in &texts {
            assert!(text.chars().count() <= MAX_SECTION_TEXT);
            assert!(!text.contains("<!channel>"), "{text}");
        }
        // Slack refuses a message whose blocks hold more than about 12,000 characters of text.
        fn text_chars(value: &Value) -> usize {
            match value {
                Value::Array(items) => items.iter().map(text_chars).sum(),
                Value::Object(fields) => fields
                    .iter()
                    .map(|(key, v)| match v {
                        Value::String(text) if key == "text" => text.chars().count(),
                        v => text_chars(v),
                    })
                    .sum(),
                _ => 0,
            }
        }
        let all = text_chars(&message["blocks"]);
        assert!(all < 10_000, "{all} characters of block text");
        assert!(message["text"].as_str().unwrap().chars().count() <= 4000);
        let shown = blocks.iter().filter(|b| b["type"] == "rich_text").count();
        assert!(shown >= 1);
        let more = format!("…and {} more: see the run `run_1`", 100 - shown);
        assert!(message.to_string().contains(&more), "{more}");
    }

    #[test]
    fn only_the_presets_the_policy_allows_are_offered_and_none_where_approve_is_not() {
        let call: HeldCall = serde_json::from_value(json!({
            "call_id": "toolu_2", "tool": "issue_refund", "input": {"amount": 129},
            "digest": "d", "summary": "s", "reason": "r",
        }))
        .unwrap();
        let target = Target {
            run_id: "run_1".into(),
            call_id: "toolu_2".into(),
            digest: "d".into(),
        };
        let limits = |allowed, max_uses, max_duration_secs| {
            Some(GrantLimits {
                allowed,
                max_uses,
                max_duration_secs,
            })
        };
        let offered = |limits: Option<GrantLimits>| -> Vec<GrantPreset> {
            decision_blocks(&target, &call, limits)
                .iter()
                .filter(|b| b["block_id"] == APPROVE_GRANT)
                .flat_map(|b| b["elements"].as_array().unwrap().clone())
                .map(|e| serde_json::from_str(e["value"].as_str().unwrap()).unwrap())
                .collect()
        };
        let all = offered(limits(true, 100, 86400));
        let terms: Vec<(u32, u64)> = all
            .iter()
            .map(|p| (p.max_uses, p.expires_in.duration.as_secs()))
            .collect();
        assert_eq!(terms, [(10, 3600), (50, 8 * 3600)]);
        assert_eq!(all[0].target.digest, "d");
        // 50 uses, or 8 hours, is more than this policy allows.
        assert_eq!(offered(limits(true, 20, 86400)).len(), 1);
        assert_eq!(offered(limits(true, 100, 7200)).len(), 1);
        assert!(offered(limits(false, 100, 86400)).is_empty());
        assert!(offered(None).is_empty());
        let blocks = decision_blocks(&target, &call, limits(true, 100, 86400));
        let shown = blocks[1].to_string();
        assert!(shown.contains("input.amount &lt;= 129.0"), "{shown}");
    }

    #[test]
    fn arguments_too_long_for_a_text_field_open_a_modal_that_points_to_the_api() {
        let target = Target {
            run_id: "run_1".into(),
            call_id: "<!channel>".into(),
            digest: "d".into(),
        };
        let fits = edit_modal("t", &target, &json!({"a": "x".repeat(2900)}));
        assert_eq!(fits["view"]["callback_id"], EDIT);
        let too_long = edit_modal("t", &target, &json!({"a": "x".repeat(3000)}));
        assert_eq!(too_long["view"]["callback_id"], "edit_by_api");
        let text = too_long["view"]["blocks"][0]["text"]["text"]
            .as_str()
            .unwrap();
        assert!(text.contains("/v1/runs/run_1/decisions") && text.contains("&lt;!channel&gt;"));
    }

    #[test]
    fn an_edit_confirmation_shows_the_change_inert_or_is_none_past_the_metadata_limit() {
        let edit = |input: Value| EditToConfirm {
            target: Target {
                run_id: "run_1".into(),
                call_id: "toolu_1".into(),
                digest: "d".into(),
            },
            input,
            note: "<!channel> lid only".into(),
        };
        let held = json!({"amount": 129});
        let small = edit(json!({"amount": 50}));
        let push = confirm_edit_view(&small, &edit::changes(&held, &small.input)).unwrap();
        assert_eq!(push["response_action"], "push");
        let view = &push["view"];
        assert_eq!(view["callback_id"], CONFIRM_EDIT);
        let carried: EditToConfirm =
            serde_json::from_str(view["private_metadata"].as_str().unwrap()).unwrap();
        assert_eq!(
            (carried.input, carried.target.digest),
            (small.input, "d".into())
        );
        let text = view["blocks"].to_string();
        assert!(text.contains("amount: 129 → 50") && text.contains("&lt;!channel&gt;"));
        let big = edit(json!({"amount": "9".repeat(3000)}));
        assert!(confirm_edit_view(&big, &edit::changes(&held, &big.input)).is_none());
    }

    #[test]
    fn dates_are_slack_dates_with_a_utc_fallback() {
        assert_eq!(
            slack_date(1_700_000_000_123),
            "<!date^1700000000^{date_short_pretty} at {time}|2023-11-14 22:13 UTC>"
        );
    }
}
