//! What a request mail says (and the short notice of a call a standing grant approved), as plain text and as HTML (sent together as
//! `multipart/alternative`, so every client shows one of them): the action, why the policy
//! holds it, the exact input, what the agent said and saw, who asked, the deadline, and one
//! link per action. Everything the agent, a tool or a requester wrote is escaped in the HTML.

use super::html::escape;
use crate::channels::delivery::Ask;
use crate::channels::granted::Granted;
use countersign_model::run::{Action, HeldCall, RunId};

/// What a mail asks: the prefix of its subject (a reminder's), and whether the reader asked
/// for the run themselves (then they may only reject).
pub(super) struct Request<'a, 'b> {
    pub(super) ask: &'a Ask<'b>,
    pub(super) prefix: &'a str,
    pub(super) links: &'a [(Action, String)],
    pub(super) own: bool,
}

/// How much of one piece of evidence a mail shows.
const EVIDENCE_CHARS: usize = 500;

impl Request<'_, '_> {
    pub(super) fn subject(&self) -> String {
        format!("{}Approval needed: {}", self.prefix, self.ask.call.summary)
    }

    pub(super) fn text(&self) -> String {
        let (ask, call) = (self.ask, self.ask.call);
        let mut body = format!("{}\n\nWhy: {}\n", self.subject(), call.reason);
        if let Some(risk) = call.risk {
            body += &format!("Risk: {}\n", risk.told());
        }
        body += &format!("Input: {}\n", pretty(&call.input));
        if !ask.text.is_empty() {
            body += &format!("The agent said: {}\n", ask.text);
        }
        for e in ask.evidence {
            body += &format!("Evidence from {}: {}\n", e.tool, clipped(&e.content));
        }
        let links: Vec<String> = self
            .links
            .iter()
            .map(|(action, url)| format!("{:<9}{url}", format!("{}:", title_case(*action))))
            .collect();
        body += &format!(
            "\nAgent {}, run {}, requested by {}; {}.\n\n{}\n\n{}\n",
            ask.agent,
            ask.run_id,
            ask.requested_by.unwrap_or("unknown"),
            deadline(call),
            links.join("\n"),
            ONCE,
        );
        if self.own {
            body += OWN;
            body += "\n";
        }
        body
    }

    pub(super) fn html(&self) -> String {
        let (ask, call) = (self.ask, self.ask.call);
        let mut body = format!(
            "<!doctype html><html><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>{subject}</title></head>\
             <body style=\"font-family: sans-serif; max-width: 40em; margin: auto; padding: 1em\">\
             <h1 style=\"font-size: 1.3em\">{subject}</h1>\
             <p><strong>Why:</strong> {reason}</p>\
             <p><strong>Input:</strong></p><pre style=\"white-space: pre-wrap\">{input}</pre>",
            subject = escape(&self.subject()),
            reason = escape(&call.reason),
            input = escape(&pretty(&call.input)),
        );
        if let Some(risk) = call.risk {
            body += &format!("<p><strong>Risk:</strong> {}</p>", escape(risk.told()));
        }
        if !ask.text.is_empty() {
            body += &format!(
                "<p><strong>The agent said:</strong> {}</p>",
                escape(ask.text)
            );
        }
        for e in ask.evidence {
            body += &format!(
                "<p><strong>Evidence from {}:</strong></p><pre style=\"white-space: pre-wrap\">{}</pre>",
                escape(&e.tool),
                escape(&clipped(&e.content))
            );
        }
        body += &format!(
            "<p>Agent {}, run {}, requested by {}; {}.</p><p>",
            escape(ask.agent),
            escape(ask.run_id.as_str()),
            escape(ask.requested_by.unwrap_or("unknown")),
            deadline(call),
        );
        for (action, url) in self.links {
            body += &format!(
                "<a href=\"{}\" style=\"display: inline-block; margin: 0 1em 1em 0\">{}</a>",
                escape(url),
                title_case(*action)
            );
        }
        body += &format!("</p><p>{}</p>", escape(ONCE));
        if self.own {
            body += &format!("<p>{}</p>", escape(OWN));
        }
        body + "</body></html>"
    }
}

/// The notice that a standing grant approved a call nobody was asked about.
pub(super) struct Notice<'a> {
    pub(super) granted: &'a Granted,
    pub(super) run_id: &'a RunId,
    pub(super) call_id: &'a str,
}

impl Notice<'_> {
    pub(super) fn subject(&self) -> String {
        format!("{}: {}", self.granted.headline(), self.granted.summary)
    }

    fn lines(&self) -> [String; 2] {
        let id = &self.granted.id;
        [
            format!(
                "Nobody was asked: the standing grant {id} covers this call, so it ran (run {}, call {}).",
                self.run_id, self.call_id
            ),
            format!(
                "The grant's uses and terms: `countersign grants {id}`; it approves nothing more once revoked (`countersign revoke {id}`)."
            ),
        ]
    }

    pub(super) fn text(&self) -> String {
        let [ran, grant] = self.lines();
        format!("{}\n\n{ran}\n\n{grant}\n", self.subject())
    }

    pub(super) fn html(&self) -> String {
        let [ran, grant] = self.lines();
        format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>{subject}</title></head>\
             <body style=\"font-family: sans-serif; max-width: 40em; margin: auto; padding: 1em\">\
             <h1 style=\"font-size: 1.3em\">{subject}</h1><p>{ran}</p><p>{grant}</p></body></html>",
            subject = escape(&self.subject()),
            ran = escape(&ran),
            grant = escape(&grant),
        )
    }
}

const ONCE: &str = "Opening a link decides nothing: it shows a page where you confirm. The links work once, only for you, until the request is decided.";
const OWN: &str = "You asked for this run, so you may reject it but not approve it.";

fn pretty(input: &serde_json::Value) -> String {
    serde_json::to_string_pretty(input).unwrap_or_default()
}

fn clipped(content: &str) -> String {
    content.chars().take(EVIDENCE_CHARS).collect()
}

/// When the call expires, in plain text (a mail is not Slack markup).
fn deadline(call: &HeldCall) -> String {
    match call.deadline {
        Some(ms) => format!("decide by {}", crate::time::readable(ms)),
        None => "no deadline".into(),
    }
}

fn title_case(action: Action) -> &'static str {
    match action {
        Action::Approve => "Approve",
        Action::Reject => "Reject",
        Action::Edit => "Edit",
    }
}
