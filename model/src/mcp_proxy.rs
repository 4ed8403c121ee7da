//! The runs of an `mcp_client` agent: every `tools/call` an MCP client sends to the gateway's
//! `/mcp/{agent}` is a run of its own, whose "model" asks for exactly that call, once, then
//! ends the run. So the call goes through the policy, the held calls, the decisions and the
//! execution record like any agent's, and the client is answered with the result the run's
//! conversation ends with.
//!
//! The call is kept as data in the run's `metadata.mcp.call`, and the run's input, what every
//! surface shows as what was asked, is a sentence a reviewer reads ([`ProxyCall::request`]):
//! the call's tool and input are shown as the call's already.
//!
//! A run per call rather than per MCP session: a session's calls are independent and may run
//! at once, while a run is one conversation that pauses as a whole, so one held call would
//! hold up every other call of its session.

use crate::one_call;
use crate::run::{Block, Message};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A `tools/call` as a proxy run keeps it, in `metadata.mcp.call`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyCall {
    /// The tool the client called, as the agent names it.
    pub tool: String,
    /// The arguments the client gave, a JSON object.
    pub arguments: Value,
}

impl ProxyCall {
    /// The run's input: what it was asked, as a reviewer reads it.
    pub fn request(&self) -> String {
        format!("An MCP client called {}.", self.tool)
    }

    /// The call a run keeps in its metadata. A run started before the call moved there has it
    /// as its input (the first user message), as JSON text.
    pub fn of_run(metadata: &Value, messages: &[Message]) -> Result<Self, String> {
        const SHAPE: &str = r#"{"tool", "arguments"}"#;
        if let Some(call) = metadata.pointer("/mcp/call") {
            return Self::deserialize(call)
                .map_err(|e| format!("metadata.mcp.call is not {SHAPE}: {e}"));
        }
        let input = messages.first().map(Message::text).unwrap_or_default();
        serde_json::from_str(&input).map_err(|e| {
            format!("an mcp_client run keeps its call, {SHAPE}, in metadata.mcp.call: {e}")
        })
    }
}

/// The id of the one call of a proxy run of `tool` ([`one_call::call_id`]).
pub fn call_id(tool: &str) -> String {
    one_call::call_id("mcp", tool)
}

/// The answer of an `mcp_client` agent's model to its conversation: first the call the run
/// keeps ([`ProxyCall::of_run`]), then, once the call has its result, a line that ends the run.
pub fn answer(metadata: &Value, messages: &[Message]) -> Result<Vec<Block>, String> {
    let call = ProxyCall::of_run(metadata, messages)?;
    let asked = one_call::Asked {
        id: call_id(&call.tool),
        tool: &call.tool,
        input: &call.arguments,
        text: "",
    };
    Ok(one_call::answer(asked, messages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refund() -> (Value, ProxyCall) {
        let call = ProxyCall {
            tool: "refund".into(),
            arguments: json!({"amount": 5}),
        };
        (json!({"mcp": {"session": null, "call": call}}), call)
    }

    #[test]
    fn a_run_started_with_the_call_as_its_input_still_finds_it() {
        let (_, call) = refund();
        let input = serde_json::to_string(&call).unwrap();
        let messages = [Message::user_text(input)];
        assert_eq!(ProxyCall::of_run(&json!({"mcp": {}}), &messages), Ok(call));
    }

    #[test]
    fn a_run_without_a_call_is_an_error() {
        let asked = [Message::user_text("Refund A-1 please.")];
        assert!(answer(&Value::Null, &asked).is_err());
        let half = json!({"mcp": {"call": {"tool": "t"}}});
        assert!(answer(&half, &asked).is_err());
    }
}
