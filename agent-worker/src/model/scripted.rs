//! A model that replays canned turns from a TOML file, for demos without an API key. The
//! turn it plays is the number of assistant messages so far, so a resumed run carries on
//! where it paused.

use countersign_model::run::{Block, Message, Role};
use serde::Deserialize;
use std::path::Path;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    turns: Vec<Turn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Turn {
    #[serde(default)]
    text: String,
    #[serde(default)]
    tool_calls: Vec<ScriptedCall>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedCall {
    name: String,
    input: serde_json::Value,
}

impl Script {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read script {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("invalid script {}: {e}", path.display()))
    }

    pub fn turn(&self, messages: &[Message]) -> Vec<Block> {
        let index = messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let Some(turn) = self.turns.get(index) else {
            return vec![Block::Text {
                text: "The script has no more turns.".into(),
            }];
        };
        let mut blocks = Vec::new();
        if !turn.text.is_empty() {
            blocks.push(Block::Text {
                text: turn.text.clone(),
            });
        }
        for (i, call) in turn.tool_calls.iter().enumerate() {
            blocks.push(Block::ToolUse {
                id: format!("call_{index}_{i}"),
                name: call.name.clone(),
                input: call.input.clone(),
            });
        }
        blocks
    }
}
