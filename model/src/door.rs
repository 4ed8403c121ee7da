//! The runs of an `external` agent: an agent written in code (with Pydantic AI, the OpenAI
//! Agents SDK, LangGraph, chatlas or none) that asks countersign, through the gateway's
//! `POST /v1/agents/{agent}/calls`, whether it may make a call. Each ask is a run of one call
//! ([`crate::one_call`]), kept as data in the run's `metadata.door`.
//!
//! A tool of such an agent either has an endpoint (`http` or `mcp`), and countersign runs the
//! call once it may run, as it runs any agent's; or has none, and the agent runs it itself:
//! the worker then releases the call ([`crate::run::CallOutcome::Released`]) and the agent
//! claims it and reports what it did, so the trail holds that too.

use crate::one_call;
use crate::run::{Block, Message};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A call asked through the door, as its run keeps it in `metadata.door`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoorCall {
    /// The tool the agent would call.
    pub tool: String,
    /// The input it would call it with.
    pub input: Value,
    /// What the agent says of the call, shown to reviewers as the model's words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// What the agent had seen before asking: results of its earlier calls, shown to
    /// reviewers beside the call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<Seen>,
    /// The conversation or session of the agent the call belongs to, which groups its calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// A result the agent had seen before it asked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seen {
    /// The tool that gave it.
    pub tool: String,
    /// The input the tool was called with.
    #[serde(default)]
    pub input: Value,
    /// What the tool answered, as text.
    pub content: String,
    /// Whether the tool answered an error.
    #[serde(default)]
    pub is_error: bool,
}

impl DoorCall {
    /// The call a run keeps in its metadata.
    pub fn of_run(metadata: &Value) -> Result<Self, String> {
        let call = metadata
            .get("door")
            .ok_or("an external agent's run keeps its call in metadata.door")?;
        Self::deserialize(call).map_err(|e| format!("metadata.door is not a call: {e}"))
    }

    /// The id of the run's one call.
    pub fn call_id(&self) -> String {
        call_id(&self.tool)
    }
}

/// The start of a call released to the agent, as the attempt that runs it claimed it: one
/// attempt starts a call, and only that attempt reports its end ([`ExecEnd`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecStart {
    /// The attempt's own id, chosen by the agent (random per attempt): a claim asked again
    /// with it, after a lost answer, is the same claim.
    pub attempt: String,
    /// Who claimed it: the principal of the key that asked.
    pub reported_by: String,
    /// When, in milliseconds since the epoch.
    pub at: i64,
}

/// How a call the agent ran ended, as the attempt that started it reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecEnd {
    /// Whether it succeeded.
    pub status: ExecStatus,
    /// When it was reported, in milliseconds since the epoch.
    pub at: i64,
    /// What the tool gave, for a success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why it failed, for a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where a call released to the agent stands in the agent's execution record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecStatus {
    /// Claimed by an attempt, with no end reported (yet).
    Started,
    /// Ran and succeeded.
    Succeeded,
    /// Ran and failed.
    Failed,
}

impl ExecStatus {
    /// The status's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecStatus::Started => "started",
            ExecStatus::Succeeded => "succeeded",
            ExecStatus::Failed => "failed",
        }
    }
}

/// The id of the one call of a door run of `tool`.
pub fn call_id(tool: &str) -> String {
    one_call::call_id("door", tool)
}

/// The answer of an `external` agent's model: the call the run keeps, with the agent's words,
/// then a line that ends the run.
pub fn answer(metadata: &Value, messages: &[Message]) -> Result<Vec<Block>, String> {
    let call = DoorCall::of_run(metadata)?;
    let asked = one_call::Asked {
        id: call.call_id(),
        tool: &call.tool,
        input: &call.input,
        text: &call.message,
    };
    Ok(one_call::answer(asked, messages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_door_run_asks_for_its_call_with_the_agents_words_and_shows_what_it_saw() {
        let metadata = json!({"door": {
            "tool": "issue_refund",
            "input": {"amount": 40},
            "message": "Charged twice.",
            "evidence": [{"tool": "lookup_order", "input": {"id": "A-1"}, "content": "paid $40 twice"}],
            "session": "conv-7",
        }});
        let blocks = answer(&metadata, &[Message::user_text("Refund A-1.")]).unwrap();
        assert!(
            matches!(&blocks[..], [Block::Text { text }, Block::ToolUse { id, name, .. }]
            if text == "Charged twice." && id == "door_issue_refund" && name == "issue_refund")
        );
        let call = DoorCall::of_run(&metadata).unwrap();
        assert_eq!(call.evidence[0].content, "paid $40 twice");
    }

    #[test]
    fn a_run_without_its_call_is_an_error() {
        assert!(answer(&json!({}), &[]).is_err());
        assert!(answer(&json!({"door": {"tool": "t"}}), &[]).is_err());
    }
}
