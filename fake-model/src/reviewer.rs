//! A reviewer model's side of the conversation (see `countersign_model::reviewer`): the call
//! a request for a verdict puts to the model, and an Anthropic answer giving one.

use crate::wire::{anthropic_tool_use, first_user_text};
use countersign_model::reviewer::VERDICT_TOOL;
use serde_json::{Value, json};

/// The call a reviewer is asked about, read back from the `<call>` element of its one user
/// message; none when `request` is not a reviewer's (it offers no verdict tool).
pub fn reviewed_call(request: &Value) -> Option<Value> {
    let offered = request["tools"].as_array()?;
    if !offered.iter().any(|t| t["name"] == VERDICT_TOOL) {
        return None;
    }
    let text = first_user_text(request);
    let start = text.find("<call>\n")? + "<call>\n".len();
    let end = text.find("\n</call>")?;
    serde_json::from_str(&text[start..end]).ok()
}

/// An Anthropic answer calling the verdict tool: approve, or leave it to a person, and why.
pub fn verdict(approve: bool, reason: &str) -> Value {
    let decision = if approve { "approve" } else { "ask_person" };
    anthropic_tool_use(
        "",
        &[(
            "verdict_1",
            VERDICT_TOOL,
            json!({"decision": decision, "reason": reason}),
        )],
    )
}
