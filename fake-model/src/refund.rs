//! The refund conversation of the demo agent, as the tests and the benchmark play it: on the
//! first turn the order lookup and a refund of 129 (which the agent's policy holds for a
//! person, being over 20), then a final answer.

use crate::wire::{anthropic_message, turn};
use countersign_model::scripted::Script;
use serde_json::Value;
use std::sync::LazyLock;

/// The final answer.
pub const REFUND_ANSWER: &str = "All done.";

/// The conversation as a script.
pub static REFUND_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::parse(&format!(
        r#"
[[turns]]
text = "The order arrived broken; I will check it and refund it."
tool_calls = [
  {{ id = "toolu_1", name = "get_order", input = {{ order_id = "A-1001" }} }},
  {{ id = "toolu_2", name = "issue_refund", input = {{ order_id = "A-1001", amount = 129, reason = "arrived broken" }} }},
]

[[turns]]
text = "{REFUND_ANSWER}"
"#
    ))
    .expect("the refund script parses")
});

/// The conversation's answer to an Anthropic request, as a brain.
pub fn refund_brain(request: &Value) -> Value {
    anthropic_message(&REFUND_SCRIPT.turn(turn(request)))
}
