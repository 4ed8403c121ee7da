//! A condition on a call's input, in CEL like the policies' (`input.amount <= 50.0 &&
//! input.order_id.startsWith("A-")`): what a standing grant covers, and what the command
//! line's `pending --where` keeps. A condition that cannot be evaluated for an input does not
//! match it: when in doubt, a person decides.

use cel::{Context, Env, Program, Value as Cel};
use serde_json::Value;
use std::sync::{Arc, LazyLock};

static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(Env::stdlib()));

/// Longest condition accepted, in bytes.
pub const MAX_CONDITION: usize = 2000;

pub struct Condition {
    source: String,
    program: Program,
}

impl std::fmt::Debug for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Condition").field(&self.source).finish()
    }
}

impl Condition {
    /// Compiles `source`, or says in a reviewer's words why it cannot be.
    pub fn compile(source: &str) -> Result<Self, String> {
        let source = source.trim();
        if source.is_empty() {
            return Err("the condition is empty (write `true` to cover every input)".into());
        }
        if source.len() > MAX_CONDITION {
            return Err(format!(
                "the condition is longer than {MAX_CONDITION} bytes"
            ));
        }
        let program = ENV
            .compile(source)
            .map_err(|e| format!("the condition {source:?} is not CEL: {e}"))?;
        Ok(Self {
            source: source.to_string(),
            program,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether `input` satisfies the condition: `Err` says why it could not be told (a field
    /// it reads is missing, or it gave something other than true or false).
    pub fn check(&self, input: &Value) -> Result<bool, String> {
        let mut ctx = Context::with_env(ENV.clone());
        ctx.add_variable("input", input)
            .map_err(|e| e.to_string())?;
        match self.program.execute(&ctx) {
            Ok(Cel::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("it gave {other:?}, not true or false")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Whether `input` satisfies the condition; one that cannot be evaluated does not.
    pub fn matches(&self, input: &Value) -> bool {
        self.check(input).unwrap_or(false)
    }
}

/// A condition a reviewer starts from, covering `input` and calls like it: each number at
/// most its value, each text and truth value equal to its own. Nested values are left out
/// (the reviewer adds what matters); an input with nothing to compare gives `true`.
pub fn suggested(input: &Value) -> String {
    let mut parts = Vec::new();
    if let Value::Object(fields) = input {
        for (name, value) in fields {
            if !is_identifier(name) {
                continue;
            }
            match value {
                Value::Number(n) => parts.push(format!("input.{name} <= {}", cel_number(n))),
                Value::String(_) | Value::Bool(_) => parts.push(format!("input.{name} == {value}")),
                _ => {}
            }
        }
    }
    if parts.is_empty() {
        "true".into()
    } else {
        parts.join(" && ")
    }
}

/// A JSON number as a CEL double, so it compares with integers and decimals alike.
fn cel_number(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.1}"),
        Some(f) => f.to_string(),
        None => n.to_string(),
    }
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_condition_matches_what_it_says() {
        let c = Condition::compile(r#"input.amount <= 50.0 && input.order_id.startsWith("A-")"#)
            .unwrap();
        assert!(c.matches(&json!({"amount": 50, "order_id": "A-1"})));
        assert!(c.matches(&json!({"amount": 12.5, "order_id": "A-2"})));
        assert!(!c.matches(&json!({"amount": 50.01, "order_id": "A-1"})));
        assert!(!c.matches(&json!({"amount": 5, "order_id": "B-1"})));
    }

    #[test]
    fn what_cannot_be_evaluated_does_not_match() {
        let c = Condition::compile("input.amount <= 50.0").unwrap();
        assert!(!c.matches(&json!({"order_id": "A-1"})));
        assert!(c.check(&json!({})).is_err());
        let not_bool = Condition::compile("input.amount").unwrap();
        assert!(!not_bool.matches(&json!({"amount": 1})));
    }

    #[test]
    fn bad_conditions_are_refused_with_their_reason() {
        assert!(Condition::compile("  ").unwrap_err().contains("empty"));
        assert!(
            Condition::compile("input.amount <=")
                .unwrap_err()
                .contains("not CEL")
        );
        assert!(Condition::compile(&"x".repeat(MAX_CONDITION + 1)).is_err());
    }

    #[test]
    fn the_suggestion_covers_its_own_call() {
        let input = json!({"order_id": "A-1001", "amount": 42, "full": true, "lines": [1]});
        let s = suggested(&input);
        assert_eq!(
            s,
            r#"input.amount <= 42.0 && input.full == true && input.order_id == "A-1001""#
        );
        let c = Condition::compile(&s).unwrap();
        assert!(c.matches(&input));
        assert!(c.matches(&json!({"order_id": "A-1001", "amount": 41.5, "full": true})));
        assert!(!c.matches(&json!({"order_id": "A-1002", "amount": 1, "full": true})));
        assert_eq!(suggested(&json!({"a b": 1})), "true");
    }
}
