//! Messages on NATS. Each is JSON with a `type` and a `version` field.

use crate::door::DoorCall;
use crate::run::{Action, FailedCall, HeldCall, Run, RunId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The version of every payload below; bump it when a field changes meaning.
pub const EVENT_VERSION: u32 = 1;

/// A message on NATS as sent: the event's fields beside `type`, and the payload `version`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The payload version it was written with ([`EVENT_VERSION`]).
    pub version: u32,
    /// The event itself, its fields flattened into the message.
    #[serde(flatten)]
    pub event: Event,
}

impl Envelope {
    /// `event` in an envelope of the current [`EVENT_VERSION`].
    pub fn new(event: Event) -> Self {
        Self {
            version: EVENT_VERSION,
            event,
        }
    }
}

/// One tool result the agent had seen when it asked for approval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// The call that gave it.
    pub call_id: String,
    /// The tool called.
    pub tool: String,
    /// The arguments it ran with.
    pub input: Value,
    /// What the tool answered (or why the call failed), as the model was told.
    pub content: String,
    /// Whether the model was told it as an error.
    pub is_error: bool,
}

/// What happened to a run, or what is to be done with one; `type` on the wire names the case
/// (`run.start`, `approval.requested`, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    /// A job on `runs.start`, published by the gateway that stored the run; a worker never
    /// creates a run from one.
    #[serde(rename = "run.start")]
    RunStart {
        /// The run to start, already stored.
        run_id: RunId,
        /// The agent it talks to.
        agent: String,
        /// The requester's input, the conversation's first message.
        input: String,
        /// The principal who started it.
        #[serde(default)]
        requested_by: Option<String>,
        /// The requester's JSON about the run, which policies read as `metadata`.
        #[serde(default)]
        metadata: Value,
    },
    /// A run paused on calls held for a person; the worker announces it, and the gateway's
    /// doors ask the reviewers.
    #[serde(rename = "approval.requested")]
    ApprovalRequested {
        /// The paused run.
        run_id: RunId,
        /// The agent it talks to.
        agent: String,
        /// The turn the calls were asked in.
        turn: u32,
        /// The model's own words in the turn that asked for the calls.
        text: String,
        /// The calls held for a person, with what reviewers are shown.
        calls: Vec<HeldCall>,
        /// The results of the turn's calls that needed nobody: what the agent had seen.
        #[serde(default)]
        evidence: Vec<Evidence>,
        /// The principal who started the run.
        #[serde(default)]
        requested_by: Option<String>,
    },
    /// A decision on a held call was recorded (by a person, a grant, a deadline or a policy
    /// change).
    #[serde(rename = "approval.decided")]
    ApprovalDecided {
        /// The run the call belongs to.
        run_id: RunId,
        /// The call decided.
        call_id: String,
        /// What was decided.
        action: Action,
        /// The principal who decided, or the system name for a decision nobody made.
        decided_by: String,
        /// The door the decision came through (`api`, `web`, `slack`, `email`, `webhook`,
        /// `grant`, `deadline`, `policy`).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        door: String,
        /// Whether every held call of the turn now has a decision.
        all_decided: bool,
        /// The channels the call was sent to, which should show the outcome.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        channels: Vec<String>,
        /// The standing grant that decided the call (nobody was asked, so no channel showed
        /// it before).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        under_grant: Option<String>,
        /// Closed undecided because its policy changed while it waited; its run is checked
        /// again under the policy now (a call held again is announced anew).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        superseded: bool,
    },
    /// A held call still waits: a reminder before its deadline, or (`escalated`) its deadline
    /// passed and more approvers are asked, with a later deadline.
    #[serde(rename = "approval.reminder")]
    ApprovalReminder {
        /// The run the call belongs to.
        run_id: RunId,
        /// The agent it talks to.
        agent: String,
        /// The model's words in the turn that asked for the call.
        text: String,
        /// The call that waits, with its reviewers and deadline (extended, on escalation).
        call: Box<HeldCall>,
        /// Whether its deadline passed and it was escalated, rather than a reminder.
        escalated: bool,
        /// The principal who started the run.
        #[serde(default)]
        requested_by: Option<String>,
    },
    /// A held call's deadline passed with no decision; it counts as refused.
    #[serde(rename = "approval.expired")]
    ApprovalExpired {
        /// The run the call belongs to.
        run_id: RunId,
        /// The call that expired.
        call_id: String,
        /// The deadline that passed, in milliseconds since the epoch.
        deadline: i64,
        /// The channels the call was sent to, which should show it expired.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        channels: Vec<String>,
    },
    /// A person should look: a call's side effect may or may not have happened (its worker
    /// died after starting it, and the tool is not idempotent; `call_id`, `tool` and `input`
    /// name it), or the run's stored state cannot be read, so no worker goes on with it.
    #[serde(rename = "run.attention")]
    RunAttention {
        /// The run to look at.
        run_id: RunId,
        /// The call whose side effect is in doubt; `None` when the run's state cannot be read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// That call's tool.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        /// That call's input; `null` when there is no call.
        #[serde(default)]
        input: Value,
        /// What went wrong, for the person who looks.
        reason: String,
    },
    /// A call held or decided under a policy that changed since was checked again under the
    /// new one: `released` (it runs), `reheld` (asked again as `new_call_id`), `refused` (its
    /// tool is gone or its input no longer fits; the model is told) or `superseded` (a waiting
    /// call closed so that its run is checked again).
    #[serde(rename = "run.policy_changed")]
    RunPolicyChanged {
        /// The run the call belongs to.
        run_id: RunId,
        /// The call checked again.
        call_id: String,
        /// The tool the call is for.
        tool: String,
        /// `released`, `reheld`, `refused` or `superseded` (see the variant).
        outcome: String,
        /// The policy version the call was held under, and the version now (empty when the
        /// tool is gone).
        from_version: String,
        /// The tool's policy version now; empty when the tool is gone.
        to_version: String,
        /// The id of the call held again, when the outcome is `reheld`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        new_call_id: Option<String>,
        /// On `refused`, what the model is told about the refusal; empty otherwise.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
        /// The channels the call was sent to, which should show what became of it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        channels: Vec<String>,
    },
    /// A tool's shadow policy sorted a call differently from the live one, which decided:
    /// `would_hold`, `would_release` or `other_reviewers`; `live` and `shadow` say what each
    /// did (`{"gate": "run"}`, or `{"gate": "hold", "approvers", "quorum"}`).
    #[serde(rename = "run.policy_shadow")]
    RunPolicyShadow {
        /// The run the call belongs to.
        run_id: RunId,
        /// The call sorted differently.
        call_id: String,
        /// The tool the call is for.
        tool: String,
        /// How they differ: `would_hold`, `would_release` or `other_reviewers`.
        outcome: String,
        /// What the live policy did.
        live: Value,
        /// What the shadow policy would have done.
        shadow: Value,
    },
    /// A held call was closed undecided because its run was cancelled.
    #[serde(rename = "approval.cancelled")]
    ApprovalCancelled {
        /// The run that was cancelled.
        run_id: RunId,
        /// The call closed.
        call_id: String,
        /// The principal who cancelled the run.
        cancelled_by: String,
        /// The channels the call was sent to, which should show it was cancelled.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        channels: Vec<String>,
    },
    /// The run ended with the model's answer. `failed_calls` are its calls that failed
    /// ([`Run::failed_calls`], from the stored results): the model answered anyway, so a run
    /// can complete without doing what it was asked.
    #[serde(rename = "run.completed")]
    RunCompleted {
        /// The run that completed.
        run_id: RunId,
        /// The model's final words.
        answer: String,
        /// The run's calls that failed, in the order they were asked; empty if none did.
        #[serde(default)]
        failed_calls: Vec<FailedCall>,
    },
    /// The run stopped on an error and is `failed`.
    #[serde(rename = "run.failed")]
    RunFailed {
        /// The run that failed.
        run_id: RunId,
        /// Why it failed.
        error: String,
    },
    /// The run was cancelled and is `cancelled`.
    #[serde(rename = "run.cancelled")]
    RunCancelled {
        /// The run that was cancelled.
        run_id: RunId,
        /// The principal who asked to cancel it.
        cancelled_by: String,
        /// Why, in their words; `None` when they gave no reason.
        #[serde(default)]
        reason: Option<String>,
    },
}

impl Event {
    /// The `approval.requested` of `run` as stored, paused on its held calls: what the worker
    /// announces, and what the gateway shows and matches grants against whatever the message
    /// on NATS said (the stored run is the one authority on what waits).
    pub fn approval_requested(run: &Run) -> Self {
        Event::ApprovalRequested {
            run_id: run.run_id.clone(),
            agent: run.agent.clone(),
            turn: run.turns,
            text: run.paused_turn_text(),
            calls: run.held_calls().cloned().collect(),
            evidence: seen_by_agent(run),
            requested_by: run.requested_by.clone(),
        }
    }
}

/// What the agent of `run` had seen when it asked for the calls it waits on: for an external
/// agent, what it sent with its ask ([`DoorCall`]'s evidence, with ids of their own); then the
/// results of the paused turn's calls that needed nobody.
pub fn seen_by_agent(run: &Run) -> Vec<Evidence> {
    let sent = DoorCall::of_run(&run.metadata)
        .map(|call| call.evidence)
        .unwrap_or_default();
    let sent = sent.into_iter().enumerate().map(|(i, seen)| Evidence {
        call_id: format!("seen_{}", i + 1),
        tool: seen.tool,
        input: seen.input,
        content: seen.content,
        is_error: seen.is_error,
    });
    let ran = run.paused_turn.iter().filter_map(|c| {
        let result = c.result.as_ref()?;
        Some(Evidence {
            call_id: c.call_id.clone(),
            tool: c.tool.clone(),
            input: c.input.clone(),
            content: result.content.clone(),
            is_error: result.is_error,
        })
    });
    sent.chain(ran).collect()
}

/// How many times [`Event::fit`] cuts before it gives up.
const FIT_ROUNDS: usize = 16;

/// `text` cut to at most about `keep` bytes (its start and its end, on character
/// boundaries), saying in the middle how much was left out and why.
fn trimmed(text: &str, keep: usize, what: &str) -> String {
    let head = floor_boundary(text, keep / 2);
    let tail = ceil_boundary(text, text.len().saturating_sub(keep - head).max(head));
    format!(
        "{}\n[… {} bytes of {what} left out here, so that this message fits the message bus's payload limit; the run holds it whole …]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

fn floor_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// Room for the note that says what was cut, in bytes.
const NOTE_ROOM: usize = 300;

/// The cap on each of texts of JSON lengths `lengths` under which they take at most
/// `budget` together (water-filling: the longest are cut first, to one length).
fn cap(lengths: &[usize], budget: usize) -> usize {
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let mut left = budget;
    for (i, len) in sorted.iter().enumerate() {
        let rest = sorted.len() - i;
        if len * rest > left {
            return left / rest;
        }
        left -= len;
    }
    usize::MAX
}

impl Event {
    /// The texts [`Event::fit`] may cut, and what each is.
    fn cuttable(&mut self) -> Vec<(&mut String, &'static str)> {
        let mut texts: Vec<(&mut String, &'static str)> = Vec::new();
        match self {
            Event::ApprovalRequested { text, evidence, .. } => {
                texts.push((text, "the model's text"));
                for e in evidence.iter_mut() {
                    texts.push((&mut e.content, "this result"));
                }
            }
            Event::ApprovalReminder { text, .. } => texts.push((text, "the model's text")),
            _ => {}
        }
        texts
    }

    /// Cuts what the model said (its text, the results it had seen) until the event, as
    /// published ([`Envelope`]), takes at most `limit` bytes: NATS refuses a message over its
    /// `max_payload`, and an announcement refused would be tried again forever, telling no
    /// channel. The longest texts are cut first, each keeping its start and its end and
    /// saying in the middle how much was left out; the held calls themselves (whose input
    /// the worker caps per turn) are never cut, nor anything a decision binds. Returns
    /// whether the event now fits; one that does not is left cut as far as it goes.
    pub fn fit(&mut self, limit: usize) -> bool {
        let size = |e: &Event| {
            serde_json::to_vec(&Envelope::new(e.clone())).map_or(usize::MAX, |v| v.len())
        };
        if size(self) <= limit {
            return true;
        }
        let originals: Vec<String> = self.cuttable().iter().map(|(t, _)| t.to_string()).collect();
        if originals.is_empty() {
            return false;
        }
        let json_len = |t: &str| serde_json::to_string(t).map_or(t.len(), |j| j.len());
        let lengths: Vec<usize> = originals.iter().map(|t| json_len(t)).collect();
        let mut without = self.clone();
        for (t, _) in without.cuttable() {
            t.clear();
        }
        let base = size(&without);
        let mut budget = limit
            .saturating_sub(base)
            .saturating_sub(NOTE_ROOM * originals.len());
        for _ in 0..FIT_ROUNDS {
            let cap = cap(&lengths, budget);
            for ((text, what), (original, json)) in self
                .cuttable()
                .into_iter()
                .zip(originals.iter().zip(&lengths))
            {
                *text = if *json <= cap {
                    original.clone()
                } else {
                    // The cap is in JSON bytes; escapes make some texts longer as JSON.
                    let keep = (cap as u128 * original.len() as u128 / *json as u128) as usize;
                    trimmed(original, keep, what)
                };
            }
            let now = size(self);
            if now <= limit {
                return true;
            }
            budget = budget.saturating_sub(now - limit);
        }
        self.drop_evidence_inputs(limit)
    }
    /// The last resort of [`Event::fit`]: the inputs of the calls that ran at once, which
    /// the run keeps, are replaced by a note.
    fn drop_evidence_inputs(&mut self, limit: usize) -> bool {
        if let Event::ApprovalRequested { evidence, .. } = self {
            for e in evidence.iter_mut() {
                e.input = Value::String(
                    "[left out, so that this message fits the message bus's payload limit]".into(),
                );
            }
        }
        serde_json::to_vec(&Envelope::new(self.clone())).is_ok_and(|v| v.len() <= limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_carry_type_and_version() {
        let e = Envelope::new(Event::RunCompleted {
            run_id: RunId::parse("run_1").unwrap(),
            answer: "done".into(),
            failed_calls: Vec::new(),
        });
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "run.completed");
        assert_eq!(v["version"], 1);
        assert_eq!(serde_json::from_value::<Envelope>(v).unwrap(), e);
    }

    fn requested(text: String, evidence: Vec<Evidence>) -> Event {
        Event::ApprovalRequested {
            run_id: RunId::parse("run_1").unwrap(),
            agent: "refunds".into(),
            turn: 1,
            text,
            calls: Vec::new(),
            evidence,
            requested_by: None,
        }
    }

    fn size(event: &Event) -> usize {
        serde_json::to_vec(&Envelope::new(event.clone()))
            .unwrap()
            .len()
    }

    #[test]
    fn an_event_is_cut_to_fit_and_says_so() {
        let limit = 64 * 1024;
        // Small: as it was.
        let mut small = requested("short".into(), Vec::new());
        assert!(small.fit(limit));
        assert_eq!(small, requested("short".into(), Vec::new()));

        // The model's text, with line breaks and multi-byte characters that JSON escapes or
        // that a cut must not split, and a long result: cut to fit, start and end kept.
        let text = format!("START {} END", "é\n\"x".repeat(100_000));
        let evidence = vec![Evidence {
            call_id: "toolu_1".into(),
            tool: "get_order".into(),
            input: serde_json::json!({"order_id": "A-1"}),
            content: "r".repeat(300_000),
            is_error: false,
        }];
        let mut big = requested(text, evidence);
        assert!(size(&big) > limit);
        assert!(big.fit(limit));
        assert!(size(&big) <= limit, "{}", size(&big));
        let Event::ApprovalRequested { text, evidence, .. } = &big else {
            unreachable!()
        };
        assert!(
            text.starts_with("START") && text.ends_with("END"),
            "{text:.80}"
        );
        assert!(text.contains("bytes of the model's text left out here"));
        assert!(
            evidence[0]
                .content
                .contains("bytes of this result left out here")
        );
        assert_eq!(evidence[0].input, serde_json::json!({"order_id": "A-1"}));

        // Other events are left as they are.
        let mut done = Event::RunCompleted {
            run_id: RunId::parse("run_1").unwrap(),
            answer: "a".repeat(100),
            failed_calls: Vec::new(),
        };
        assert!(!done.fit(10));
    }
}
