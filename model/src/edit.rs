//! What a reviewer's edit changes, field by field. An edit may change only the fields the
//! tool takes: those its input schema declares, or, for a schema that declares none, those
//! the held input has. A misspelt field would otherwise ride along beside the one the
//! reviewer meant to change, and the tool would run with the old value. Every channel checks
//! this through [`crate::agent::Agent::edit_problems`]; the CLI checks names before sending
//! with [`unknown_fields`]. The change is what the audit entry records and the model is told.

use crate::input_problem::InputProblem;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One field an edit changed: its value before (absent if the held input had none) and after
/// (absent if the edit removed it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FieldChange {
    /// The field's name at the top level of the input; empty when an input that is not an
    /// object changed as a whole.
    pub field: String,
    /// Its value in the held input; `None` if it had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    /// Its value after the edit; `None` if the edit removed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
}

impl std::fmt::Display for FieldChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |v: &Option<Value>| v.as_ref().map_or("(none)".to_string(), Value::to_string);
        write!(
            f,
            "{}: {} → {}",
            self.field,
            side(&self.before),
            side(&self.after)
        )
    }
}

/// The fields that differ between the held input and the edited one, in name order. An input
/// that is not an object changes as a whole, under the field name `""`.
pub fn changes(held: &Value, edited: &Value) -> Vec<FieldChange> {
    let (Value::Object(before), Value::Object(after)) = (held, edited) else {
        return (held != edited)
            .then(|| FieldChange {
                field: String::new(),
                before: Some(held.clone()),
                after: Some(edited.clone()),
            })
            .into_iter()
            .collect();
    };
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|name| before.get(*name) != after.get(*name))
        .map(|name| FieldChange {
            field: name.clone(),
            before: before.get(name).cloned(),
            after: after.get(name).cloned(),
        })
        .collect()
}

/// The changes in one line each, as the model and the CLI are told them.
pub fn described(changes: &[FieldChange]) -> String {
    if changes.is_empty() {
        return "nothing changed".to_string();
    }
    changes
        .iter()
        .map(FieldChange::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The fields an edit of a call of a tool with `schema`, holding `held`, may change: the
/// schema's declared properties, else the held input's own fields.
pub fn editable_fields(schema: &Value, held: &Value) -> Vec<String> {
    match schema["properties"].as_object().filter(|p| !p.is_empty()) {
        Some(properties) => properties.keys().cloned().collect(),
        None => held
            .as_object()
            .map(|fields| fields.keys().cloned().collect())
            .unwrap_or_default(),
    }
}

/// One problem per name of `fields` that `tool` does not take (`editable` are those it does),
/// in the words every surface shows.
pub fn unknown_fields<'a>(
    tool: &str,
    editable: &[String],
    fields: impl IntoIterator<Item = &'a str>,
) -> Vec<InputProblem> {
    fields
        .into_iter()
        .filter(|field| !field.is_empty() && !editable.iter().any(|e| e == field))
        .map(|field| InputProblem {
            field: field.to_string(),
            message: format!(
                "is not a field of {tool} (its fields: {})",
                editable.join(", ")
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_change_lists_each_field_that_differs_with_before_and_after() {
        let held = json!({"order_id": "A-1", "amount": 129, "gone": true});
        let edited = json!({"order_id": "A-1", "amount": 50, "amout": 50});
        assert_eq!(
            described(&changes(&held, &edited)),
            "amount: 129 → 50\namout: (none) → 50\ngone: true → (none)"
        );
        assert!(changes(&held, &held).is_empty());
    }

    #[test]
    fn only_declared_fields_or_the_held_ones_are_editable() {
        let schema = json!({"type": "object", "properties": {"amount": {}, "order_id": {}}});
        let held = json!({"order_id": "A-1", "amount": 129, "extra": 1});
        let editable = editable_fields(&schema, &held);
        assert_eq!(editable, ["amount", "order_id"]);
        let problems = unknown_fields("issue_refund", &editable, ["amount", "amout"]);
        assert_eq!(
            problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["amout: is not a field of issue_refund (its fields: amount, order_id)"]
        );
        let bare = editable_fields(&json!({"type": "object"}), &held);
        assert_eq!(bare, ["amount", "extra", "order_id"]);
    }
}
