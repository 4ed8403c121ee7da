//! Windows: running counts and sums over a tool's recent calls, which its policy's `when` reads
//! as `window.NAME`, the total with the call counted (`[tools.approval.windows.NAME]`, e.g.
//! `sum = "input.amount"`, `over = "24h"`, `by = "input.customer_id"`, and `when =
//! "window.NAME > 200.0"`), so that "$50 without anyone" does not become "$50 fifty times".
//!
//! Each call adds its share (its `sum`, or 1 for a count) to the window of its key (its `by`,
//! or one window for the tool). The share is added, atomically with reading the total of
//! every other share in the window, before the policy decides the call: the policy reads the
//! total of the calls before it and its own, and a call that runs or waits for a person has reserved its
//! share, so two calls at once cannot both slip under a limit. A call that then does not run
//! (refused, rejected, expired, cancelled) gives its share back; one that runs is counted
//! from when it ran. The totals live in Redis (`countersign_store`), one Cluster slot per
//! window and key, and survive restarts.
//!
//! When in doubt a person decides: a share that cannot be read (its `sum` or `by` fails for
//! the call, or the sum is negative or not a number) adds nothing and the call is held.

use crate::digest::sha256_hex;
use crate::policy::number_text;
use crate::span::Span;
use cel::{Context, Env, Program, Value as Cel};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A window as a policy writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowDef {
    /// CEL over the call giving the number it adds (`input.amount`); absent, each call adds 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<String>,
    /// How far back the window reaches (`1h`, `24h`, `7d`).
    pub over: Span,
    /// CEL over the call giving the key its calls are counted under (`input.customer_id`,
    /// `requester`); absent, the tool has one window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// A call's share of one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Share {
    /// The window's name in the policy.
    pub name: String,
    /// The window's key for this call, as a reviewer reads it (empty without `by`).
    pub key: String,
    /// Names the window and key in the store: the same for every call counted together.
    pub id: String,
    /// How far back the window reaches, in milliseconds.
    pub over_ms: i64,
    /// How far back, as the policy wrote it.
    pub over: String,
    /// What the call adds.
    pub amount: f64,
    /// The total of the window's other shares when this one was added (set by the store).
    #[serde(default)]
    pub before: f64,
    /// Names the call in the window (set by the store): a call held again under a new id
    /// keeps counting under the id it was first counted under until it runs.
    #[serde(default)]
    pub member: String,
}

impl Share {
    /// The share in a reviewer's words: `window refunds (24h, c-1): 170 before this call's 40`.
    pub fn told(&self) -> String {
        let key = match self.key.as_str() {
            "" => String::new(),
            key => format!(", {key}"),
        };
        format!(
            "window {} ({}{key}): {} before this call's {}",
            self.name,
            self.over,
            number_text(self.before),
            number_text(self.amount)
        )
    }
}

/// A window of one tool's policy, compiled.
pub struct Window {
    name: String,
    def: WindowDef,
    sum: Option<Program>,
    by: Option<Program>,
}

impl Window {
    /// The windows `defs` of a policy, compiled, or why one does not compile.
    pub fn compile_all(env: &Env, defs: &BTreeMap<String, WindowDef>) -> Result<Vec<Self>, String> {
        defs.iter()
            .map(|(name, def)| {
                if !crate::condition::is_identifier(name) {
                    return Err(format!(
                        "window name {name:?}: use letters, digits and _ (the policy reads it as window.{name})"
                    ));
                }
                let compile = |what: &str, src: &Option<String>| {
                    src.as_deref()
                        .map(|src| {
                            env.compile(src)
                                .map_err(|e| format!("window {name}: {what} {src:?} is not CEL: {e}"))
                        })
                        .transpose()
                };
                Ok(Self {
                    name: name.clone(),
                    sum: compile("sum", &def.sum)?,
                    by: compile("by", &def.by)?,
                    def: def.clone(),
                })
            })
            .collect()
    }

    /// This call's share of the window, or why it cannot be read. `facts` are the call's
    /// `input`, the run's `metadata` and its `requester`; `scope` names the agent and tool.
    pub fn share(&self, env: &Arc<Env>, facts: &Facts<'_>, scope: &str) -> Result<Share, String> {
        let mut ctx = Context::with_env(env.clone());
        for (name, value) in [
            ("input", facts.input),
            ("metadata", facts.metadata),
            ("requester", &Value::from(facts.requester)),
        ] {
            ctx.add_variable(name, value).map_err(|e| e.to_string())?;
        }
        let amount = match &self.sum {
            None => 1.0,
            Some(sum) => match sum.execute(&ctx) {
                Ok(value) => crate::condition::amount(value).map_err(|e| format!("its sum {e}"))?,
                Err(e) => return Err(format!("its sum could not be evaluated: {e}")),
            },
        };
        let key = match &self.by {
            None => String::new(),
            Some(by) => match by.execute(&ctx) {
                Ok(Cel::String(s)) => s.to_string(),
                Ok(Cel::Int(i)) => i.to_string(),
                Ok(Cel::UInt(u)) => u.to_string(),
                Ok(other) => {
                    return Err(format!("its key gave {other:?}, not a string or integer"));
                }
                Err(e) => return Err(format!("its key could not be evaluated: {e}")),
            },
        };
        Ok(Share {
            name: self.name.clone(),
            id: sha256_hex(format!("{scope}\n{}\n{key}", self.name))[..32].to_string(),
            key,
            over_ms: self.def.over.duration.as_millis() as i64,
            over: self.def.over.to_string(),
            amount,
            before: 0.0,
            member: String::new(),
        })
    }
}

/// What a window reads of a call.
pub struct Facts<'a> {
    /// The call's arguments.
    pub input: &'a Value,
    /// The run's metadata.
    pub metadata: &'a Value,
    /// Who requested the run ("" if nobody is named).
    pub requester: &'a str,
}

/// The totals the policy's `when` reads as `window`: each window's total with the call
/// counted, a double (`window.daily > 200.0`), so a policy asks "would this call take the
/// window past the limit" without adding the call's own number, which CEL would refuse to add
/// to a double when the input gives an integer.
pub fn totals(shares: &[Share]) -> Value {
    Value::Object(
        shares
            .iter()
            .map(|s| (s.name.clone(), Value::from(s.before + s.amount)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn window(toml_text: &str) -> Result<Vec<Window>, String> {
        let defs: BTreeMap<String, WindowDef> = toml::from_str(toml_text).unwrap();
        Window::compile_all(&Env::stdlib(), &defs)
    }

    fn share(w: &Window, input: Value) -> Result<Share, String> {
        let facts = Facts {
            input: &input,
            metadata: &json!({}),
            requester: "rick",
        };
        w.share(&Arc::new(Env::stdlib()), &facts, "till\nrefund")
    }

    #[test]
    fn a_sum_by_key_reads_the_call() {
        let w = window(
            "[refunds]\nsum = \"input.amount\"\nover = \"24h\"\nby = \"input.customer_id\"\n",
        )
        .unwrap();
        let a = share(&w[0], json!({"amount": 40, "customer_id": "c-1"})).unwrap();
        assert_eq!(
            (a.amount, a.key.as_str(), a.over_ms),
            (40.0, "c-1", 86_400_000)
        );
        let b = share(&w[0], json!({"amount": 2.5, "customer_id": "c-1"})).unwrap();
        let c = share(&w[0], json!({"amount": 2.5, "customer_id": "c-2"})).unwrap();
        assert_eq!(a.id, b.id, "one key, one window");
        assert_ne!(a.id, c.id, "another key, another window");
    }

    #[test]
    fn a_count_adds_one_and_may_be_keyed_by_the_requester() {
        let w = window("[asks]\nover = \"1h\"\nby = \"requester\"\n").unwrap();
        let s = share(&w[0], json!({})).unwrap();
        assert_eq!((s.amount, s.key.as_str()), (1.0, "rick"));
    }

    #[test]
    fn a_share_that_cannot_be_read_is_an_error_not_zero() {
        let w = window("[w]\nsum = \"input.amount\"\nover = \"1h\"\nby = \"input.c\"\n").unwrap();
        for input in [
            json!({"c": "x"}),
            json!({"amount": "40", "c": "x"}),
            json!({"amount": -40, "c": "x"}),
            json!({"amount": 40}),
            json!({"amount": 40, "c": [1]}),
        ] {
            assert!(share(&w[0], input.clone()).is_err(), "{input}");
        }
    }

    #[test]
    fn bad_windows_do_not_compile() {
        assert!(window("[w]\nsum = \"input.amount +\"\nover = \"1h\"\n").is_err());
        assert!(window("[\"a-b\"]\nover = \"1h\"\n").is_err());
        let defs: Result<BTreeMap<String, WindowDef>, _> = toml::from_str("[w]\nover = \"soon\"\n");
        assert!(defs.is_err());
    }

    #[test]
    fn the_reviewer_reads_the_total_before_the_call() {
        let w = window("[refunds]\nsum = \"input.amount\"\nover = \"24h\"\nby = \"input.c\"\n")
            .unwrap();
        let mut s = share(&w[0], json!({"amount": 40, "c": "c-1"})).unwrap();
        s.before = 170.5;
        assert_eq!(
            s.told(),
            "window refunds (24h, c-1): 170.5 before this call's 40"
        );
        assert_eq!(totals(&[s]), json!({"refunds": 210.5}));
    }
}
