//! A scripted model's canned turns: the `*.script.toml` file beside an agent that names the
//! `scripted` provider. The worker plays them in-process, for demos without an API key; the
//! fake model server (`countersign-fake-model`) serves the same turns over the Anthropic
//! and OpenAI wire formats, for tests and the benchmark.
//!
//! The turn played is the number of assistant messages so far, so a resumed run carries on
//! where it paused.
//!
//! A script may `[read]` values from the conversation, so that one script answers different
//! requests as a model would: a pattern's first match in the user's request (`from_request`),
//! or a field of a tool's latest result (`from_result`, `at` a JSON pointer). `{{name}}` in a
//! turn's text or in a call's input is replaced by the value; a string that is only
//! `{{name}}` becomes the value itself, a number staying a number. A value the conversation
//! does not hold (no match, no result yet, a failed call) is its `default`, which is also what
//! a turn played without a conversation shows (the fake model's pre-written answers).

use crate::run::{Block, Message, Speaker};
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// A parsed script, its patterns compiled and every `{{name}}` it uses declared.
#[derive(Clone, Debug)]
pub struct Script {
    reads: BTreeMap<String, Read>,
    turns: Vec<Turn>,
}

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    read: BTreeMap<String, ReadFile>,
    turns: Vec<Turn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadFile {
    from_request: Option<String>,
    from_result: Option<String>,
    at: Option<String>,
    default: Value,
}

/// Where a value is read, and what it is otherwise.
#[derive(Clone, Debug)]
struct Read {
    from: From,
    default: Value,
}

#[derive(Clone, Debug)]
enum From {
    /// The first match of the pattern in the first user message (its first group, if it has
    /// one).
    Request(Regex),
    /// The field at `pointer` of the latest successful result of `tool`, read as JSON.
    Result { tool: String, pointer: String },
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
    input: Value,
}

/// What the model says once the script has no turn left.
pub const NO_MORE_TURNS: &str = "The script has no more turns.";

/// `{{ name }}` in a turn.
fn placeholder() -> Regex {
    Regex::new(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}").expect("the pattern compiles")
}

impl Script {
    /// A script from the text of its file; an unknown field, a pattern that does not compile
    /// or a `{{name}}` that `[read]` does not declare is refused.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let reads = file
            .read
            .into_iter()
            .map(|(name, read)| Ok((name.clone(), Read::compile(&name, read)?)))
            .collect::<Result<BTreeMap<_, _>, String>>()?;
        let script = Self {
            reads,
            turns: file.turns,
        };
        let pattern = placeholder();
        for (i, turn) in script.turns.iter().enumerate() {
            let mut texts = vec![turn.text.clone()];
            texts.extend(turn.tool_calls.iter().map(|c| c.input.to_string()));
            for text in &texts {
                for used in pattern.captures_iter(text) {
                    if !script.reads.contains_key(&used[1]) {
                        return Err(format!(
                            "turn {} uses {{{{{}}}}}, which [read] does not declare",
                            i + 1,
                            &used[1]
                        ));
                    }
                }
            }
        }
        Ok(script)
    }

    /// How many turns it holds; every later turn is [`NO_MORE_TURNS`].
    pub fn turn_count(&self) -> usize {
        self.turns.len()
    }

    /// The assistant's answer to a conversation: the turn after its last assistant message,
    /// with the values read from the conversation put in.
    pub fn answer(&self, messages: &[Message]) -> Vec<Block> {
        let turn = messages
            .iter()
            .filter(|m| m.role == Speaker::Assistant)
            .count();
        let values = self
            .reads
            .iter()
            .map(|(name, read)| (name.as_str(), read.value(messages)))
            .collect();
        self.played(turn, &values)
    }

    /// The assistant's blocks of turn `index` (from 0), each value its default: its text, if
    /// any, then its calls.
    pub fn turn(&self, index: usize) -> Vec<Block> {
        let values = self
            .reads
            .iter()
            .map(|(name, read)| (name.as_str(), read.default.clone()))
            .collect();
        self.played(index, &values)
    }

    fn played(&self, index: usize, values: &BTreeMap<&str, Value>) -> Vec<Block> {
        let Some(turn) = self.turns.get(index) else {
            return vec![Block::Text {
                text: NO_MORE_TURNS.into(),
            }];
        };
        let pattern = placeholder();
        let text = (!turn.text.is_empty()).then(|| Block::Text {
            text: fill_text(&pattern, &turn.text, values),
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
                input: fill_value(&pattern, &call.input, values),
            });
        text.into_iter().chain(calls).collect()
    }
}

impl Read {
    fn compile(name: &str, read: ReadFile) -> Result<Self, String> {
        let from = match (read.from_request, read.from_result, read.at) {
            (Some(pattern), None, None) => From::Request(
                Regex::new(&pattern).map_err(|e| format!("[read] {name}: from_request: {e}"))?,
            ),
            (None, Some(tool), Some(pointer)) => From::Result { tool, pointer },
            _ => {
                return Err(format!(
                    "[read] {name}: give from_request = PATTERN, or from_result = TOOL with \
                     at = JSON_POINTER"
                ));
            }
        };
        Ok(Self {
            from,
            default: read.default,
        })
    }

    fn value(&self, messages: &[Message]) -> Value {
        let found = match &self.from {
            From::Request(pattern) => {
                let request = messages.first().map(Message::text).unwrap_or_default();
                pattern.captures(&request).map(|found| {
                    let matched = found.get(1).or_else(|| found.get(0));
                    Value::String(matched.map_or("", |m| m.as_str()).to_string())
                })
            }
            From::Result { tool, pointer } => {
                latest_result(messages, tool).and_then(|result| result.pointer(pointer).cloned())
            }
        };
        found.unwrap_or_else(|| self.default.clone())
    }
}

/// The latest successful result of a call of `tool`, if it is JSON.
fn latest_result(messages: &[Message], tool: &str) -> Option<Value> {
    let blocks: Vec<&Block> = messages.iter().flat_map(|m| &m.content).collect();
    blocks.iter().rev().find_map(|block| match block {
        Block::ToolResult {
            tool_use_id,
            content,
            is_error: false,
            ..
        } => {
            let called = blocks.iter().any(|b| {
                matches!(b, Block::ToolUse { id, name, .. } if id == tool_use_id && name == tool)
            });
            called.then(|| serde_json::from_str(content).ok()).flatten()
        }
        _ => None,
    })
}

/// `text` with each `{{name}}` replaced by its value (a string without its quotes).
fn fill_text(pattern: &Regex, text: &str, values: &BTreeMap<&str, Value>) -> String {
    pattern
        .replace_all(text, |found: &regex::Captures| match &values[&found[1]] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .into_owned()
}

/// `value` with its strings filled; a string that is one placeholder becomes its value.
fn fill_value(pattern: &Regex, value: &Value, values: &BTreeMap<&str, Value>) -> Value {
    match value {
        Value::String(s) => match pattern.captures(s) {
            Some(found) if found[0].len() == s.len() => values[&found[1]].clone(),
            Some(_) => Value::String(fill_text(pattern, s, values)),
            None => value.clone(),
        },
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| fill_value(pattern, v, values))
                .collect(),
        ),
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), fill_value(pattern, v, values)))
                .collect(),
        ),
        other => other.clone(),
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
                role: Speaker::Assistant,
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

    const READING: &str = r#"
[read]
order = { from_request = "order ([A-Z]-[0-9]+)", default = "A-1" }
amount = { from_result = "get_order", at = "/amount", default = 10 }

[[turns]]
text = "Looking up {{order}}."
tool_calls = [{ name = "get_order", input = { order_id = "{{ order }}" } }]

[[turns]]
text = "Refunding ${{amount}} for {{order}}."
tool_calls = [{ name = "refund", input = { order_id = "{{order}}", amount = "{{amount}}", note = "order {{order}}" } }]
"#;

    fn result(id: &str, content: &str, is_error: bool) -> Message {
        Message {
            role: Speaker::User,
            content: vec![Block::ToolResult {
                tool_use_id: id.into(),
                content: content.into(),
                is_error,
                outcome: None,
                images: Vec::new(),
                mcp: None,
            }],
        }
    }

    #[test]
    fn values_are_read_from_the_request_and_the_latest_result_and_keep_their_type() {
        let script = Script::parse(READING).unwrap();
        let mut conversation = vec![Message::user_text("Please refund order B-7, it broke.")];
        let first = script.answer(&conversation);
        assert_eq!(
            first,
            vec![
                Block::Text {
                    text: "Looking up B-7.".into()
                },
                Block::ToolUse {
                    id: "call_0_0".into(),
                    name: "get_order".into(),
                    input: json!({"order_id": "B-7"}),
                },
            ]
        );
        conversation.push(Message {
            role: Speaker::Assistant,
            content: first,
        });
        conversation.push(result("call_0_0", r#"{"amount": 42.5}"#, false));
        assert_eq!(
            script.answer(&conversation)[1],
            Block::ToolUse {
                id: "call_1_0".into(),
                name: "refund".into(),
                input: json!({"order_id": "B-7", "amount": 42.5, "note": "order B-7"}),
            }
        );
    }

    #[test]
    fn a_value_the_conversation_does_not_hold_is_its_default() {
        let script = Script::parse(READING).unwrap();
        // No order in the request, and the lookup failed.
        let conversation = vec![
            Message::user_text("Refund it."),
            Message {
                role: Speaker::Assistant,
                content: script.turn(0),
            },
            result("call_0_0", r#"{"amount": 99}"#, true),
        ];
        assert_eq!(
            script.answer(&conversation)[0],
            Block::Text {
                text: "Refunding $10 for A-1.".into()
            }
        );
        // Played without a conversation, as the fake model writes its answers.
        assert_eq!(
            script.turn(1)[0],
            Block::Text {
                text: "Refunding $10 for A-1.".into()
            }
        );
    }

    #[test]
    fn an_undeclared_value_or_a_read_from_nowhere_is_refused() {
        let undeclared = Script::parse("[[turns]]\ntext = \"Hi {{who}}\"\n").unwrap_err();
        assert!(undeclared.contains("{{who}}"), "{undeclared}");
        let nowhere = Script::parse("[read]\nx = { default = 1 }\n[[turns]]\n").unwrap_err();
        assert!(nowhere.contains("from_request"), "{nowhere}");
        let broken =
            Script::parse("[read]\nx = { from_request = \"(\", default = 1 }\n[[turns]]\n");
        assert!(broken.is_err());
    }

    #[test]
    fn an_unknown_field_is_refused() {
        assert!(Script::parse("[[turns]]\ntxt = \"typo\"\n").is_err());
    }
}
