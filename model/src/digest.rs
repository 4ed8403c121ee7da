//! Canonical JSON and the digest that binds a decision to exactly what the reviewer saw.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The RFC 8785 (JSON Canonicalization Scheme) form of a value: keys sorted by UTF-16 code
/// units at every level, numbers as ECMAScript prints them (`129.0` is `129`), no white
/// space. Anyone can recompute it with a JCS library, in any language.
pub fn canonical_json(value: &Value) -> String {
    serde_json_canonicalizer::to_string(value).expect("JSON values serialize")
}

/// The canonical form before RFC 8785 (keys sorted by code point, numbers as serde_json
/// prints them, so `129.0` stays `129.0`). Kept only so audit chains written before the
/// change still verify; nothing new is written in it.
pub fn pre_jcs_canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_pre_jcs(value, &mut out);
    out
}

fn write_pre_jcs(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_pre_jcs(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_pre_jcs(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The largest integer RFC 8785 writes exactly: JCS reads every number as an IEEE 754
/// double, so past ±(2^53 − 1) two integers can share one canonical form (9007199254740993
/// is written 9007199254740992), and a digest would not tell them apart.
pub const MAX_EXACT_INTEGER: u64 = (1 << 53) - 1;

/// The first integer in `value` that its canonical form would not write exactly (past
/// ±[`MAX_EXACT_INTEGER`]), with where it is (`input.account`, `input.lines[2]`): such a
/// value is not held for a person nor taken in an edit, since the digest they decide on
/// would not bind it. Numbers with a fraction or an exponent are doubles already, and
/// written as such.
pub fn inexact_integer(value: &Value) -> Option<(String, serde_json::Number)> {
    fn find(value: &Value, path: &mut String) -> Option<(String, serde_json::Number)> {
        match value {
            Value::Number(n) => {
                let exact = match (n.as_u64(), n.as_i64()) {
                    (Some(u), _) => u <= MAX_EXACT_INTEGER,
                    (None, Some(i)) => i.unsigned_abs() <= MAX_EXACT_INTEGER,
                    (None, None) => true,
                };
                (!exact).then(|| (path.clone(), n.clone()))
            }
            Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                let found = find(item, path);
                path.truncate(len);
                found
            }),
            Value::Object(fields) => fields.iter().find_map(|(name, item)| {
                let len = path.len();
                path.push('.');
                path.push_str(name);
                let found = find(item, path);
                path.truncate(len);
                found
            }),
            _ => None,
        }
    }
    find(value, &mut "input".to_string())
}

/// Lowercase hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex::encode(Sha256::digest(bytes.as_ref()))
}

/// The digest of one gated call: its run, tool name, canonical input and the policy version
/// in force. A decision must quote it; if any of them changes, old decisions no longer match,
/// and no decision made for one run can match a call of another.
pub fn call_digest(run: &str, tool: &str, input: &Value, policy_version: &str) -> String {
    let bound = serde_json::json!({
        "run": run, "tool": tool, "input": input, "policy": policy_version,
    });
    format!("sha256:{}", sha256_hex(canonical_json(&bound)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_change_the_canonical_form() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,2],"x":"s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#).unwrap();
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(canonical_json(&a), r#"{"a":{"x":"s","y":[1,2]},"b":1}"#);
    }

    #[test]
    fn the_canonical_form_is_rfc_8785() {
        // RFC 8785 section 3.2.4's example: numbers in ECMAScript's form, string escapes.
        let input: Value = serde_json::from_str(
            r#"{
              "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
              "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
              "literals": [null, true, false]
            }"#,
        )
        .unwrap();
        assert_eq!(
            canonical_json(&input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
        // Section 3.2.3's sorting example: by UTF-16 code units, so the emoji (a surrogate
        // pair, 0xD83D...) comes before U+FB33, though its code point is larger.
        let keys: Value = serde_json::from_str(
            r#"{"\u20ac": 1, "\r": 2, "\ufb33": 3, "1": 4, "\ud83d\ude00": 5, "\u0080": 6, "\u00f6": 7}"#,
        )
        .unwrap();
        assert_eq!(
            canonical_json(&keys),
            "{\"\\r\":2,\"1\":4,\"\u{80}\":6,\"\u{f6}\":7,\"\u{20ac}\":1,\"\u{1f600}\":5,\"\u{fb33}\":3}"
        );
        // 129 and 129.0 are one number.
        assert_eq!(canonical_json(&json!({"a": 129.0})), r#"{"a":129}"#);
        assert_eq!(
            call_digest("r", "t", &json!({"a": 129.0}), "p"),
            call_digest("r", "t", &json!({"a": 129}), "p")
        );
    }

    #[test]
    fn integers_past_two_to_the_53_are_found_where_they_are() {
        let max = MAX_EXACT_INTEGER;
        assert_eq!(
            inexact_integer(&json!({"a": max, "b": -(max as i64), "c": 1e300})),
            None
        );
        let (at, n) = inexact_integer(&json!({"a": 1, "b": [0, {"c": max + 2}]})).unwrap();
        assert_eq!(
            (at.as_str(), n.to_string()),
            ("input.b[1].c", "9007199254740993".into())
        );
        assert!(inexact_integer(&json!({"a": -(max as i64) - 1})).is_some());
        // Why: two integers, one canonical form.
        assert_eq!(
            canonical_json(&json!(max + 2)),
            canonical_json(&json!(max + 1))
        );
    }

    #[test]
    fn the_canonical_form_before_rfc_8785_is_kept_for_old_chains() {
        assert_eq!(
            pre_jcs_canonical_json(&json!({"b": 129.0, "a": 1})),
            r#"{"a":1,"b":129.0}"#
        );
    }

    #[test]
    fn the_digest_changes_with_run_tool_input_or_policy() {
        let input = json!({"amount": 129});
        let base = call_digest("r1", "refund", &input, "p1");
        assert_eq!(
            base,
            call_digest("r1", "refund", &json!({"amount": 129}), "p1")
        );
        assert_ne!(base, call_digest("r2", "refund", &input, "p1"));
        assert_ne!(
            base,
            call_digest("r1", "refund", &json!({"amount": 49}), "p1")
        );
        assert_ne!(base, call_digest("r1", "refund2", &input, "p1"));
        assert_ne!(base, call_digest("r1", "refund", &input, "p2"));
    }
}
