//! The three decision forms (approve, edit, reject), shared by the inbox and the email
//! pages, and the reading of what a reviewer sent back. The edit form is built from the
//! tool's input schema: one field per property, by type (text, number, checkbox, a list for
//! an `enum`, JSON for objects and arrays), labelled by the schema's titles, its limits the
//! fields' own constraints. Whatever is wrong comes back beside its field in a reviewer's
//! words (the same words every channel uses), tied to it for screen readers, with what they
//! typed kept. On the inbox's request page the approve form sits in an action bar
//! ([`Forms::bar`]) and the other two below it ([`Forms::below`]).

use super::request_view::{CallView, pretty};
use crate::decide::Proposed;
use crate::state::AppState;
use countersign_model::input_problem::InputProblem;
use countersign_model::run::Action;
use maud::{Markup, html};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};

/// Messages by form field name (`note`, `reason`, `input`, `input.<property>`, or `form`
/// for the whole form).
pub(crate) type FieldErrors = BTreeMap<String, Vec<String>>;

/// What a reviewer sent, as fields.
pub(crate) type Typed = HashMap<String, String>;

/// How the forms are drawn: for whom (the CSRF token of an inbox session; none on an email
/// page, whose token is in its URL), which actions they may take, from which digest.
pub(crate) struct Forms<'a> {
    pub(crate) csrf: Option<&'a str>,
    pub(crate) digest: &'a str,
    pub(crate) actions: &'a [Action],
    pub(crate) schema: Option<&'a Value>,
    pub(crate) input: &'a Value,
    pub(crate) typed: &'a Typed,
    pub(crate) errors: &'a FieldErrors,
}

impl Forms<'_> {
    pub(crate) fn render(&self) -> Markup {
        html! {
            @if let Some(errors) = self.errors.get("form") {
                @for e in errors { p.error role="alert" { (e) } }
            }
            @for action in self.actions {
                @match action {
                    Action::Approve => (self.approve()),
                    Action::Edit => (self.edit()),
                    Action::Reject => (self.reject()),
                }
            }
        }
    }

    /// The action bar of the inbox's request page: Approve at once, `more` (links to forms
    /// of the page's own), Edit and Reject leading to their forms below ([`Self::below`]),
    /// and `status`, the live region that says when the request was decided elsewhere,
    /// beside them.
    pub(crate) fn bar(&self, more: Markup, status: Markup) -> Markup {
        html! {
            nav.actions aria-label="Decide" {
                div.buttons {
                    @if self.actions.contains(&Action::Approve) {
                        form #approve .decide method="post" {
                            (self.hidden("approve"))
                            button.approve type="submit" { "Approve" }
                        }
                    }
                    (more)
                    @if self.actions.contains(&Action::Edit) { a.action href="#edit" { "Edit…" } }
                    @if self.actions.contains(&Action::Reject) { a.action.reject href="#reject" { "Reject…" } }
                }
                (status)
            }
        }
    }

    /// The forms the action bar leads to: `first` (a form of the page's own), then edit and
    /// reject.
    pub(crate) fn below(&self, first: Markup) -> Markup {
        html! {
            @if let Some(errors) = self.errors.get("form") {
                @for e in errors { p.error role="alert" { (e) } }
            }
            (first)
            @if self.actions.contains(&Action::Edit) { (self.edit()) }
            @if self.actions.contains(&Action::Reject) { (self.reject()) }
        }
    }

    fn hidden(&self, action: &str) -> Markup {
        html! {
            @if let Some(csrf) = self.csrf {
                input type="hidden" name="csrf" value=(csrf);
            }
            input type="hidden" name="digest" value=(self.digest);
            input type="hidden" name="action" value=(action);
        }
    }

    fn typed(&self, name: &str) -> &str {
        self.typed.get(name).map(String::as_str).unwrap_or_default()
    }

    fn approve(&self) -> Markup {
        html! {
            form #approve .decide method="post" {
                h2 { "Approve" }
                (self.hidden("approve"))
                p { "The tool runs with the input above, as the agent asked." }
                button.approve type="submit" { "Approve" }
            }
        }
    }

    fn reject(&self) -> Markup {
        html! {
            // The fragment brings a page sent back with errors to the form that has them.
            form #reject .decide method="post" action="#reject" {
                h2 { "Reject" }
                (self.hidden("reject"))
                @let tie = Tie::new(self.errors, "reason", "reason", false);
                label for="reason" { "Reason (the agent is told)" }
                (tie.errors())
                textarea #reason name="reason" required aria-describedby=[tie.described_by()] aria-invalid=[tie.invalid()] { (self.typed("reason")) }
                button.reject type="submit" { "Reject" }
            }
        }
    }

    fn edit(&self) -> Markup {
        html! {
            form #edit .decide method="post" action="#edit" data-before=[self.before()] {
                h2 { "Edit, then approve" }
                (self.hidden("edit"))
                @let input = Tie::new(self.errors, "input", "input", false);
                @match properties(self.schema) {
                    Some(properties) => {
                        @for (name, property) in properties {
                            (self.property(name, property))
                        }
                        (input.errors())
                    }
                    None => {
                        label for="input" { "Input (JSON)" }
                        (input.errors())
                        textarea #input name="input" rows="10" required aria-describedby=[input.described_by()] aria-invalid=[input.invalid()] {
                            @if self.typed.contains_key("input") { (self.typed("input")) }
                            @else { (pretty(self.input)) }
                        }
                    }
                }
                @let note = Tie::new(self.errors, "note", "note", false);
                label for="note" { "Note (the agent is told what you changed and why)" }
                (note.errors())
                textarea #note name="note" required aria-describedby=[note.described_by()] aria-invalid=[note.invalid()] { (self.typed("note")) }
                // What the fields change, said as they are typed in (by the inbox's script).
                output #change .change for="edit" aria-live="polite" {}
                button type="submit" { "Approve with these changes" }
            }
        }
    }

    /// The call's values as the edit form's fields first show them, by property (JSON), for
    /// the script that says what the fields change.
    fn before(&self) -> Option<String> {
        let shown: Map<String, Value> = properties(self.schema)?
            .iter()
            .map(|(name, property)| {
                let value = shown(&self.input[name], kind(property));
                (name.clone(), Value::String(value))
            })
            .collect();
        Some(Value::Object(shown).to_string())
    }

    /// One property's field, showing what was typed, else the call's value: labelled by the
    /// schema's title, its description and limits as a hint, the limits also as the field's
    /// own constraints (so the browser stops what the schema would refuse), and its errors
    /// tied to it for screen readers.
    fn property(&self, name: &str, property: &Value) -> Markup {
        let field = format!("input.{name}");
        let id = format!("input-{name}");
        let current = &self.input[name];
        let value = match self.typed.get(&field) {
            Some(typed) => typed.clone(),
            None => shown(current, kind(property)),
        };
        let label = property["title"].as_str().unwrap_or(name);
        let required = is_required(self.schema, name);
        let hint = hint(property);
        let tie = Tie::new(self.errors, &field, &id, !hint.is_empty());
        let c = Constraints::of(property);
        html! {
            label for=(id) {
                (label)
                @if label != name { " " span.name { "(" (name) ")" } }
            }
            @if !hint.is_empty() { p.hint id=(tie.hint_id) { (hint) } }
            (tie.errors())
            @if let Some(options) = property["enum"].as_array() {
                select id=(id) name=(field) required[required] aria-describedby=[tie.described_by()] aria-invalid=[tie.invalid()] {
                    @if !required { option value="" { "" } }
                    @for option in options {
                        @let text = shown(option, kind(property));
                        option value=(text) selected[text == value] { (text) }
                    }
                }
            } @else {
                @match kind(property) {
                    Kind::Boolean => {
                        @let checked = match self.typed.get(&field) {
                            Some(_) => true,
                            None if self.typed.get("action").is_some_and(|a| a == "edit") => false,
                            None => current.as_bool().unwrap_or(false),
                        };
                        input id=(id) type="checkbox" name=(field) value="true" checked[checked] aria-describedby=[tie.described_by()] aria-invalid=[tie.invalid()];
                    }
                    Kind::Number | Kind::Integer => {
                        @let step = if kind(property) == Kind::Integer { "1" } else { "any" };
                        input id=(id) type="number" step=(step) name=(field) value=(value)
                            min=[c.min.as_deref()] max=[c.max.as_deref()] required[required]
                            aria-describedby=[tie.described_by()] aria-invalid=[tie.invalid()];
                    }
                    Kind::Json => textarea id=(id) name=(field) rows="6" required[required] aria-describedby=[tie.described_by()] aria-invalid=[tie.invalid()] { (value) },
                    Kind::String => input id=(id) type="text" name=(field) value=(value)
                        minlength=[c.min_length] maxlength=[c.max_length] pattern=[c.pattern.as_deref()]
                        required[required] aria-describedby=[tie.described_by()] aria-invalid=[tie.invalid()];,
                }
            }
        }
    }
}

/// How a field is tied to its hint and its errors, for screen readers: `aria-describedby`
/// names both, `aria-invalid` says whether it has errors.
pub(crate) struct Tie<'a> {
    errors: &'a [String],
    pub(crate) hint_id: String,
    error_id: String,
    has_hint: bool,
}

impl<'a> Tie<'a> {
    pub(crate) fn new(errors: &'a FieldErrors, field: &str, id: &str, has_hint: bool) -> Self {
        Self {
            errors: errors.get(field).map(Vec::as_slice).unwrap_or_default(),
            hint_id: format!("{id}-hint"),
            error_id: format!("{id}-error"),
            has_hint,
        }
    }

    pub(crate) fn described_by(&self) -> Option<String> {
        let ids: Vec<&str> = [
            (self.has_hint, self.hint_id.as_str()),
            (!self.errors.is_empty(), self.error_id.as_str()),
        ]
        .into_iter()
        .filter_map(|(present, id)| present.then_some(id))
        .collect();
        (!ids.is_empty()).then(|| ids.join(" "))
    }

    pub(crate) fn invalid(&self) -> Option<&'static str> {
        (!self.errors.is_empty()).then_some("true")
    }

    /// The field's errors, in one element the field names.
    pub(crate) fn errors(&self) -> Markup {
        html! {
            @if !self.errors.is_empty() {
                div.field-errors id=(self.error_id) {
                    @for e in self.errors { p.field-error { (e) } }
                }
            }
        }
    }
}

/// A property's limits as an HTML field's constraints. HTML has no exclusive bound, so an
/// exclusive one is given as inclusive (the browser lets the bound itself through, the
/// schema check refuses it); a JSON Schema pattern matches anywhere in the text, an HTML one
/// the whole text, hence the `.*` either side.
struct Constraints {
    min: Option<String>,
    max: Option<String>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    pattern: Option<String>,
}

impl Constraints {
    fn of(property: &Value) -> Self {
        let bound = |inclusive: &str, exclusive: &str| {
            property[inclusive]
                .as_number()
                .or_else(|| property[exclusive].as_number())
                .map(ToString::to_string)
        };
        Self {
            min: bound("minimum", "exclusiveMinimum"),
            max: bound("maximum", "exclusiveMaximum"),
            min_length: property["minLength"].as_u64(),
            max_length: property["maxLength"].as_u64(),
            pattern: property["pattern"].as_str().map(|p| format!(".*(?:{p}).*")),
        }
    }
}

/// The schema's description of a property and its limits, in words: "Refund amount in USD.
/// More than 0, at most 500."
fn hint(property: &Value) -> String {
    let number = |key: &str| property[key].as_number().map(ToString::to_string);
    let limits: Vec<String> = [
        ("minimum", "at least"),
        ("exclusiveMinimum", "more than"),
        ("maximum", "at most"),
        ("exclusiveMaximum", "less than"),
    ]
    .into_iter()
    .filter_map(|(key, words)| number(key).map(|n| format!("{words} {n}")))
    .chain(number("minLength").map(|n| format!("at least {n} characters")))
    .chain(number("maxLength").map(|n| format!("at most {n} characters")))
    .collect();
    let mut hint = property["description"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_string();
    if !limits.is_empty() {
        let mut limits = limits.join(", ");
        if let Some(first) = limits.get(..1) {
            limits = first.to_uppercase() + &limits[1..];
        }
        if !hint.is_empty() && !hint.ends_with('.') {
            hint.push('.');
        }
        if !hint.is_empty() {
            hint.push(' ');
        }
        hint.push_str(&limits);
        hint.push('.');
    }
    hint
}

/// How a property is typed in.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    String,
    Number,
    Integer,
    Boolean,
    Json,
}

fn kind(property: &Value) -> Kind {
    let ty = match &property["type"] {
        Value::String(t) => t.as_str(),
        // ["number", "null"] and the like: the first type that is not null.
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("json"),
        _ => "json",
    };
    match ty {
        "string" => Kind::String,
        "number" => Kind::Number,
        "integer" => Kind::Integer,
        "boolean" => Kind::Boolean,
        _ => Kind::Json,
    }
}

/// A value as its field shows it: strings bare, numbers as written, anything else as JSON.
fn shown(value: &Value, kind: Kind) -> String {
    match (value, kind) {
        (Value::Null, _) => String::new(),
        (Value::String(s), _) => s.clone(),
        (Value::Number(n), _) => n.to_string(),
        (other, Kind::Json) => pretty(other),
        (other, _) => other.to_string(),
    }
}

/// The schema's properties, when it is an object schema that names them.
fn properties(schema: Option<&Value>) -> Option<&Map<String, Value>> {
    schema?["properties"].as_object().filter(|p| !p.is_empty())
}

fn is_required(schema: Option<&Value>, name: &str) -> bool {
    schema
        .and_then(|s| s["required"].as_array())
        .is_some_and(|r| r.iter().any(|n| n == name))
}

/// The decision a form asks for on `view`'s call, shown `digest`, checked as far as a form
/// can be: an action, a reason to reject, a note and an input that fits the tool's schema to
/// edit. Every problem is listed by field; nothing is decided here.
pub(crate) fn decision_from_form(
    state: &AppState,
    view: &CallView,
    typed: &Typed,
    digest: &str,
) -> Result<Proposed, FieldErrors> {
    let schema = view.schema(state);
    let schema = schema.as_ref();
    let (action, input) = read(typed, schema, &view.input)?;
    if let (Some(input), Some(agent)) = (&input, state.catalog().get(&view.agent)) {
        let problems = agent.edit_problems(&view.tool, &view.input, input);
        if !problems.is_empty() {
            return Err(schema_errors(&problems, schema));
        }
    }
    let text = |name: &str| {
        typed
            .get(name)
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    };
    Ok(Proposed {
        call_id: view.call_id.clone(),
        digest: Some(digest.to_string()),
        action,
        input,
        note: text("note").filter(|_| action == Action::Edit),
        reason: text("reason").filter(|_| action == Action::Reject),
        grant: None,
    })
}

/// What the reviewer asked for: an action, and for an edit the new input, read from the
/// fields against the tool's schema (properties the schema does not name are kept from the
/// call's input; fields the form does not have are read as text, for the edit's check to
/// refuse). Every problem is listed by field; nothing is decided here.
fn read(
    typed: &Typed,
    schema: Option<&Value>,
    original: &Value,
) -> Result<(Action, Option<Value>), FieldErrors> {
    let mut errors = FieldErrors::new();
    let mut complain =
        |field: &str, message: String| errors.entry(field.to_string()).or_default().push(message);
    let blank = |name: &str| typed.get(name).is_none_or(|v| v.trim().is_empty());
    let action = match typed.get("action").map(String::as_str) {
        Some("approve") => Action::Approve,
        Some("reject") => Action::Reject,
        Some("edit") => Action::Edit,
        _ => {
            complain("form", "Choose approve, edit or reject.".into());
            return Err(errors);
        }
    };
    let mut input = None;
    match action {
        Action::Approve => {}
        Action::Reject => {
            if blank("reason") {
                complain("reason", "Write a reason: the agent is told why.".into());
            }
        }
        Action::Edit => {
            if blank("note") {
                complain(
                    "note",
                    "Write a note: the agent is told what you changed and why.".into(),
                );
            }
            match edited(typed, schema, original) {
                Ok(value) => input = Some(value),
                Err(problems) => {
                    for (field, message) in problems {
                        complain(&field, message);
                    }
                }
            }
        }
    }
    if errors.is_empty() {
        Ok((action, input))
    } else {
        Err(errors)
    }
}

/// The edited input from the fields; the problems by field otherwise.
fn edited(
    typed: &Typed,
    schema: Option<&Value>,
    original: &Value,
) -> Result<Value, Vec<(String, String)>> {
    let Some(properties) = properties(schema) else {
        let text = typed.get("input").map(String::as_str).unwrap_or_default();
        return serde_json::from_str(text).map_err(|_| {
            vec![(
                "input".to_string(),
                "The input is not valid JSON: check its brackets, quotes and commas.".to_string(),
            )]
        });
    };
    let mut input = original.as_object().cloned().unwrap_or_default();
    let mut problems = Vec::new();
    for (name, property) in properties {
        let field = format!("input.{name}");
        let raw = typed.get(&field).map(|v| v.trim()).unwrap_or_default();
        let kind = kind(property);
        if kind != Kind::Boolean && raw.is_empty() && property.get("enum").is_none() {
            // An empty field leaves the property out; the schema says whether it may be.
            if kind != Kind::String || !input.contains_key(name) {
                input.remove(name);
                continue;
            }
        }
        let value = match (property["enum"].as_array(), kind) {
            (Some(options), _) => match options.iter().find(|o| shown(o, kind) == raw) {
                Some(option) => Ok(option.clone()),
                None if raw.is_empty() => {
                    input.remove(name);
                    continue;
                }
                None => Err("must be one of the listed choices".to_string()),
            },
            (None, Kind::Boolean) => Ok(Value::Bool(typed.contains_key(&field))),
            (None, Kind::String) => Ok(Value::String(raw.to_string())),
            (None, Kind::Integer) => raw
                .parse::<i64>()
                .map(Value::from)
                .map_err(|_| "must be a whole number".to_string()),
            (None, Kind::Number) => number(raw).ok_or_else(|| "must be a number".to_string()),
            (None, Kind::Json) => serde_json::from_str(raw).map_err(|_| {
                "is not valid JSON: check its brackets, quotes and commas".to_string()
            }),
        };
        match value {
            Ok(value) => {
                input.insert(name.clone(), value);
            }
            Err(message) => problems.push((field, format!("{name}: {message}"))),
        }
    }
    // A field the form does not have (typed by hand into the request) is kept, so that the
    // edit's check refuses it by name rather than the edit silently leaving it out.
    for (field, raw) in typed {
        if let Some(name) = field.strip_prefix("input.")
            && !properties.contains_key(name)
        {
            input.insert(name.to_string(), Value::String(raw.clone()));
        }
    }
    if problems.is_empty() {
        Ok(Value::Object(input))
    } else {
        Err(problems)
    }
}

/// A decimal as typed (`49`, `49.5`, `1e3`): an integer when it is one.
fn number(text: &str) -> Option<Value> {
    if let Ok(n) = text.parse::<i64>() {
        return Some(Value::from(n));
    }
    let f = text.parse::<f64>().ok().filter(|f| f.is_finite())?;
    serde_json::Number::from_f64(f).map(Value::Number)
}

/// Schema problems, each beside the field it is about (the form's top for the rest).
fn schema_errors(problems: &[InputProblem], schema: Option<&Value>) -> FieldErrors {
    let named = properties(schema);
    let mut errors = FieldErrors::new();
    for problem in problems {
        let field = if named.is_some_and(|p| p.contains_key(&problem.field)) {
            format!("input.{}", problem.field)
        } else {
            "input".to_string()
        };
        errors.entry(field).or_default().push(problem.to_string());
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "order_id": {"type": "string"}, "amount": {"type": "number"},
            "notify": {"type": "boolean"}, "speed": {"enum": ["slow", "fast"]},
            "tags": {"type": "array"}}, "required": ["order_id", "amount"]})
    }

    fn typed(fields: &[(&str, &str)]) -> Typed {
        fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn an_edit_is_read_by_the_schema_types() {
        let original = json!({"order_id": "A-1", "amount": 129, "extra": 1});
        let form = typed(&[
            ("action", "edit"),
            ("note", "less"),
            ("input.order_id", "A-1"),
            ("input.amount", "49.5"),
            ("input.notify", "true"),
            ("input.speed", "fast"),
            ("input.tags", "[\"a\"]"),
        ]);
        let (action, input) = read(&form, Some(&schema()), &original).unwrap();
        assert_eq!(action, Action::Edit);
        assert_eq!(
            input.unwrap(),
            json!({"order_id": "A-1", "amount": 49.5, "notify": true, "speed": "fast",
                   "tags": ["a"], "extra": 1})
        );
    }

    #[test]
    fn what_cannot_be_read_is_said_beside_its_field_in_plain_words() {
        let form = typed(&[
            ("action", "edit"),
            ("input.amount", "12,50"),
            ("input.tags", "[1,"),
        ]);
        let errors = read(&form, Some(&schema()), &json!({})).unwrap_err();
        assert_eq!(errors["input.amount"], ["amount: must be a number"]);
        assert!(errors["input.tags"][0].starts_with("tags: is not valid JSON"));
        assert!(errors["note"][0].starts_with("Write a note"));
        let errors = read(&typed(&[("action", "reject")]), None, &json!({})).unwrap_err();
        assert!(errors["reason"][0].starts_with("Write a reason"));
    }
}
