//! The run: a provider-neutral conversation with one agent, the calls of the turn it is
//! paused on, and the decisions reviewers make about them.
//!
//! Its states, and the one place each change is made (a script in `lua/`):
//!
//! ```text
//! queued ──claim──► running ──save(pause)──► awaiting_approval ──last decision, claim──► resuming
//!                    ▲  │                          │                                      │
//!                    │  └──save(progress)──────────┼──────────────────────────────────────┘
//!                    │                             │
//!  any of queued, running, awaiting_approval, resuming ──save(finish)──► completed | failed | cancelled
//! ```
//!
//! A resumed run stays `resuming` until its drive's next save, which may be any of progress,
//! pause or finish (the calls run on resuming are recorded by that save).
//! A worker holds a lease while a run is `running` or `resuming` and writes only through it;
//! the kind of save (the store's `Save`) decides the status written. Cancelling (by the
//! requester or an admin) marks the run; the next claim or save of a worker sees the mark and
//! finishes it as `cancelled` instead of going on. Terminal states never change again.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// A run's id: `run_` and a UUIDv7, so ids sort by creation time.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

impl RunId {
    /// A new id, `run_` and a fresh UUIDv7.
    pub fn new() -> Self {
        Self(format!("run_{}", uuid::Uuid::now_v7().simple()))
    }

    /// Accepts ids made only of ASCII letters, digits, '_' and '-' (they become parts of
    /// NATS subjects and Redis keys), at most 64 characters.
    pub fn parse(s: &str) -> Option<Self> {
        let ok = !s.is_empty() && s.len() <= 64 && plain(s);
        ok.then(|| Self(s.to_string()))
    }

    /// The id as text, as it appears in keys, subjects and the API.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for RunId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        RunId::parse(&s).ok_or_else(|| format!("invalid run id {s:?}"))
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> Self {
        id.0
    }
}

/// Where a run is in its life (see the module's diagram); stored in snake_case, as `as_str`
/// gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Started and waiting for a worker to claim it.
    Queued,
    /// A worker holds it and is calling the model or running its calls.
    Running,
    /// Paused on calls held for a person; no worker holds it.
    AwaitingApproval,
    /// Its last held call was decided and a worker took it back; stays so until the worker's
    /// next save.
    Resuming,
    /// The model gave its final answer (some calls may still have failed).
    Completed,
    /// Stopped by an error; `Run::error` says which.
    Failed,
    /// Stopped because someone asked to cancel it.
    Cancelled,
}

impl RunStatus {
    /// The status as stored and shown in the API (`awaiting_approval`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::AwaitingApproval => "awaiting_approval",
            Self::Resuming => "resuming",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The status named `s` as `as_str` gives it; `None` for any other text.
    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(Value::String(s.to_string())).ok()
    }

    /// Whether the run has ended (completed, failed or cancelled) and will never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

/// A request to stop a run: who asked, why, and when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cancellation {
    /// The principal who asked to cancel.
    pub by: String,
    /// Why, in their words; `None` when they gave no reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When they asked, in milliseconds since the epoch.
    pub at: i64,
}

/// Who says a message of the conversation (its `role` on the wire, as the model APIs name
/// it); apart from `authority::Role`, what a principal may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Speaker {
    /// The person who started the run, and the tool results sent back on their side.
    User,
    /// The model, whose answers may ask for tool calls.
    Assistant,
}

/// One block of a message, in the shape the Anthropic Messages API uses; the OpenAI
/// adapter translates to and from it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Words, of the user or the model.
    Text {
        /// What was said.
        text: String,
    },
    /// The model asks for a tool to be called.
    ToolUse {
        /// The model's id for the call, which its result answers.
        id: String,
        /// The tool asked for, as the agent names it.
        name: String,
        /// The arguments the model gave, a JSON object.
        input: Value,
    },
    /// The result of a call, sent back to the model in the user's message.
    ToolResult {
        /// The model's id of the call it answers.
        tool_use_id: String,
        /// What the model is told: the tool's answer or why the call did not run.
        content: String,
        /// Whether the model is told the call failed or was refused (left out of the JSON when
        /// false).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
        /// What happened to the call (kept with the run; the providers' adapters do not send
        /// it): it tells a call that failed from one a person or a deadline refused, which
        /// the model is told as an error too. Absent from results stored before it was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outcome: Option<CallOutcome>,
        /// Images the tool answered with besides its text (an MCP tool's image blocks); each
        /// provider's adapter passes them on in its own format.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<Image>,
        /// The call's [`CallResult::mcp`], kept with the run for the MCP proxy's client; the
        /// providers' adapters do not send it. Absent from results stored before it was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mcp: Option<Value>,
    },
}

/// An image a tool answered with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Image {
    /// `image/png`, `image/jpeg`, ...
    pub media_type: String,
    /// The image, base64.
    pub data: String,
}

/// One message of the conversation with the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who says it (`role` on the wire).
    pub role: Speaker,
    /// Its blocks, in order.
    pub content: Vec<Block>,
}

impl Message {
    /// A user message of one text block: how a run's conversation starts.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self {
            role: Speaker::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }

    /// The text blocks of this message joined, the agent's own words around its calls.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// What happened to one tool call, as the model and the reviewers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOutcome {
    /// Needed no approval and ran.
    Executed,
    /// A reviewer approved it and it ran as requested.
    Approved,
    /// A reviewer changed its input and it ran with theirs.
    Edited,
    /// A reviewer refused it; nothing ran.
    Rejected,
    /// It ran (or could not be run) and failed.
    Failed,
    /// It was started but its result was lost in a crash; a person should check.
    Unknown,
    /// Nobody decided before its deadline; nothing ran.
    Expired,
    /// The run was cancelled before it started; nothing ran.
    Cancelled,
    /// Let through (by its policy or a person) to the agent that asked, which runs it itself:
    /// the tool of an `external` agent with no endpoint. What it did is the agent's report.
    Released,
}

impl CallOutcome {
    /// Whether the call was let through (by its policy or a person) and did not do what it
    /// was asked: its tool answered an error or could not be reached, its input did not fit,
    /// or its outcome is unknown. A call a person or a deadline refused, or that a cancel
    /// stopped, did not fail: it was not to run.
    pub fn is_failure(self) -> bool {
        matches!(self, Self::Failed | Self::Unknown)
    }
}

/// A call of a run that failed (see [`CallOutcome::is_failure`]), as [`Run::failed_calls`]
/// finds it among the run's stored results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailedCall {
    /// The id the model gave the call (what its result answers).
    pub call_id: String,
    /// The tool the model asked for.
    pub tool: String,
    /// `failed`, or `unknown` for a call started whose result was lost.
    pub outcome: CallOutcome,
    /// The start of what the model was told, at most [`FailedCall::ERROR_CHARS`] characters.
    pub error: String,
}

impl FailedCall {
    /// How much of a failed call's result [`Run::failed_calls`] keeps (the run's messages
    /// hold it whole).
    pub const ERROR_CHARS: usize = 500;

    fn new(call_id: &str, tool: &str, outcome: CallOutcome, content: &str) -> Self {
        let error = match content.char_indices().nth(Self::ERROR_CHARS) {
            Some((at, _)) => format!("{}…", &content[..at]),
            None => content.to_string(),
        };
        Self {
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            outcome,
            error,
        }
    }
}

/// A call's result as it goes back to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallResult {
    /// What happened to the call.
    pub outcome: CallOutcome,
    /// What the model is told: the tool's answer, or why the call failed or did not run.
    pub content: String,
    /// Whether the model is told it as an error (failed, refused, expired or cancelled calls).
    pub is_error: bool,
    /// Images besides the text, for the model (reviewers read what `content` says of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
    /// The whole result of an MCP proxy run's call (MCP's `CallToolResult`, as JSON): every
    /// content block, the structured content and `isError` as the upstream server answered
    /// them, which the proxy answers its client with. Only a proxy run's MCP calls keep it,
    /// bounded by the worker (past the bound, the text with a note); the model and the
    /// reviewers read `content` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Value>,
}

impl CallResult {
    /// A call that ran (or could not be run) and failed, in `content`'s words.
    pub fn failed(content: String) -> Self {
        Self {
            outcome: CallOutcome::Failed,
            content,
            is_error: true,
            images: Vec::new(),
            mcp: None,
        }
    }
}

/// A call held for a person, with everything a reviewer is shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeldCall {
    /// The [`TurnCall`]'s id: it names this call alone in the run.
    pub call_id: String,
    /// The tool the model asked for.
    pub tool: String,
    /// The arguments the model gave, as the reviewer sees them.
    pub input: Value,
    /// The call's digest (`sha256:` and hex, see `digest::call_digest`): a decision must quote
    /// it.
    pub digest: String,
    /// The tool's policy version the call was held under (part of its digest).
    #[serde(default)]
    pub policy_version: String,
    /// What the call would do, in plain words, from the policy's summary template (`Call TOOL`
    /// without one).
    pub summary: String,
    /// Why the call waits for a person, from the policy's reason template (or a default).
    pub reason: String,
    /// Who may decide it, how many must approve, and where to ask.
    #[serde(flatten)]
    pub reviewers: crate::approval::Reviewers,
    /// The principals the approver list named when the call was held (roles resolved to the
    /// people holding them); absent when anyone may decide. The decision script checks this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deciders: Option<Vec<String>>,
    /// When it expires if nobody decides, in milliseconds since the epoch.
    #[serde(default)]
    pub deadline: Option<i64>,
    /// When its approvers are reminded, in milliseconds since the epoch.
    #[serde(default)]
    pub remind_at: Option<i64>,
    /// Whether its deadline has already escalated it (it escalates once).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub escalated: bool,
    /// Set when the call is asked about again because its tool's policy changed after it was
    /// held: what it replaces, so reviewers see what changed and what was decided before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recheck: Option<Recheck>,
    /// What the call does to the world, as its tool's entry declares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<crate::approval::Risk>,
    /// Its shares of its policy's windows, each with the window's total before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<crate::window::Share>,
    /// The stage it is held at, with a policy of stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<crate::stage::Stage>,
    /// Its tool's reviewer model approved it, live: the gateway decides it in the model's
    /// name (see [`crate::reviewer`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_approval: Option<crate::reviewer::ModelApproval>,
}

/// What a call held again after a policy change replaces.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recheck {
    /// The call as it was held before, under its own id.
    pub call_id: String,
    /// Its digest then.
    pub digest: String,
    /// The policy version it was held under (this call's `policy_version` is the new one).
    pub policy_version: String,
    /// The decision made on it under the old policy; none if it was still waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
}

impl TurnCall {
    /// The id a call gets when it is held again: `.r2`, `.r3`… after the first id, so it is
    /// decided, timed and executed apart from the call it replaces, and still answers the
    /// model's own id.
    pub fn held_again(&mut self) {
        let again = self
            .call_id
            .rsplit_once(".r")
            .and_then(|(base, n)| Some((base.to_string(), n.parse::<u32>().ok()? + 1)));
        let (base, n) = again.unwrap_or_else(|| (self.call_id.clone(), 2));
        let next = format!("{base}.r{n}");
        self.model_call_id = Some(self.model_id().to_string());
        self.call_id = next;
    }
}

impl HeldCall {
    /// Whether nobody may decide the call: its approvers resolved to no one (as above every
    /// approver's authority limit), which is not "anyone" (no list at all).
    pub fn nobody_decides(&self) -> bool {
        self.deciders.as_ref().is_some_and(Vec::is_empty)
    }

    /// What the decision script checks a decision on this call against, held in `turn`.
    pub fn terms(&self, turn: u32) -> DecisionTerms {
        DecisionTerms {
            turn,
            digest: self.digest.clone(),
            tool: self.tool.clone(),
            policy_version: self.policy_version.clone(),
            deciders: self.deciders.clone(),
            quorum: self.reviewers.quorum,
            self_ok: self.reviewers.allow_self_approval,
            deadline: self.deadline,
            escalates: self.reviewers.on_expiry == crate::approval::OnExpiry::Escalate
                && !self.escalated,
            channels: self.reviewers.channels.clone(),
            runs_on: self.stage.as_ref().map(|stage| {
                [Action::Approve, Action::Edit]
                    .into_iter()
                    .filter(|a| stage.next(*a).is_none())
                    .collect()
            }),
            model_approves: self.model_approval.as_ref().map(|a| a.by.clone()),
        }
    }

    /// Whether `action` on it lets it run (the last stage's approval, with stages), so that
    /// its decision carries a receipt.
    pub fn lets_run(&self, action: Action) -> bool {
        action != Action::Reject && self.stage.as_ref().is_none_or(|s| s.next(action).is_none())
    }
}

/// A held call as stored for the decision script (`calls:{run_id}`): everything a decision
/// is checked against, fixed when the call was held (or escalated).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecisionTerms {
    /// The turn (`Run::turns`) the call was held in.
    pub turn: u32,
    /// The call's digest, which a decision must quote.
    pub digest: String,
    /// The tool and the policy version it was held under: a standing grant deciding it must be
    /// for both. Empty on calls held before they were kept here, which no grant decides.
    #[serde(default)]
    pub tool: String,
    /// The tool's policy version the call was held under; empty on calls held before it was
    /// kept.
    #[serde(default)]
    pub policy_version: String,
    /// Who may decide; absent: anyone whose key may decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deciders: Option<Vec<String>>,
    /// How many distinct approvals let the call run.
    pub quorum: u32,
    /// Whether the run's requester may approve it.
    pub self_ok: bool,
    /// When it expires, in milliseconds since the epoch (Redis's clock).
    pub deadline: Option<i64>,
    /// Whether its deadline escalates it instead (decisions stay open until then).
    pub escalates: bool,
    /// Where it was sent, to be told the outcome.
    pub channels: Vec<String>,
    /// The actions whose decision lets it run, and so carries a receipt, when not both
    /// approve and edit: at a stage before the last, neither (see [`crate::stage`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_on: Option<Vec<Action>>,
    /// The reviewer model whose approval decides it (`model:NAME@POLICY_VERSION`), when its
    /// verdict, stored with the pause, was approve; none otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_approves: Option<String>,
}

/// One tool call of the turn a run is paused on, in the order the model asked for it:
/// either already answered (`result`) or held for a person (`held`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnCall {
    /// Names this call alone for the life of the run (see [`Run::calls_asked`]).
    pub call_id: String,
    /// The id the model gave the call, when it is not `call_id`: what its result answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_call_id: Option<String>,
    /// The tool the model asked for.
    pub tool: String,
    /// The arguments the model gave.
    pub input: Value,
    /// Its result once it ran or was refused; `None` while it waits or before it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<CallResult>,
    /// Set when the call waits for a person (`pending` on the wire, as the API shows it).
    #[serde(default, rename = "pending", skip_serializing_if = "Option::is_none")]
    pub held: Option<HeldCall>,
}

impl TurnCall {
    /// The id the model knows the call by.
    pub fn model_id(&self) -> &str {
        self.model_call_id.as_deref().unwrap_or(&self.call_id)
    }

    /// Whether the call runs without a person and has not run yet.
    pub fn runs_now(&self) -> bool {
        self.result.is_none() && self.held.is_none()
    }
}

/// The whole run, stored as one document beside its status fields in Redis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The run's id, the key of all its records.
    pub run_id: RunId,
    /// The name of the agent the run talks to.
    pub agent: String,
    /// The agent's version when the run started (`Agent::version`, a hash of its file and
    /// discovered tools).
    pub agent_version: String,
    /// What the requester asked, the conversation's first message.
    pub input: String,
    /// The principal who started the run, as the gateway authenticated them.
    #[serde(default)]
    pub requested_by: Option<String>,
    /// The requester's own JSON about the run (order ids, amounts...), which policies read as
    /// `metadata`; `{}` when none was given.
    #[serde(default)]
    pub metadata: Value,
    /// Where the run is in its life.
    pub status: RunStatus,
    /// The conversation with the model so far, starting with the user's input.
    pub messages: Vec<Message>,
    /// How many times the model has been called.
    pub turns: u32,
    /// The calls of the turn in progress: stored before any of them runs (so a worker that
    /// takes the run over finds these calls, not the model's next answer), and while the run
    /// waits on the ones held for a person; empty between turns.
    #[serde(default, rename = "held")]
    pub paused_turn: Vec<TurnCall>,
    /// The model's final words, once the run completed.
    #[serde(default)]
    pub answer: Option<String>,
    /// Why the run failed, once it did.
    #[serde(default)]
    pub error: Option<String>,
    /// Set once someone asked to cancel the run (kept beside the document, like the status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<Cancellation>,
    /// The `traceparent` of the request that started the run, which every later span of
    /// the run joins; none when traces are not exported. Set by the gateway that starts the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// When the run was started, in milliseconds since the epoch.
    pub created_at: i64,
    /// When the run document was last saved, in milliseconds since the epoch.
    pub updated_at: i64,
}

impl Run {
    /// A queued run whose conversation starts with the user's input, in no trace yet.
    pub fn new(
        run_id: RunId,
        agent: String,
        agent_version: String,
        input: String,
        requested_by: Option<String>,
        metadata: Value,
    ) -> Self {
        let now = crate::now_ms();
        Self {
            run_id,
            agent,
            agent_version,
            messages: vec![Message::user_text(input.clone())],
            input,
            requested_by,
            metadata,
            status: RunStatus::Queued,
            turns: 0,
            paused_turn: Vec::new(),
            answer: None,
            error: None,
            cancel: None,
            trace: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// The calls a new turn's `answer` asks for, with their ids; to be read before the answer
    /// joins `messages`, with `turns` already counting the turn.
    ///
    /// A call keeps the model's id when that id is usable: 1 to 64 ASCII letters, digits, `_`
    /// or `-`, given to no other call of the run before (in an earlier turn or earlier in this
    /// one). Otherwise, as behind a model server that numbers calls `call_0`, `call_1`… afresh
    /// each turn, it gets `t{turn}.{place}` (its place among the turn's calls, from 1): the dot
    /// keeps it apart from every id kept, the turn and place from every other. So a call id
    /// names one call for the life of the run (its decision, votes, timers, links, execution
    /// record and announcements are all keyed by it) and holds nothing a key or a parser
    /// splits on; the model is still answered with its own id.
    pub fn calls_asked(&self, answer: &[Block]) -> Vec<TurnCall> {
        let mut given: HashSet<&str> = self
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .filter_map(|b| match b {
                Block::ToolUse { id, .. } => Some(id.as_str()),
                _ => None,
            })
            .collect();
        answer
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse { id, name, input } => Some((id, name, input)),
                _ => None,
            })
            .enumerate()
            .map(|(place, (id, name, input))| {
                let usable = usable_call_id(id) && given.insert(id);
                TurnCall {
                    call_id: if usable {
                        id.clone()
                    } else {
                        format!("t{}.{}", self.turns, place + 1)
                    },
                    model_call_id: (!usable).then(|| id.clone()),
                    tool: name.clone(),
                    input: input.clone(),
                    result: None,
                    held: None,
                }
            })
            .collect()
    }

    /// The calls of the paused turn that wait for a person.
    pub fn held_calls(&self) -> impl Iterator<Item = &HeldCall> {
        self.paused_turn.iter().filter_map(|c| c.held.as_ref())
    }

    /// The run's calls that failed, in the order they were asked, derived from the results
    /// the run stores (the one record of them): each result the model was told as an error
    /// whose outcome [is a failure](CallOutcome::is_failure), in the conversation and in the
    /// turn it is paused on. A result stored before outcomes were kept counts when it is an
    /// error. A run that ends `completed` may have failed calls: the model answered anyway.
    pub fn failed_calls(&self) -> Vec<FailedCall> {
        let mut failed = Vec::new();
        // A result answers a call of the assistant message just before it.
        let mut asked: HashMap<&str, &str> = HashMap::new();
        for message in &self.messages {
            if message.role == Speaker::Assistant {
                asked.clear();
            }
            for block in &message.content {
                match block {
                    Block::ToolUse { id, name, .. } => {
                        asked.insert(id, name);
                    }
                    Block::ToolResult {
                        tool_use_id,
                        content,
                        is_error: true,
                        outcome,
                        ..
                    } if outcome.is_none_or(CallOutcome::is_failure) => {
                        let tool = asked.get(tool_use_id.as_str()).copied().unwrap_or_default();
                        let outcome = outcome.unwrap_or(CallOutcome::Failed);
                        failed.push(FailedCall::new(tool_use_id, tool, outcome, content));
                    }
                    _ => {}
                }
            }
        }
        for call in &self.paused_turn {
            if let Some(result) = call.result.as_ref().filter(|r| r.is_error)
                && result.outcome.is_failure()
            {
                let (id, tool) = (call.model_id(), call.tool.as_str());
                failed.push(FailedCall::new(id, tool, result.outcome, &result.content));
            }
        }
        failed
    }

    /// The assistant's words in the turn it is paused on.
    pub fn paused_turn_text(&self) -> String {
        match self.messages.last() {
            Some(m) if m.role == Speaker::Assistant && !self.paused_turn.is_empty() => m.text(),
            _ => String::new(),
        }
    }

    /// Where in `messages` the model's answer of turn `turn` (counting from 1) is: each turn
    /// adds one assistant message, which asks for that turn's calls.
    pub fn answer_of_turn(&self, turn: u64) -> Option<usize> {
        self.messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Speaker::Assistant)
            .nth((turn as usize).checked_sub(1)?)
            .map(|(i, _)| i)
    }
}

/// Whether a model's call id may serve as the call's own (see [`Run::calls_asked`]).
fn usable_call_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && plain(id)
}

/// Whether `s` holds only ASCII letters, digits, `_` and `-`: safe in NATS subjects, Redis
/// keys and the tool names model APIs take.
pub fn plain(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// What a reviewer does with a held call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Let the call run as asked.
    Approve,
    /// Let the call run with the reviewer's input instead.
    Edit,
    /// Refuse the call; the model is told it was rejected.
    Reject,
}

impl Action {
    /// The action as the API and receipts name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Approve => "approve",
            Action::Edit => "edit",
            Action::Reject => "reject",
        }
    }
}

/// A reviewer's decision on one call, as recorded (first per call wins).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The call decided (its `TurnCall::call_id`).
    pub call_id: String,
    /// The digest of what the reviewer was shown.
    pub digest: String,
    /// What the reviewer did.
    pub action: Action,
    /// The input the call runs with instead, on an edit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The reviewer's note on an edit, which the model is told with the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Why the call was rejected, if a reason was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The principal who decided (or the system name for a deadline or a policy change).
    pub decided_by: String,
    /// The door the decision came through: `api`, `web`, `slack`, `email`, `webhook`
    /// (`channel` on the wire).
    #[serde(rename = "channel")]
    pub door: String,
    /// When, in milliseconds since the epoch.
    pub decided_at: i64,
    /// Identifies what was decided, not who or when, so a repeat can be told from a conflict.
    pub fingerprint: String,
    /// Recorded by the deadline, not by a person: a refusal the model is told is an expiry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expired: bool,
    /// Recorded by a change of the call's policy while it waited, not by a person: the call
    /// was closed undecided and is checked again under the policy now (it may run, be held
    /// again as a new call, or be refused); never an approval.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub superseded: bool,
    /// The countersignature receipt (a JWT the gateway signed) the call carries to its tool,
    /// for a decision that lets it run; stored with the decision by the decision script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
    /// The standing grant this approval also makes (see [`crate::grant`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<crate::grant::GrantTerms>,
    /// The standing grant that decided the call, when nobody was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub under_grant: Option<String>,
    /// The delegation the decider decided under (see [`crate::delegation`]); `decided_by`
    /// then names both people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation: Option<String>,
}

impl Decision {
    /// A decision no person makes, closing the call `call_id` shown as `digest` without
    /// running it: by `by` through `door` at `at`, for `reason`. The caller marks what
    /// closed it (`expired`, `superseded`).
    pub fn closing(
        call_id: &str,
        digest: &str,
        by: &str,
        door: &str,
        reason: &str,
        at: i64,
    ) -> Self {
        Self {
            call_id: call_id.to_string(),
            digest: digest.to_string(),
            action: Action::Reject,
            input: None,
            note: None,
            reason: Some(reason.to_string()),
            decided_by: by.to_string(),
            door: door.to_string(),
            decided_at: at,
            fingerprint: Self::fingerprint_of(Action::Reject, None, None, Some(reason)),
            expired: false,
            superseded: false,
            receipt: None,
            grant: None,
            under_grant: None,
            delegation: None,
        }
    }

    /// The fingerprint of a decision: the SHA-256 hex of its action, input, note and reason in
    /// canonical JSON.
    pub fn fingerprint_of(
        action: Action,
        input: Option<&Value>,
        note: Option<&str>,
        reason: Option<&str>,
    ) -> String {
        let what = serde_json::json!({
            "action": action, "input": input, "note": note, "reason": reason,
        });
        crate::digest::sha256_hex(crate::digest::canonical_json(&what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_safe_for_subjects_and_keys() {
        assert!(RunId::parse(RunId::new().as_str()).is_some());
        assert!(RunId::parse("a.b").is_none());
        assert!(RunId::parse("a*").is_none());
        assert!(RunId::parse("").is_none());
    }

    #[test]
    fn a_call_held_again_gets_the_next_id_and_keeps_the_models() {
        let mut call = TurnCall {
            call_id: "toolu_1".into(),
            model_call_id: None,
            tool: "issue_refund".into(),
            input: serde_json::json!({}),
            result: None,
            held: None,
        };
        call.held_again();
        assert_eq!(
            (call.call_id.as_str(), call.model_id()),
            ("toolu_1.r2", "toolu_1")
        );
        call.held_again();
        assert_eq!(
            (call.call_id.as_str(), call.model_id()),
            ("toolu_1.r3", "toolu_1")
        );
        let mut placed = TurnCall {
            call_id: "t2.1".into(),
            model_call_id: Some("same id twice".into()),
            ..call
        };
        placed.held_again();
        assert_eq!(
            (placed.call_id.as_str(), placed.model_id()),
            ("t2.1.r2", "same id twice")
        );
    }

    #[test]
    fn status_round_trips_through_its_stored_name() {
        for s in [RunStatus::AwaitingApproval, RunStatus::Completed] {
            assert_eq!(RunStatus::parse(s.as_str()), Some(s));
        }
    }

    fn asking(calls: &[&str]) -> Vec<Block> {
        calls
            .iter()
            .map(|id| Block::ToolUse {
                id: id.to_string(),
                name: "issue_refund".into(),
                input: serde_json::json!({}),
            })
            .collect()
    }

    /// `run` after a turn that asked for `calls`, as the engine stores it.
    fn answered(mut run: Run, calls: &[&str]) -> (Run, Vec<TurnCall>) {
        run.turns += 1;
        let answer = asking(calls);
        let asked = run.calls_asked(&answer);
        run.messages.push(Message {
            role: Speaker::Assistant,
            content: answer,
        });
        (run, asked)
    }

    fn ids(calls: &[TurnCall]) -> Vec<(&str, &str)> {
        calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.model_id()))
            .collect()
    }

    fn new_run() -> Run {
        Run::new(
            RunId::new(),
            "refunds".into(),
            "1".into(),
            "Refund.".into(),
            None,
            Value::Null,
        )
    }

    #[test]
    fn a_model_id_used_again_in_a_later_turn_names_a_new_call() {
        let (run, first) = answered(new_run(), &["call_0", "call_1"]);
        assert_eq!(ids(&first), [("call_0", "call_0"), ("call_1", "call_1")]);
        assert!(first.iter().all(|c| c.model_call_id.is_none()));
        let (run, second) = answered(run, &["call_0", "call_7"]);
        assert_eq!(ids(&second), [("t2.1", "call_0"), ("call_7", "call_7")]);
        let (_, third) = answered(run, &["call_0", "call_7", "t2.1"]);
        assert_eq!(
            ids(&third),
            [("t3.1", "call_0"), ("t3.2", "call_7"), ("t3.3", "t2.1")]
        );
    }

    #[test]
    fn a_model_id_no_key_or_parser_can_hold_gets_one_of_ours() {
        let long = "x".repeat(65);
        let (_, calls) = answered(
            new_run(),
            &["a|b", "", "a b", "x:y", &long, "dup", "dup", "ok_id-1"],
        );
        let ours: Vec<&str> = calls.iter().map(|c| c.call_id.as_str()).collect();
        assert_eq!(
            ours,
            [
                "t1.1", "t1.2", "t1.3", "t1.4", "t1.5", "dup", "t1.7", "ok_id-1"
            ]
        );
        assert_eq!(calls[0].model_id(), "a|b");
        assert_eq!(calls[6].model_id(), "dup");
    }

    #[test]
    fn failed_calls_are_the_results_told_as_errors_that_no_person_refused() {
        let result = |id: &str, outcome: Option<CallOutcome>, is_error| Block::ToolResult {
            tool_use_id: id.into(),
            content: format!("{id} said"),
            is_error,
            outcome,
            images: Vec::new(),
            mcp: None,
        };
        let (mut run, _) = answered(new_run(), &["c1", "c2"]);
        run.messages.push(Message {
            role: Speaker::User,
            content: vec![
                result("c1", Some(CallOutcome::Executed), false),
                result("c2", Some(CallOutcome::Failed), true),
            ],
        });
        // The same model id again in a later turn: it answers that turn's call.
        let (mut run, mut turn) = answered(run, &["c1", "c3", "c4"]);
        run.messages.push(Message {
            role: Speaker::User,
            content: vec![
                result("c1", Some(CallOutcome::Rejected), true),
                result("c3", Some(CallOutcome::Expired), true),
                result("c4", None, true),
            ],
        });
        turn[0].result = Some(CallResult {
            outcome: CallOutcome::Unknown,
            ..CallResult::failed("x".repeat(600))
        });
        run.paused_turn = turn;
        let failed = run.failed_calls();
        let said: Vec<(&str, &str, CallOutcome)> = failed
            .iter()
            .map(|f| (f.call_id.as_str(), f.tool.as_str(), f.outcome))
            .collect();
        assert_eq!(
            said,
            [
                ("c2", "issue_refund", CallOutcome::Failed),
                ("c4", "issue_refund", CallOutcome::Failed),
                ("c1", "issue_refund", CallOutcome::Unknown),
            ]
        );
        assert_eq!(failed[0].error, "c2 said");
        assert_eq!(failed[2].error.chars().count(), FailedCall::ERROR_CHARS + 1);
    }

    #[test]
    fn blocks_use_the_anthropic_shape() {
        let b = Block::ToolResult {
            tool_use_id: "t1".into(),
            content: "ok".into(),
            is_error: false,
            outcome: None,
            images: Vec::new(),
            mcp: None,
        };
        assert_eq!(
            serde_json::to_value(&b).unwrap(),
            serde_json::json!({"type": "tool_result", "tool_use_id": "t1", "content": "ok"})
        );
    }

    #[test]
    fn a_result_stored_before_whole_mcp_results_were_kept_still_reads() {
        let stored = serde_json::json!({"outcome": "executed", "content": "ok", "is_error": false});
        let result: CallResult = serde_json::from_value(stored).unwrap();
        assert_eq!(result.mcp, None);
        let whole = serde_json::json!({"content": [], "structuredContent": {"n": 1}});
        let kept = CallResult {
            mcp: Some(whole.clone()),
            ..result
        };
        let again: CallResult =
            serde_json::from_value(serde_json::to_value(&kept).unwrap()).unwrap();
        assert_eq!(again.mcp, Some(whole));
    }
}
