//! A tool's approval policy as its agent file writes it (`approval = "never"`, or a
//! `[tools.approval]` table): when a call is held, who may decide it and how many must
//! approve, where they are asked, what its deadline does, and what standing grants it allows.
//! Apart from agent definitions because MCP discovery (the policy a server's tool gets when
//! the agent sets none) and held calls (the reviewers they carry) use it too.

use crate::grant::{self, GrantLimits};
use crate::span::Span;
use crate::stage::StageDef;
use crate::window::WindowDef;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A policy written as one word: `approval = "never"` or `"always"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// Calls run without a person.
    Never,
    /// Every call waits for a person, with the defaults of an empty `[tools.approval]`.
    Always,
}

/// A tool's approval policy: one word, or a `[tools.approval]` table. Absent, it is `always`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ApprovalDef {
    /// `approval = "never"` or `"always"`.
    Mode(ApprovalMode),
    /// A `[tools.approval]` table.
    Rule(Box<ApprovalRule>),
}

impl ApprovalDef {
    /// Who may decide the calls it holds, how many must approve, and where to ask (with
    /// stages, at the first).
    pub fn reviewers(&self) -> Reviewers {
        self.reviewers_at(1)
    }

    /// [`ApprovalDef::reviewers`] at stage `number` (1-based) of a policy with stages; the
    /// policy's own without.
    pub fn reviewers_at(&self, number: u32) -> Reviewers {
        let ApprovalDef::Rule(rule) = self else {
            return Reviewers::default();
        };
        let stage = rule.stages.get(number.max(1) as usize - 1);
        let (approvers, quorum, channels) = match stage {
            Some(s) => (&s.approvers, s.quorum, &s.channels),
            None => (&rule.approvers, rule.quorum, &rule.channels),
        };
        Reviewers {
            approvers: approvers.clone(),
            quorum,
            channels: channels.iter().map(Channel::to_string).collect(),
            allow_self_approval: rule.allow_self_approval,
            on_expiry: rule.on_expiry,
            escalate_to: rule.escalate_to.clone(),
        }
    }

    /// The policy's stages, in order (none without).
    pub fn stages(&self) -> &[StageDef] {
        match self {
            ApprovalDef::Rule(rule) => &rule.stages,
            ApprovalDef::Mode(_) => &[],
        }
    }

    /// The policy's authority limits, if it sets any.
    pub fn limits(&self) -> Option<&BTreeMap<String, String>> {
        match self {
            ApprovalDef::Rule(rule) if !rule.limits.is_empty() => Some(&rule.limits),
            _ => None,
        }
    }

    /// The policy's windows, if it has any.
    pub fn windows(&self) -> Option<&BTreeMap<String, WindowDef>> {
        match self {
            ApprovalDef::Rule(rule) if !rule.windows.is_empty() => Some(&rule.windows),
            _ => None,
        }
    }

    /// What the policy allows of standing grants on the calls it holds; a `never` or
    /// `always` policy allows what an empty `[tools.approval]` does.
    pub fn grant_limits(&self) -> GrantLimits {
        let default = ApprovalRule::held();
        let rule = match self {
            ApprovalDef::Rule(rule) => rule,
            ApprovalDef::Mode(_) => &default,
        };
        GrantLimits {
            // A grant would approve in its makers' names past stages they are not.
            allowed: rule.grants && rule.stages.is_empty(),
            max_uses: rule.grant_max_uses,
            max_duration_secs: rule
                .grant_max_duration
                .as_ref()
                .map_or(DEFAULT_GRANT_MAX_SECS, |d| d.duration.as_secs())
                .min(grant::MAX_DURATION_SECS),
        }
    }
}

impl Default for ApprovalDef {
    fn default() -> Self {
        Self::Mode(ApprovalMode::Always)
    }
}

/// A `[tools.approval]` table: when calls are held, who decides them, where they are asked,
/// what the deadline does and what grants are allowed.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRule {
    /// CEL over `input` (the call's arguments) and `metadata` (the run's), or `always`/`never`.
    #[serde(default = "always")]
    pub when: String,
    /// Why a person is asked, a template (`{{ cel expr }}` parts are filled in).
    #[serde(default)]
    pub reason: Option<String>,
    /// What the call would do, in plain words, a template like `reason`.
    #[serde(default)]
    pub summary: Option<String>,
    /// Who may decide: principal ids and `role:NAME` entries. Empty means anyone whose key
    /// may decide.
    #[serde(default)]
    pub approvers: Vec<String>,
    /// How many distinct people must approve; any rejection rejects. Default 1.
    #[serde(default = "one")]
    pub quorum: u32,
    /// Where to ask: `slack:#channel`, `email:address`, `webhook:name`.
    #[serde(default)]
    pub channels: Vec<Channel>,
    /// Whether the person who requested the run may approve it. Default false.
    #[serde(default)]
    pub allow_self_approval: bool,
    /// How long a person has to decide (`90s`, `30m`, `24h`, `7d`); then the call expires
    /// and does not run. Default: the worker's `default_approval_timeout_secs`.
    #[serde(default)]
    pub timeout: Option<Span>,
    /// What the deadline does: `reject` (default; the call expires) or `escalate` (the
    /// `escalate_to` approvers are asked too and the deadline is extended once; then reject).
    #[serde(default)]
    pub on_expiry: OnExpiry,
    /// Who is added to the approvers on escalation: principal ids and `role:NAME` entries.
    #[serde(default)]
    pub escalate_to: Vec<String>,
    /// Authority limits: an approver entry (as `approvers` and `escalate_to` name them) whose
    /// decisions count only for calls its condition over `input` holds for; an entry here
    /// that the policy does not list decides calls above every listed approver's limit that
    /// its own covers (see [`crate::limits`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
    /// Approvals in order: each stage with its own approvers, quorum, deadline and channels,
    /// asked only once the stages before it approved (see [`crate::stage`]). With stages, the
    /// policy's own `approvers`, `quorum`, `timeout` and `channels` are those of the stages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageDef>,
    /// Running counts and sums over the tool's recent calls, which `when` reads as
    /// `window.NAME` (see [`crate::window`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub windows: BTreeMap<String, WindowDef>,
    /// How long before the deadline to remind the approvers (`10m`, `1h`); default none.
    #[serde(default)]
    pub remind_before: Option<Span>,
    /// Whether a reviewer may approve calls like one in advance (a standing grant). Default
    /// true.
    #[serde(default = "yes")]
    pub grants: bool,
    /// The most uses a grant may have. Default 100.
    #[serde(default = "default_grant_max_uses")]
    pub grant_max_uses: u32,
    /// The longest a grant may last (`8h`, `7d`). Default 24h; never more than 30 days.
    #[serde(default)]
    pub grant_max_duration: Option<Span>,
}

fn yes() -> bool {
    true
}

fn default_grant_max_uses() -> u32 {
    100
}

/// How long a grant may last when the policy does not say.
const DEFAULT_GRANT_MAX_SECS: u64 = 86400;

/// What a held call's deadline does when nobody decided (`on_expiry`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExpiry {
    /// The call expires and does not run (the default).
    #[default]
    Reject,
    /// The `escalate_to` approvers are asked too and the deadline is extended once; then it
    /// expires.
    Escalate,
}

fn always() -> String {
    "always".into()
}

impl ApprovalRule {
    /// Every call held, for anyone whose key may decide, with the defaults of an empty
    /// `[tools.approval]`.
    pub fn held() -> Self {
        Self {
            when: always(),
            reason: None,
            summary: None,
            approvers: Vec::new(),
            quorum: 1,
            channels: Vec::new(),
            allow_self_approval: false,
            timeout: None,
            on_expiry: OnExpiry::Reject,
            escalate_to: Vec::new(),
            limits: BTreeMap::new(),
            windows: BTreeMap::new(),
            stages: Vec::new(),
            remind_before: None,
            grants: true,
            grant_max_uses: default_grant_max_uses(),
            grant_max_duration: None,
        }
    }
}

fn one() -> u32 {
    1
}

/// Who may decide a held call, how many must approve, and where to ask: the part of a
/// tool's policy that travels with each held call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reviewers {
    /// Who may decide: principal ids and `role:NAME` entries; empty means anyone whose key may
    /// decide.
    #[serde(default)]
    pub approvers: Vec<String>,
    /// How many distinct people must approve; any rejection rejects. Default 1.
    #[serde(default = "one")]
    pub quorum: u32,
    /// Where to ask: `slack:#channel`, `email:address`, `webhook:name`.
    #[serde(default)]
    pub channels: Vec<String>,
    /// Whether the person who requested the run may approve it. Default false.
    #[serde(default)]
    pub allow_self_approval: bool,
    /// What the deadline does when nobody decided.
    #[serde(default)]
    pub on_expiry: OnExpiry,
    /// Who is added to the approvers on escalation: principal ids and `role:NAME` entries.
    #[serde(default)]
    pub escalate_to: Vec<String>,
}

impl Default for Reviewers {
    fn default() -> Self {
        Self {
            approvers: Vec::new(),
            quorum: 1,
            channels: Vec::new(),
            allow_self_approval: false,
            on_expiry: OnExpiry::Reject,
            escalate_to: Vec::new(),
        }
    }
}

/// Where a held call is sent, parsed once when the agent file is loaded. On the wire and in
/// stored data it is the string the policy wrote (`slack:#channel`, `email:address` or
/// `email:approvers`, `webhook:name`), so events and runs carry it unchanged.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Channel {
    /// A Slack channel, `#name` or an id.
    Slack(String),
    /// A person's address, or `approvers`: everyone with an address who may decide.
    Email(String),
    /// A configured webhook, by name.
    Webhook(String),
}

impl Channel {
    /// `slack`, `email` or `webhook`.
    pub fn kind(&self) -> &'static str {
        match self {
            Channel::Slack(_) => "slack",
            Channel::Email(_) => "email",
            Channel::Webhook(_) => "webhook",
        }
    }

    /// What follows the kind: the Slack channel, the address, the webhook's name.
    pub fn target(&self) -> &str {
        match self {
            Channel::Slack(t) | Channel::Email(t) | Channel::Webhook(t) => t,
        }
    }

    /// Whether the channel shows each call on its own (Slack, email) rather than getting
    /// every event whole (webhooks).
    pub fn per_call(&self) -> bool {
        !matches!(self, Channel::Webhook(_))
    }
}

impl std::str::FromStr for Channel {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let parsed = match text.split_once(':') {
            Some((_, "")) | None => None,
            Some(("slack", t)) => Some(Channel::Slack(t.to_string())),
            Some(("email", t)) => Some(Channel::Email(t.to_string())),
            Some(("webhook", t)) => Some(Channel::Webhook(t.to_string())),
            Some(_) => None,
        };
        parsed.ok_or_else(|| {
            format!("channel {text:?} is not slack:#channel, email:address or webhook:name")
        })
    }
}

impl TryFrom<String> for Channel {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl From<Channel> for String {
    fn from(channel: Channel) -> String {
        channel.to_string()
    }
}

impl std::fmt::Display for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind(), self.target())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_reads_and_writes_as_the_string_the_policy_wrote() {
        for text in [
            "slack:#refunds",
            "email:approvers",
            "email:a@b.c",
            "webhook:ops:1",
        ] {
            let channel: Channel = text.parse().unwrap();
            assert_eq!(channel.to_string(), text);
            let json = serde_json::to_string(&channel).unwrap();
            assert_eq!(json, format!("{text:?}"));
            assert_eq!(serde_json::from_str::<Channel>(&json).unwrap(), channel);
        }
        assert_eq!(
            "slack:#x".parse::<Channel>(),
            Ok(Channel::Slack("#x".into()))
        );
        for bad in ["sms:123", "slack:", "slack", ""] {
            assert!(bad.parse::<Channel>().is_err(), "{bad}");
        }
    }
}

/// What a call of a tool does to the world, as the tool's entry declares it (`risk`): shown to
/// reviewers beside the policy's reason and named in the receipts of its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    /// It only reads.
    ReadOnly,
    /// What it changes can be undone.
    Reversible,
    /// It spends money or another budget.
    Costly,
    /// What it changes cannot be undone.
    Destructive,
}

impl Risk {
    /// The class as the file, the receipt and the API name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::ReadOnly => "read_only",
            Risk::Reversible => "reversible",
            Risk::Costly => "costly",
            Risk::Destructive => "destructive",
        }
    }

    /// The class as a reviewer reads it.
    pub fn told(self) -> &'static str {
        match self {
            Risk::ReadOnly => "read-only: it changes nothing",
            Risk::Reversible => "reversible: what it changes can be undone",
            Risk::Costly => "costly: it spends money",
            Risk::Destructive => "destructive: what it changes cannot be undone",
        }
    }
}
