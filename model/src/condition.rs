//! A condition on a call's input, in CEL like the policies' (`input.amount <= 50.0 &&
//! input.order_id.startsWith("A-")`): what a standing grant covers, and what the command
//! line's `pending --where` keeps. A condition that cannot be evaluated for an input does not
//! match it: when in doubt, a person decides.

use cel::common::ast::{ComprehensionExpr, Expr, LiteralValue};
use cel::{Context, Env, IdedExpr, Program, Value as Cel};
use serde_json::Value;
use std::sync::{Arc, LazyLock};

static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(Env::stdlib()));

/// Longest condition accepted, in bytes.
pub const MAX_CONDITION: usize = 2000;
/// The most nodes a condition's expression may have, macros expanded.
pub const MAX_NODES: usize = 150;
/// The most comprehensions (`all`, `exists`, `exists_one`, `map`, `filter`) in a condition.
pub const MAX_COMPREHENSIONS: usize = 2;
/// The most nodes of a comprehension's body (its step, as the macro expands it).
pub const MAX_BODY_NODES: usize = 24;
/// The most `matches` calls in a condition.
pub const MAX_MATCHES: usize = 4;
/// The most additions (`+`) in a condition outside comprehension bodies: adding lists copies
/// them, so a chain of additions of the input's lists grows quadratically.
pub const MAX_ADDITIONS: usize = 8;
/// The most a `matches` pattern may take once compiled, in bytes.
pub const MAX_PATTERN_BYTES: usize = 64 * 1024;
/// The largest input a condition is evaluated on, in bytes of JSON.
pub const MAX_INPUT: usize = 8 * 1024;

/// Why a condition cannot be compiled, or evaluated for an input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    /// It is empty, not CEL, or cannot be evaluated for this input (a field it reads is
    /// missing, or it gives something other than true or false).
    #[error("{0}")]
    Invalid(String),
    /// It is past one of the limits that bound what evaluating it costs (or the input is
    /// too large to evaluate it on): the message names the limit.
    #[error("{0}")]
    Limit(String),
}

/// A grant's condition, compiled: CEL over `input` that says which calls it covers.
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
    /// Compiles `source`, or says in a reviewer's words why it cannot be. Beyond being CEL,
    /// a condition must keep within limits that bound what evaluating it costs, whoever
    /// wrote it, before anything runs it: at most [`MAX_NODES`] nodes; at most
    /// [`MAX_COMPREHENSIONS`] comprehensions, none inside another, each over a field of
    /// `input` or a list of literals, with a body of at most [`MAX_BODY_NODES`] nodes that
    /// reads only its own variables (not `input`, which would make it quadratic); at most
    /// [`MAX_MATCHES`] `matches`, outside comprehensions, each with a literal pattern that
    /// compiles within [`MAX_PATTERN_BYTES`]; at most [`MAX_ADDITIONS`] additions outside
    /// comprehension bodies. Evaluating one then takes time linear in its
    /// input, which [`Condition::check`] caps at [`MAX_INPUT`].
    pub fn compile(source: &str) -> Result<Self, ConditionError> {
        let source = source.trim();
        if source.is_empty() {
            return Err(ConditionError::Invalid(
                "the condition is empty (write `true` to cover every input)".into(),
            ));
        }
        if source.len() > MAX_CONDITION {
            return Err(ConditionError::Limit(format!(
                "the condition is longer than {MAX_CONDITION} bytes"
            )));
        }
        let program = ENV.compile(source).map_err(|e| {
            ConditionError::Invalid(format!("the condition {source:?} is not CEL: {e}"))
        })?;
        bounded(program.expression())
            .map_err(|why| ConditionError::Limit(format!("the condition is refused: {why}")))?;
        Ok(Self {
            source: source.to_string(),
            program,
        })
    }

    /// The condition as it was written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether `input` satisfies the condition: `Err` says why it could not be told (the
    /// input is over [`MAX_INPUT`], a field it reads is missing, or it gave something other
    /// than true or false).
    pub fn check(&self, input: &Value) -> Result<bool, ConditionError> {
        match self.evaluate(input)? {
            Cel::Bool(b) => Ok(b),
            other => Err(ConditionError::Invalid(format!(
                "it gave {other:?}, not true or false"
            ))),
        }
    }

    /// What the expression gives for `input` as a number of at least 0: what a call adds to
    /// a grant's total (`input.amount`). `Err` says why it does not.
    pub fn number(&self, input: &Value) -> Result<f64, ConditionError> {
        amount(self.evaluate(input)?).map_err(|e| ConditionError::Invalid(format!("it {e}")))
    }

    /// The expression evaluated for `input`, within the bounds of every condition.
    fn evaluate(&self, input: &Value) -> Result<Cel, ConditionError> {
        let size = serde_json::to_vec(input).map_or(usize::MAX, |v| v.len());
        if size > MAX_INPUT {
            return Err(ConditionError::Limit(format!(
                "the input is {size} bytes of JSON, and a condition is evaluated only on inputs of at most {MAX_INPUT} bytes"
            )));
        }
        let mut ctx = Context::with_env(ENV.clone());
        ctx.add_variable("input", input)
            .map_err(|e| ConditionError::Invalid(e.to_string()))?;
        self.program
            .execute(&ctx)
            .map_err(|e| ConditionError::Invalid(e.to_string()))
    }

    /// Whether `input` satisfies the condition; one that cannot be evaluated does not.
    pub fn matches(&self, input: &Value) -> bool {
        self.check(input).unwrap_or(false)
    }
}

/// What a CEL value adds to a total (a grant's, a window's): a number of at least 0, or what
/// it gave instead (`gave "40", not a number`).
pub(crate) fn amount(value: Cel) -> Result<f64, String> {
    let n = match value {
        Cel::Int(i) => i as f64,
        Cel::UInt(u) => u as f64,
        Cel::Float(f) => f,
        other => return Err(format!("gave {other:?}, not a number")),
    };
    if !n.is_finite() || n < 0.0 {
        return Err(format!("gave {n}, not a number of at least 0"));
    }
    Ok(n)
}

/// What a walk of a condition's expression counted.
#[derive(Default)]
struct Counts {
    nodes: usize,
    comprehensions: usize,
    matches: usize,
    additions: usize,
}

/// Whether `expr` keeps within the limits [`Condition::compile`] lists; `Err` names the one
/// it passes.
fn bounded(expr: &IdedExpr) -> Result<(), String> {
    let mut counts = Counts::default();
    walk(expr, &mut counts, false)?;
    if counts.nodes > MAX_NODES {
        return Err(format!(
            "it has {} nodes, and a condition may have at most {MAX_NODES}",
            counts.nodes
        ));
    }
    Ok(())
}

fn walk(expr: &IdedExpr, counts: &mut Counts, in_body: bool) -> Result<(), String> {
    counts.nodes += 1;
    // Checked as it grows, so a huge expression is not walked to its end.
    if counts.nodes > MAX_NODES {
        return Err(format!(
            "it has more than {MAX_NODES} nodes, the most a condition may have"
        ));
    }
    match &expr.expr {
        Expr::Call(call) => {
            if call.func_name == "matches" {
                matches_call(call, counts, in_body)?;
            }
            if call.func_name == "_+_" && !in_body {
                counts.additions += 1;
                if counts.additions > MAX_ADDITIONS {
                    return Err(format!(
                        "it adds (`+`) more than {MAX_ADDITIONS} times, the most a condition may"
                    ));
                }
            }
            if let Some(target) = &call.target {
                walk(target, counts, in_body)?;
            }
            for arg in &call.args {
                walk(arg, counts, in_body)?;
            }
        }
        Expr::Comprehension(c) => comprehension(c, counts, in_body)?,
        Expr::Ident(name) if in_body && name == "input" => {
            return Err(
                "a comprehension's body reads `input`; it may read only its own variable and literals"
                    .into(),
            );
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        Expr::List(list) => {
            for e in &list.elements {
                walk(e, counts, in_body)?;
            }
        }
        Expr::Map(map) => {
            for entry in &map.entries {
                if let cel::common::ast::EntryExpr::MapEntry(e) = &entry.expr {
                    walk(&e.key, counts, in_body)?;
                    walk(&e.value, counts, in_body)?;
                }
            }
        }
        Expr::Select(select) => walk(&select.operand, counts, in_body)?,
        Expr::Struct(_) => return Err("it builds a message, which conditions do not".into()),
    }
    Ok(())
}

fn matches_call(
    call: &cel::common::ast::CallExpr,
    counts: &mut Counts,
    in_body: bool,
) -> Result<(), String> {
    counts.matches += 1;
    if counts.matches > MAX_MATCHES {
        return Err(format!(
            "it calls `matches` more than {MAX_MATCHES} times, the most a condition may"
        ));
    }
    if in_body {
        return Err(
            "it calls `matches` inside a comprehension, where it would run once per element".into(),
        );
    }
    let pattern = match call.args.last().map(|a| &a.expr) {
        Some(Expr::Literal(LiteralValue::String(p))) => p.inner().to_string(),
        _ => return Err("a `matches` pattern must be a string literal".into()),
    };
    regex::RegexBuilder::new(&pattern)
        .size_limit(MAX_PATTERN_BYTES)
        .build()
        .map(|_| ())
        .map_err(|e| format!("the `matches` pattern {pattern:?} is refused: {e}"))
}

fn comprehension(c: &ComprehensionExpr, counts: &mut Counts, in_body: bool) -> Result<(), String> {
    if in_body {
        return Err("it nests a comprehension inside another".into());
    }
    counts.comprehensions += 1;
    if counts.comprehensions > MAX_COMPREHENSIONS {
        return Err(format!(
            "it has more than {MAX_COMPREHENSIONS} comprehensions (all, exists, exists_one, map, filter), the most a condition may"
        ));
    }
    if !(is_input_field(&c.iter_range) || is_literal_list(&c.iter_range)) {
        return Err(
            "a comprehension ranges over something other than a field of `input` or a list of literals"
                .into(),
        );
    }
    let before = counts.nodes;
    walk(&c.loop_step, counts, true)?;
    let body = counts.nodes - before;
    if body > MAX_BODY_NODES {
        return Err(format!(
            "a comprehension's body has {body} nodes, and one may have at most {MAX_BODY_NODES}"
        ));
    }
    // The range is a field of `input` or literals, checked above; the rest is the macro's.
    walk(&c.iter_range, counts, false)?;
    for part in [&c.accu_init, &c.loop_cond, &c.result] {
        walk(part, counts, true)?;
    }
    Ok(())
}

/// `input`, or a field of it however deep (`input.order.lines`).
fn is_input_field(expr: &IdedExpr) -> bool {
    match &expr.expr {
        Expr::Ident(name) => name == "input",
        Expr::Select(select) if !select.test => is_input_field(&select.operand),
        _ => false,
    }
}

fn is_literal_list(expr: &IdedExpr) -> bool {
    matches!(&expr.expr, Expr::List(list) if list.elements.iter().all(|e| matches!(e.expr, Expr::Literal(_))))
}

/// A condition a reviewer starts from, covering `input` and calls like it: each number at
/// most its value, each code-like text (no spaces, at most 64 characters: an id, a currency)
/// and truth value equal to its own. Prose (a reason, a message) and nested values are left
/// out, since equal to this call's they would cover almost no other call (the reviewer adds
/// what matters); an input with nothing to compare gives `true`.
pub fn suggested(input: &Value) -> String {
    let mut parts = Vec::new();
    if let Value::Object(fields) = input {
        for (name, value) in fields {
            if !is_identifier(name) {
                continue;
            }
            match value {
                Value::Number(n) => parts.push(format!("input.{name} <= {}", cel_number(n))),
                Value::String(text) if is_prose(text) => {}
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

/// Text written for a person rather than a code: with spaces, or long.
fn is_prose(text: &str) -> bool {
    text.chars().count() > 64 || text.chars().any(char::is_whitespace)
}

/// A JSON number as a CEL double, so it compares with integers and decimals alike.
fn cel_number(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.1}"),
        Some(f) => f.to_string(),
        None => n.to_string(),
    }
}

/// Whether `name` may be written as it is after a `.` in CEL (`input.NAME`).
pub fn is_identifier(name: &str) -> bool {
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
        let why = |source: &str| Condition::compile(source).unwrap_err().to_string();
        assert!(why("  ").contains("empty"));
        assert!(why("input.amount <=").contains("not CEL"));
        assert!(Condition::compile(&"x".repeat(MAX_CONDITION + 1)).is_err());
    }

    #[test]
    fn the_suggestion_covers_its_own_call() {
        let input = json!({
            "order_id": "A-1001", "amount": 42, "full": true, "lines": [1],
            "reason": "Arrived broken", "code": "x".repeat(65),
        });
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

    /// Nested comprehensions `depth` deep over a literal list of `width` elements: each level
    /// multiplies the work by `width`.
    fn nested(depth: usize, width: usize) -> String {
        let list = format!("[{}]", vec!["1"; width].join(","));
        let mut body = "true".to_string();
        for i in (0..depth).rev() {
            body = format!("{list}.all(x{i}, {body})");
        }
        body
    }

    #[test]
    fn what_evaluating_a_condition_costs_is_bounded_when_it_is_compiled() {
        let limit = |source: &str| match Condition::compile(source) {
            Err(ConditionError::Limit(why)) => why,
            other => panic!("{source}: {other:?}"),
        };
        assert!(limit(&nested(2, 2)).contains("nests a comprehension"));
        assert!(limit(&nested(5, 10)).contains("nests a comprehension"));
        let three = "[1].all(x, x > 0) && [1].all(x, x > 0) && [1].all(x, x > 0)";
        assert!(limit(three).contains("more than 2 comprehensions"));
        assert!(limit("[input.a].all(x, x > 0)").contains("ranges over"));
        assert!(limit("input.a.all(x, x in input.b)").contains("reads `input`"));
        let long_body = format!("input.a.all(x, {})", ["x > 0"; 9].join(" && "));
        assert!(limit(&long_body).contains("body has"));
        let big = ["input.a > 0"; 40].join(" && ");
        assert!(limit(&big).contains("nodes"));
        let five = [r#"input.s.matches("^a")"#; 5].join(" && ");
        assert!(limit(&five).contains("`matches` more than 4"));
        assert!(limit(r#"input.s.matches(input.p)"#).contains("literal"));
        assert!(limit(r#"input.l.all(x, x.matches("a"))"#).contains("inside a comprehension"));
        assert!(limit(r#"input.s.matches("(a{100}){100}{100}")"#).contains("pattern"));
        let sum = ["input.l"; MAX_ADDITIONS + 2].join(" + ");
        assert!(limit(&format!("size({sum}) > 0")).contains("adds"));
        // What is within the limits works as CEL does.
        let fine = Condition::compile(
            r#"input.lines.all(l, l.amount <= 50.0) && input.tags.exists(t, t == "vip") && input.id.matches("^A-[0-9]+$")"#,
        )
        .unwrap();
        assert!(fine.matches(&json!({"lines": [{"amount": 1}], "tags": ["vip"], "id": "A-1"})));
        assert!(!fine.matches(&json!({"lines": [{"amount": 51}], "tags": ["vip"], "id": "A-1"})));
        // An input over the limit is not evaluated on: a person decides.
        let large = json!({"s": "x".repeat(MAX_INPUT)});
        assert!(matches!(
            Condition::compile("true").unwrap().check(&large),
            Err(ConditionError::Limit(_))
        ));
    }

    /// The figures of the issue: nested comprehensions ran before the limits (a non-approver
    /// held a core for 23 s with 209 bytes), and are refused when compiled now; the costliest
    /// conditions within the limits, on the largest input, are printed beside them. Figures,
    /// not assertions on time (`cargo test -p countersign-model -- --ignored --nocapture cost`).
    #[test]
    #[ignore = "figures, not a check: run with --ignored --nocapture"]
    fn cost_figures_of_nested_comprehensions_and_of_the_worst_case_within_the_limits() {
        use std::time::Instant;
        let empty = Context::with_env(ENV.clone());
        for depth in [4, 5, 6] {
            let source = nested(depth, 10);
            let program = ENV.compile(&source).unwrap();
            let started = Instant::now();
            let ran = program.execute(&empty).is_ok();
            let took = started.elapsed();
            let refused = Instant::now();
            assert!(matches!(
                Condition::compile(&source),
                Err(ConditionError::Limit(_))
            ));
            println!(
                "nested depth {depth} ({} bytes, 10^{depth} steps): before {}, now refused at compile in {:?}",
                source.len(),
                if ran {
                    format!("ran in {took:?}")
                } else {
                    format!("failed in {took:?}")
                },
                refused.elapsed()
            );
        }
        // Within the limits: two comprehensions with the largest bodies over the largest input
        // (a list of 4,000 small numbers), beside four matches of large compiled patterns.
        let items: Vec<u8> = vec![1; (MAX_INPUT - 240) / 2];
        let input = json!({"l": items, "s": "ab".repeat(100)});
        let body = ["x + 1 > 0"; 3].join(" && ");
        let pattern = r#"input.s.matches("(a|b|c|d|e|f|g|h){1,40}z")"#;
        let worst = format!(
            "input.l.filter(x, {body}).size() > 0 && input.l.map(x, {body}).size() > 0 && {}",
            [pattern; 4].join(" && ")
        );
        let started = Instant::now();
        let condition = Condition::compile(&worst).unwrap();
        let compiled = started.elapsed();
        let started = Instant::now();
        let result = condition.check(&input);
        println!(
            "worst case within the limits ({} bytes of condition, {} bytes of input): compiled in {compiled:?}, evaluated in {:?} ({result:?})",
            worst.len(),
            serde_json::to_vec(&input).unwrap().len(),
            started.elapsed()
        );
        // Without comprehensions, values can still grow: the input's list added to itself
        // (47 times within the node limit took 1.2 s in a debug build), now as often as the
        // limit on additions allows.
        let sum = |n: usize| format!("size({}) > 0", vec!["input.l"; n + 1].join(" + "));
        assert!(matches!(
            Condition::compile(&sum(MAX_ADDITIONS + 1)),
            Err(ConditionError::Limit(_))
        ));
        let condition = Condition::compile(&sum(MAX_ADDITIONS)).unwrap();
        let started = Instant::now();
        let result = condition.check(&input);
        println!(
            "the input's list added to itself {MAX_ADDITIONS} times: evaluated in {:?} ({result:?})",
            started.elapsed()
        );
    }
}
