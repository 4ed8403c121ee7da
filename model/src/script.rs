//! A scripted model's canned turns: the `*.script.toml` file beside an agent that names the
//! `scripted` provider. The worker plays them in-process, for demos without an API key; the
//! fake model server (`countersign-fake-model`) serves the same turns over the Anthropic
//! and OpenAI wire formats, for tests and the benchmark.
//!
//! The turn played is the number of assistant messages so far, so a resumed run carries on
//! where it paused.

use crate::run::{Block, Message, Role};
use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    turns: Vec<Turn>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Turn {
    #[serde(default)]
    text: String,
    #[serde(default)]
    tool_calls: Vec<ScriptedCall>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedCall {
    /// The call's id; `call_<turn>_<position>` unless given.
    #[serde(default)]
    id: Option<String>,
    name: String,
    input: serde_json::Value,
}

/// What the model says once the script has no turn left.
pub const NO_MORE_TURNS: &str = "The script has no more turns.";

impl Script {
    /// A script from the text of its file.
    pub fn parse(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// How many turns it holds; every later turn is [`NO_MORE_TURNS`].
    pub fn turn_count(&self) -> usize {
        self.turns.len()
    }

    /// The assistant's answer to a conversation: the turn after its last assistant message.
    pub fn answer(&self, messages: &[Message]) -> Vec<Block> {
        let turn = messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        self.turn(turn)
    }

    /// The assistant's blocks of turn `index` (from 0): its text, if any, then its calls.
    pub fn turn(&self, index: usize) -> Vec<Block> {
        let Some(turn) = self.turns.get(index) else {
            return vec![Block::Text {
                text: NO_MORE_TURNS.into(),
            }];
        };
        let text = (!turn.text.is_empty()).then(|| Block::Text {
            text: turn.text.clone(),
        });
        let calls = turn
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, call)| Block::ToolUse {
                id: call
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("call_{index}_{i}")),
                name: call.name.clone(),
                input: call.input.clone(),
            });
        text.into_iter().chain(calls).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SCRIPT: &str = r#"
[[turns]]
text = "Looking."
tool_calls = [{ name = "get_order", input = { order_id = "A-1" } }, { id = "mine", name = "refund", input = {} }]

[[turns]]
text = "Done."
"#;

    #[test]
    fn each_turn_follows_the_assistant_messages_so_far_and_calls_are_numbered_unless_named() {
        let script = Script::parse(SCRIPT).unwrap();
        assert_eq!(script.turn_count(), 2);
        let first = script.answer(&[Message::user_text("Refund A-1.")]);
        assert_eq!(
            first,
            vec![
                Block::Text {
                    text: "Looking.".into()
                },
                Block::ToolUse {
                    id: "call_0_0".into(),
                    name: "get_order".into(),
                    input: json!({"order_id": "A-1"}),
                },
                Block::ToolUse {
                    id: "mine".into(),
                    name: "refund".into(),
                    input: json!({}),
                },
            ]
        );
        let answered = [
            Message::user_text("Refund A-1."),
            Message {
                role: Role::Assistant,
                content: first,
            },
        ];
        assert_eq!(
            script.answer(&answered),
            vec![Block::Text {
                text: "Done.".into()
            }]
        );
        assert_eq!(
            script.turn(2),
            vec![Block::Text {
                text: NO_MORE_TURNS.into()
            }]
        );
    }

    #[test]
    fn an_unknown_field_is_refused() {
        assert!(Script::parse("[[turns]]\ntxt = \"typo\"\n").is_err());
    }
}
