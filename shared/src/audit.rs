//! The audit trail: every request, decision (accepted or refused), execution and end of a
//! run, appended to a hash chain per run and copied to a global log. Each stored element is
//! `{"prev", "hash", "entry"}` where `hash = sha256(prev + "\n" + canonical(entry))`, so
//! editing, inserting or deleting any element of a run's chain breaks it from that point on.

use crate::digest::{canonical_json, sha256_hex};
use crate::run::RunId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// A call was held for a person.
    Requested,
    /// A channel was told about it.
    Notified,
    /// A decision (or one approval of a quorum) was recorded.
    Decided,
    /// A decision was refused; `detail.why` says why.
    Refused,
    /// A held call was run (or its outcome was found unknown).
    Executed,
    /// A held call's deadline passed with no decision.
    Expired,
    /// A held call's deadline passed and more approvers were asked.
    Escalated,
    /// A held call's approvers were reminded.
    Reminded,
    Completed,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: i64,
    pub run_id: RunId,
    pub kind: AuditKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// Who acted: a principal, or the worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The digest of what the actor was shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default)]
    pub detail: Value,
}

impl AuditEntry {
    pub fn new(run_id: &RunId, kind: AuditKind) -> Self {
        Self {
            at: crate::now_ms(),
            run_id: run_id.clone(),
            kind,
            call_id: None,
            actor: None,
            channel: None,
            digest: None,
            detail: Value::Null,
        }
    }
}

/// The hash of an entry chained after `prev`.
pub fn chain_hash(prev: &str, entry: &Value) -> String {
    sha256_hex(format!("{prev}\n{}", canonical_json(entry)))
}

/// The stored element for an entry chained after `prev`.
pub fn chain(prev: &str, entry: &AuditEntry) -> Value {
    let entry = serde_json::to_value(entry).expect("audit entries serialize");
    serde_json::json!({ "prev": prev, "hash": chain_hash(prev, &entry), "entry": entry })
}

/// Checks a chain of stored elements; `Err(i)` names the first element that does not fit.
pub fn verify(elements: &[Value]) -> Result<(), usize> {
    let mut prev = String::new();
    for (i, element) in elements.iter().enumerate() {
        let (Some(p), Some(hash)) = (element["prev"].as_str(), element["hash"].as_str()) else {
            return Err(i);
        };
        if p != prev || chain_hash(p, &element["entry"]) != hash {
            return Err(i);
        }
        prev = hash.to_string();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: usize) -> Vec<Value> {
        let run = RunId::parse("run_1").unwrap();
        let mut prev = String::new();
        (0..n)
            .map(|i| {
                let mut e = AuditEntry::new(&run, AuditKind::Decided);
                e.actor = Some(format!("p{i}"));
                let element = chain(&prev, &e);
                prev = element["hash"].as_str().unwrap().to_string();
                element
            })
            .collect()
    }

    #[test]
    fn an_intact_chain_verifies() {
        assert_eq!(verify(&entries(3)), Ok(()));
    }

    #[test]
    fn an_edited_removed_or_reordered_entry_is_found() {
        let mut edited = entries(3);
        edited[1]["entry"]["actor"] = "mallory".into();
        assert_eq!(verify(&edited), Err(1));
        let mut removed = entries(3);
        removed.remove(1);
        assert_eq!(verify(&removed), Err(1));
        let mut swapped = entries(3);
        swapped.swap(0, 2);
        assert_eq!(verify(&swapped), Err(0));
    }
}
