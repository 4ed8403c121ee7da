//! What is wrong with an input, worded for the person who typed it: a schema's complaint
//! (see `Agent::input_problems`) or a field an edit may not touch (see `edit`).

use serde_json::Value;

/// One way an input breaks its tool's schema, worded for the person who typed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputProblem {
    /// The top-level property it is about; empty for the input as a whole.
    pub field: String,
    /// What is wrong, e.g. `must be at most 500`.
    pub message: String,
}

impl std::fmt::Display for InputProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl InputProblem {
    /// A schema error in a reviewer's words: which property, and what it must be.
    pub(crate) fn from_schema(error: &jsonschema::ValidationError<'_>) -> Self {
        use jsonschema::error::{TypeKind, ValidationErrorKind as Kind};
        let pointer = error.instance_path().to_string();
        let mut field = pointer
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or_default()
            .replace("~1", "/")
            .replace("~0", "~");
        let listed = |v: &Value| match v {
            Value::Array(items) => items
                .iter()
                .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(", "),
            other => other.to_string(),
        };
        let message = match error.kind() {
            Kind::Maximum { limit } => format!("must be at most {limit}"),
            Kind::Minimum { limit } => format!("must be at least {limit}"),
            Kind::ExclusiveMaximum { limit } => format!("must be less than {limit}"),
            Kind::ExclusiveMinimum { limit } => format!("must be more than {limit}"),
            Kind::MaxLength { limit } => format!("must be at most {limit} characters long"),
            Kind::MinLength { limit } => format!("must be at least {limit} characters long"),
            Kind::Enum { options } => format!("must be one of: {}", listed(options)),
            Kind::Pattern { pattern } => format!("must match the pattern {pattern}"),
            Kind::Format { format } => format!("must be a valid {format}"),
            Kind::Type {
                kind: TypeKind::Single(t),
            } => format!("must be {}", a_type(&t.to_string())),
            Kind::Type {
                kind: TypeKind::Multiple(set),
            } => {
                let names: Vec<String> = set.iter().map(|t| a_type(&t.to_string())).collect();
                format!("must be {}", names.join(" or "))
            }
            Kind::Required { property } => {
                field = property.as_str().unwrap_or_default().to_string();
                "is required".to_string()
            }
            Kind::AdditionalProperties { unexpected } => {
                format!(
                    "has fields the tool does not take: {}",
                    unexpected.join(", ")
                )
            }
            _ => error.to_string(),
        };
        InputProblem { field, message }
    }
}

/// A JSON type's name with its article, as a sentence needs it.
fn a_type(name: &str) -> String {
    match name {
        "integer" => "a whole number".into(),
        "object" | "array" => format!("an {name}"),
        "null" => "empty".into(),
        other => format!("a {other}"),
    }
}
