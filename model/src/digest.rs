//! Canonical JSON and the digest that binds a decision to exactly what the reviewer saw.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// JSON with object keys sorted at every level and no insignificant white space, so the
/// same value always gives the same bytes whatever order its keys arrived in.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
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
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
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
