//! MCP servers as an agent's tools: how an agent file declares them, what discovery
//! (`tools/list`) found on them, the policy a discovered tool gets when the agent sets none,
//! and how a `tools/call` result reads to the model and to reviewers. Talking to the servers
//! is the runtime's part; this is the pure rest.

use crate::approval::{ApprovalDef, ApprovalMode, ApprovalRule, Risk};
use crate::run::Image;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// An MCP server an agent takes tools from, as its `[[mcp_servers]]` entry declares it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerDef {
    /// How the agent's tools name the server (`mcp = "NAME"`).
    pub name: String,
    /// The server's Streamable HTTP endpoint.
    #[serde(default)]
    pub url: Option<String>,
    /// Or a program (and its arguments) each worker runs beside itself and talks to over
    /// stdio.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Headers sent with every HTTP request. A value may name the environment
    /// (`${NAME}`) or a file (`${file:/run/secrets/token}`), resolved when the agent loads, so
    /// the agent file holds no secret.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Milliseconds to wait for one answer (discovery or a call); default 30000.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Whether the operator trusts the server's tool annotations enough to let them set the
    /// policy of tools the agent gives none. Default false: hints from a server nobody
    /// vouched for decide nothing, as the MCP specification warns.
    #[serde(default)]
    pub trusted: bool,
    /// Which of the server's tools the agent may use: `"all"` (the default) or a list of
    /// names.
    #[serde(default)]
    pub tools: ToolSelection,
    /// The policy of the server's tools the agent's `[[tools]]` give none, instead of the one
    /// read from the server's annotations (see [`default_approval`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalDef>,
}

fn default_timeout_ms() -> u64 {
    30_000
}

impl McpServerDef {
    /// Checks that the entry gives exactly one of `url` and a non-empty `command`; else says
    /// what is wrong.
    pub fn check(&self) -> Result<(), String> {
        match (&self.url, &self.command) {
            (Some(_), None) => Ok(()),
            (None, Some(command)) if !command.is_empty() => Ok(()),
            (None, Some(_)) => Err("command is empty".into()),
            _ => Err("give either url (Streamable HTTP) or command (stdio)".into()),
        }
    }

    /// Whether the agent may use the server's tool `name`.
    pub fn selects(&self, name: &str) -> bool {
        match &self.tools {
            ToolSelection::All(_) => true,
            ToolSelection::Only(names) => names.iter().any(|n| n == name),
        }
    }
}

/// `"all"`, or the names of the tools the agent may use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolSelection {
    /// `"all"`: every tool the server lists.
    All(All),
    /// Only the tools of these names; each must be listed by the server.
    Only(Vec<String>),
}

impl Default for ToolSelection {
    fn default() -> Self {
        Self::All(All::All)
    }
}

/// The one word `"all"`, as `tools = "all"` writes it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum All {
    /// `"all"`.
    All,
}

/// A tool as the server's `tools/list` described it (MCP's `Tool`, the fields countersign
/// uses, in the wire's names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpTool {
    /// The tool's name on its server, which the agent's tool takes.
    pub name: String,
    /// A name for people to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the tool does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of the tool's arguments (`inputSchema`).
    pub input_schema: Value,
    /// The server's hints about the tool; trusted only as its `McpServerDef::trusted` says.
    #[serde(default, skip_serializing_if = "Annotations::is_empty")]
    pub annotations: Annotations,
    /// The rest of the definition (`outputSchema`, `icons`, `_meta`...), kept so that the
    /// tool is shown on as its server gave it and any change to it is a change of version.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// MCP's tool annotations: hints, absent ones meaning what the specification says.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Annotations {
    /// A name for people to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The tool does not change its environment (`readOnlyHint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// The tool may destroy or overwrite, not only add (`destructiveHint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// Calling it again with the same arguments has no further effect (`idempotentHint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// The tool reaches beyond a closed world, the web say (`openWorldHint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
    /// Hints later versions of the specification add.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

impl Annotations {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Absent means false.
    pub fn read_only(&self) -> bool {
        self.read_only_hint.unwrap_or(false)
    }

    /// Absent means true (only meaningful for a tool that is not read-only).
    pub fn destructive(&self) -> bool {
        self.destructive_hint.unwrap_or(true)
    }

    /// Absent means false.
    pub fn idempotent(&self) -> bool {
        self.idempotent_hint.unwrap_or(false)
    }
}

/// The policy of a discovered tool the agent file gives none: the server entry's `approval`
/// if it gives one; else, from a trusted server, held unless it says it is read-only; from any
/// other, always held.
pub fn default_approval(server: &McpServerDef, tool: &McpTool) -> ApprovalDef {
    if let Some(approval) = &server.approval {
        return approval.clone();
    }
    let hints = &tool.annotations;
    let reason = if !server.trusted {
        format!(
            "{} is a tool of the MCP server {}, which the agent does not trust to classify its tools, and the agent sets no policy for it",
            tool.name, server.name
        )
    } else if hints.read_only() {
        return ApprovalDef::Mode(ApprovalMode::Never);
    } else if hints.destructive() {
        format!(
            "the MCP server {} says {} may change or destroy data",
            server.name, tool.name
        )
    } else {
        format!(
            "the MCP server {} says {} may change data (additively)",
            server.name, tool.name
        )
    };
    ApprovalDef::Rule(Box::new(ApprovalRule {
        reason: Some(reason),
        ..ApprovalRule::held()
    }))
}

/// The risk class of a discovered tool the agent file gives none: what a trusted server's
/// annotations say (read-only; else destructive unless it says otherwise, as the
/// specification reads absent hints); none for a server nobody vouched for.
pub fn default_risk(server: &McpServerDef, tool: &McpTool) -> Option<Risk> {
    let hints = &tool.annotations;
    server
        .trusted
        .then(|| match (hints.read_only(), hints.destructive()) {
            (true, _) => Risk::ReadOnly,
            (false, true) => Risk::Destructive,
            (false, false) => Risk::Reversible,
        })
}

/// Whether a crash may send a discovered tool's call again: only where a trusted server
/// says repeating it changes nothing more.
pub fn default_idempotent(server: &McpServerDef, tool: &McpTool) -> bool {
    server.trusted && tool.annotations.idempotent()
}

/// What a `tools/call` result (MCP's `CallToolResult`, as JSON) says, as text for the model
/// and for reviewers: text blocks as they are; the structured content as JSON when no text
/// block carries it; resources by link; images and audio by kind. Whether it is an error is
/// its `isError`.
pub fn result_text(result: &Value) -> (String, bool) {
    let mut parts: Vec<String> = Vec::new();
    for block in result["content"].as_array().into_iter().flatten() {
        let field = |name: &str| block[name].as_str().unwrap_or_default();
        match field("type") {
            "text" => parts.push(field("text").to_string()),
            "image" | "audio" => parts.push(format!("[{} {}]", field("type"), field("mimeType"))),
            "resource_link" => parts.push(resource_line(block)),
            "resource" => {
                let resource = &block["resource"];
                match resource["text"].as_str() {
                    Some(text) => parts.push(format!("{}\n{text}", resource_line(resource))),
                    None => parts.push(resource_line(resource)),
                }
            }
            other => parts.push(format!("[{other} content]")),
        }
    }
    if parts.is_empty()
        && let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null())
    {
        parts.push(structured.to_string());
    }
    (
        parts.join("\n"),
        result["isError"].as_bool().unwrap_or(false),
    )
}

/// The most of one image passed to the model (base64 characters, about 3.75 MB decoded);
/// a larger one reaches it only as its mention in the text.
pub const MAX_IMAGE_CHARS: usize = 5_000_000;
/// The most images of one result passed to the model.
pub const MAX_IMAGES: usize = 8;

/// The image blocks of a `tools/call` result, for the model to see (the text mentions them
/// for reviewers): at most [`MAX_IMAGES`], each at most [`MAX_IMAGE_CHARS`].
pub fn result_images(result: &Value) -> Vec<Image> {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|block| block["type"] == "image")
        .filter_map(|block| {
            Some(Image {
                media_type: block["mimeType"].as_str()?.to_string(),
                data: block["data"]
                    .as_str()
                    .filter(|d| d.len() <= MAX_IMAGE_CHARS)?
                    .to_string(),
            })
        })
        .take(MAX_IMAGES)
        .collect()
}

fn resource_line(resource: &Value) -> String {
    let field = |name: &str| resource[name].as_str().filter(|s| !s.is_empty());
    let mut line = format!("[resource {}", field("uri").unwrap_or("(no uri)"));
    if let Some(name) = field("name") {
        line.push_str(&format!(" \"{name}\""));
    }
    if let Some(mime) = field("mimeType") {
        line.push_str(&format!(" {mime}"));
    }
    line.push(']');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn server(trusted: bool) -> McpServerDef {
        toml::from_str(&format!(
            "name = \"shop\"\nurl = \"http://127.0.0.1:1/mcp\"\ntrusted = {trusted}"
        ))
        .unwrap()
    }

    fn tool(annotations: Value) -> McpTool {
        serde_json::from_value(json!({
            "name": "t", "inputSchema": {"type": "object"}, "annotations": annotations,
        }))
        .unwrap()
    }

    fn runs_at_once(approval: &ApprovalDef) -> bool {
        matches!(approval, ApprovalDef::Mode(ApprovalMode::Never))
    }

    #[test]
    fn a_trusted_server_lets_read_only_tools_run_and_holds_the_rest() {
        let trusted = server(true);
        assert!(runs_at_once(&default_approval(
            &trusted,
            &tool(json!({"readOnlyHint": true}))
        )));
        for hints in [
            json!({}),
            json!({"readOnlyHint": false, "destructiveHint": false}),
        ] {
            assert!(!runs_at_once(&default_approval(&trusted, &tool(hints))));
        }
        assert!(default_idempotent(
            &trusted,
            &tool(json!({"idempotentHint": true}))
        ));
        // Absent means not idempotent, as the specification has it.
        assert!(!default_idempotent(
            &trusted,
            &tool(json!({"readOnlyHint": true}))
        ));
    }

    #[test]
    fn an_untrusted_server_s_hints_decide_nothing() {
        let untrusted = server(false);
        let hinted = tool(json!({"readOnlyHint": true, "idempotentHint": true}));
        assert!(!runs_at_once(&default_approval(&untrusted, &hinted)));
        assert!(!default_idempotent(&untrusted, &hinted));
    }

    #[test]
    fn a_server_is_reached_one_way() {
        assert!(server(true).check().is_ok());
        let both: McpServerDef =
            toml::from_str("name = \"s\"\nurl = \"http://x/mcp\"\ncommand = [\"srv\"]").unwrap();
        assert!(both.check().is_err());
        let neither: McpServerDef = toml::from_str("name = \"s\"").unwrap();
        assert!(neither.check().is_err());
        let listed: McpServerDef =
            toml::from_str("name = \"s\"\ncommand = [\"srv\"]\ntools = [\"a\"]").unwrap();
        assert!(listed.selects("a") && !listed.selects("b"));
        assert!(server(true).selects("anything"));
    }

    #[test]
    fn a_tool_is_kept_whole_as_its_server_described_it() {
        let wire = json!({
            "name": "t", "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object"}, "icons": [{"src": "https://x/i.png"}],
            "annotations": {"readOnlyHint": true, "futureHint": 3},
        });
        let tool: McpTool = serde_json::from_value(wire.clone()).unwrap();
        assert!(tool.annotations.read_only());
        assert_eq!(serde_json::to_value(&tool).unwrap(), wire);
    }

    #[test]
    fn results_read_as_text_with_links_and_kinds() {
        let result = json!({
            "content": [
                {"type": "text", "text": "found it"},
                {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
                {"type": "resource_link", "uri": "file:///a.txt", "name": "a", "mimeType": "text/plain"},
                {"type": "resource", "resource": {"uri": "mem://b", "text": "inside"}},
            ],
            "structuredContent": {"ignored": "the text carries it"},
        });
        assert_eq!(
            result_text(&result),
            (
                "found it\n[image image/png]\n[resource file:///a.txt \"a\" text/plain]\n[resource mem://b]\ninside"
                    .to_string(),
                false
            )
        );
        let structured = json!({"content": [], "structuredContent": {"amount": 5}});
        assert_eq!(result_text(&structured).0, r#"{"amount":5}"#);
        assert_eq!(
            result_images(&result),
            [Image {
                media_type: "image/png".into(),
                data: "iVBORw0KGgo=".into()
            }]
        );
        let error = json!({"content": [{"type": "text", "text": "no"}], "isError": true});
        assert_eq!(result_text(&error), ("no".to_string(), true));
    }
}
