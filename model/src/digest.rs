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
