//! The approval policy, decided in code per call: `never`, `always`, or a CEL expression over
//! the call's `input` and the run's `metadata`, with reason and summary templates whose
//! `{{ expr }}` parts are CEL too. A policy that cannot be evaluated asks a person: when in
//! doubt the call waits rather than runs.

use crate::approval::{ApprovalDef, ApprovalMode};
use crate::window::{Facts, Share, Window};
use cel::{Context, Env, Program, Value as Cel};
use serde_json::Value;
use std::sync::Arc;

/// Whether a call may run now.
#[derive(Debug, PartialEq)]
pub enum Gate {
    /// It needs nobody: run it.
    Run,
    /// Hold it for a person.
    Ask {
        /// Why a person is asked, the policy's reason template filled in.
        reason: String,
        /// What the call would do, the summary template filled in.
        summary: String,
    },
}

enum When {
    Never,
    Always,
    Cel(Program),
}

/// One tool's approval policy, compiled: decides whether a call runs or waits.
pub struct Policy {
    env: Arc<Env>,
    tool: String,
    when: When,
    reason: Option<Template>,
    summary: Option<Template>,
    windows: Vec<Window>,
}

/// A policy whose condition or templates do not compile as CEL; says which and why.
#[derive(Debug, thiserror::Error)]
#[error("tool {tool:?}: cannot compile {what} {source_text:?}: {error}")]
pub struct PolicyError {
    tool: String,
    what: &'static str,
    source_text: String,
    error: String,
}

impl Policy {
    /// The policy `approval` of the tool `tool`.
    pub fn compile(env: Arc<Env>, tool: &str, approval: &ApprovalDef) -> Result<Self, PolicyError> {
        let err = |what, source_text: &str, error: String| PolicyError {
            tool: tool.to_string(),
            what,
            source_text: source_text.to_string(),
            error,
        };
        let (when, reason, summary) = match approval {
            ApprovalDef::Mode(ApprovalMode::Never) => (When::Never, None, None),
            ApprovalDef::Mode(ApprovalMode::Always) => (When::Always, None, None),
            ApprovalDef::Rule(rule) => {
                let when = match rule.when.trim() {
                    "never" => When::Never,
                    "always" => When::Always,
                    src => When::Cel(
                        env.compile(src)
                            .map_err(|e| err("condition", src, e.to_string()))?,
                    ),
                };
                let template = |t: &Option<String>, what| {
                    t.as_deref()
                        .map(|src| Template::parse(&env, src).map_err(|e| err(what, src, e)))
                        .transpose()
                };
                (
                    when,
                    template(&rule.reason, "reason")?,
                    template(&rule.summary, "summary")?,
                )
            }
        };
        let windows = approval
            .windows()
            .map(|defs| Window::compile_all(&env, defs))
            .transpose()
            .map_err(|e| err("windows", "", e))?
            .unwrap_or_default();
        Ok(Self {
            env,
            tool: tool.to_string(),
            when,
            reason,
            summary,
            windows,
        })
    }

    /// Whether the policy reads windows: then each call's shares are added to them (see
    /// [`crate::window`]) before [`Policy::gate_with`] decides it.
    pub fn has_windows(&self) -> bool {
        !self.windows.is_empty()
    }

    /// The call's share of each of the policy's windows, or why one cannot be read; `agent`
    /// names the agent whose tool this is (each agent's tool has windows of its own).
    pub fn shares(&self, agent: &str, facts: &Facts<'_>) -> Result<Vec<Share>, String> {
        let scope = format!("{agent}\n{}", self.tool);
        self.windows
            .iter()
            .map(|w| w.share(&self.env, facts, &scope))
            .collect()
    }

    /// Whether a call with `input`, in a run with `metadata`, runs now or waits; a condition
    /// that cannot be evaluated waits.
    pub fn gate(&self, input: &Value, metadata: &Value) -> Gate {
        self.gate_with(input, metadata, &Value::Object(Default::default()))
    }

    /// The reason and summary a held call with `input`, in a run with `metadata`, is shown
    /// (the templates filled in; a window they read shows `?`).
    pub fn described(&self, input: &Value, metadata: &Value) -> (String, String) {
        let empty = Value::Object(Default::default());
        let ctx = self.context(input, metadata, &empty).ok();
        self.told(ctx.as_ref(), None)
    }

    /// A call whose windows cannot be read waits, and the reviewer is told why.
    pub fn unreadable(&self, why: &str) -> Gate {
        self.ask(
            None,
            Some(format!(
                "the policy could not read the call's window: {why}"
            )),
        )
    }

    /// As [`Policy::gate`], with `window` the totals of the policy's windows with the call
    /// counted ([`crate::window::totals`]).
    pub fn gate_with(&self, input: &Value, metadata: &Value, window: &Value) -> Gate {
        let ctx = match self.context(input, metadata, window) {
            Ok(ctx) => ctx,
            Err(e) => {
                return self.ask(
                    None,
                    Some(format!("the policy could not read the call: {e}")),
                );
            }
        };
        match &self.when {
            When::Never => Gate::Run,
            When::Always => self.ask(Some(&ctx), None),
            When::Cel(program) => match program.execute(&ctx) {
                Ok(Cel::Bool(false)) => Gate::Run,
                Ok(Cel::Bool(true)) => self.ask(Some(&ctx), None),
                Ok(other) => self.ask(
                    Some(&ctx),
                    Some(format!(
                        "the policy condition gave {other:?}, not true or false"
                    )),
                ),
                Err(e) => self.ask(
                    Some(&ctx),
                    Some(format!("the policy condition could not be evaluated: {e}")),
                ),
            },
        }
    }

    fn context(
        &self,
        input: &Value,
        metadata: &Value,
        window: &Value,
    ) -> Result<Context<'_, '_>, String> {
        let mut ctx = Context::with_env(self.env.clone());
        for (name, value) in [("input", input), ("metadata", metadata), ("window", window)] {
            ctx.add_variable(name, value).map_err(|e| e.to_string())?;
        }
        Ok(ctx)
    }

    fn ask(&self, ctx: Option<&Context>, failure: Option<String>) -> Gate {
        let (reason, summary) = self.told(ctx, failure);
        Gate::Ask { reason, summary }
    }

    /// The reason (a failure to evaluate the policy, if there was one, else the template's)
    /// and the summary a held call is shown, the templates filled in from `ctx`.
    fn told(&self, ctx: Option<&Context>, failure: Option<String>) -> (String, String) {
        let render = |t: &Option<Template>| match (t, ctx) {
            (Some(t), Some(ctx)) => Some(t.render(ctx)),
            _ => None,
        };
        let reason = failure
            .or_else(|| render(&self.reason))
            .unwrap_or_else(|| format!("the policy requires a person to approve {}", self.tool));
        let summary = render(&self.summary).unwrap_or_else(|| format!("Call {}", self.tool));
        (reason, summary)
    }
}

/// Text with `{{ cel }}` parts.
struct Template {
    parts: Vec<Part>,
}

enum Part {
    Text(String),
    Expr(Program),
}

impl Template {
    fn parse(env: &Env, source: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = source;
        while let Some(start) = rest.find("{{") {
            let end = rest[start..]
                .find("}}")
                .ok_or_else(|| "a '{{' has no closing '}}'".to_string())?;
            parts.push(Part::Text(rest[..start].to_string()));
            let expr = rest[start + 2..start + end].trim();
            parts.push(Part::Expr(env.compile(expr).map_err(|e| e.to_string())?));
            rest = &rest[start + end + 2..];
        }
        parts.push(Part::Text(rest.to_string()));
        Ok(Self { parts })
    }

    fn render(&self, ctx: &Context) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.clone(),
                Part::Expr(program) => match program.execute(ctx) {
                    Ok(v) => display(&v),
                    Err(_) => "?".into(),
                },
            })
            .collect()
    }
}

/// A number as a person reads it: whole ones without `.0`.
pub(crate) fn number_text(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

/// Values as a person reads them: strings without quotes, whole floats without `.0`.
fn display(value: &Cel) -> String {
    match value {
        Cel::String(s) => s.to_string(),
        Cel::Int(i) => i.to_string(),
        Cel::UInt(u) => u.to_string(),
        Cel::Float(f) => number_text(*f),
        Cel::Bool(b) => b.to_string(),
        Cel::Null => "null".into(),
        other => match other.json() {
            Ok(json) => json.to_string(),
            Err(_) => format!("{other:?}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::ToolDef;
    use serde_json::json;

    fn refund_policy(when: &str) -> Policy {
        let tool: ToolDef = toml::from_str(&format!(
            r#"
name = "issue_refund"
description = ""
input_schema = {{ type = "object" }}
http = {{ url = "http://127.0.0.1:1/" }}
[approval]
when = "{when}"
reason = "Refund of ${{{{ input.amount }}}} moves money"
summary = "Refund ${{{{ input.amount }}}} for order {{{{ input.order_id }}}}"
"#
        ))
        .unwrap();
        Policy::compile(Arc::new(Env::stdlib()), &tool.name, &tool.approval).unwrap()
    }

    #[test]
    fn integers_and_decimals_compare_alike() {
        let p = refund_policy("input.amount > 20.0");
        assert!(matches!(
            p.gate(&json!({"amount": 129}), &json!({})),
            Gate::Ask { .. }
        ));
        assert!(matches!(
            p.gate(&json!({"amount": 129.5}), &json!({})),
            Gate::Ask { .. }
        ));
        assert_eq!(p.gate(&json!({"amount": 20}), &json!({})), Gate::Run);
        assert_eq!(p.gate(&json!({"amount": 19.99}), &json!({})), Gate::Run);
    }

    #[test]
    fn templates_fill_in_the_call() {
        let p = refund_policy("always");
        assert_eq!(
            p.gate(&json!({"amount": 129.0, "order_id": "A-1"}), &json!({})),
            Gate::Ask {
                reason: "Refund of $129 moves money".into(),
                summary: "Refund $129 for order A-1".into(),
            }
        );
    }

    #[test]
    fn a_condition_that_fails_asks_a_person() {
        let p = refund_policy("input.missing > 1");
        match p.gate(&json!({"amount": 1}), &json!({})) {
            Gate::Ask { reason, .. } => {
                assert!(reason.contains("could not be evaluated"), "{reason}");
            }
            Gate::Run => panic!("a broken condition must not let the call run"),
        }
    }

    #[test]
    fn metadata_is_visible_to_the_condition() {
        let p = refund_policy("metadata.tier == 'vip'");
        assert_eq!(p.gate(&json!({}), &json!({"tier": "basic"})), Gate::Run);
        assert!(matches!(
            p.gate(&json!({}), &json!({"tier": "vip"})),
            Gate::Ask { .. }
        ));
    }
}
