//! The audit trail: every request, notification, decision, execution and end of a run,
//! appended to a hash chain per run by the same script that makes the change it records, and
//! sent from there (through the outbox) to the global log, the `AUDIT` JetStream stream.
//! Each stored element is `{"prev", "hash", "entry"}` where `hash` is the SHA-256 of the 32
//! bytes of `prev` followed by the 32 bytes of `sha256(canonical(entry))` (the first element's
//! `prev` is empty), so editing, inserting or deleting any element of a run's chain breaks it
//! from that point on. Refused decisions are kept apart, in a capped list per run, so a flood
//! of them can neither delay a decision nor grow the trail.
//!
//! An executed call's entry keeps the receipt the call carried (`detail.receipt`, a bearer
//! token for its tool until it expires). Only admins see it: for anyone else the element is
//! shown [`withholding_receipt`]: the receipt replaced by `{"withheld": true}` and the
//! digest of the entry as stored in `entry_sha256`, which [`verify`] takes in place of the
//! entry's own, so the chain still verifies link by link. What such an entry says besides is
//! then vouched for by whoever served it, not by the chain.

use crate::digest::{canonical_json, pre_jcs_canonical_json, sha256_hex};
use crate::run::RunId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What an audit entry records; `kind` in snake_case on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// A call was held for a person.
    Requested,
    /// A channel was told about it.
    Notified,
    /// A decision (or one approval of a quorum) was recorded.
    Decided,
    /// A held call was run (or its outcome was found unknown); for a call released to an
    /// external agent, the agent reported how its run ended.
    Executed,
    /// An external agent claimed a call released to it, before running it itself.
    Started,
    /// A held call's deadline passed with no decision.
    Expired,
    /// A held call's deadline passed and more approvers were asked.
    Escalated,
    /// A held call's approvers were reminded.
    Reminded,
    /// A call held or decided under a policy that has changed since was checked again
    /// (`detail.outcome`: `released`, `reheld`, `refused` or `superseded`).
    PolicyChanged,
    /// A tool's shadow policy sorted a call differently from its live one (`detail`: the
    /// outcome, what each did).
    PolicyShadow,
    /// A tool's reviewer model gave its verdict on a held call (`detail`: the verdict, its
    /// reason, the model, the envelope, the mode, what it took). Written `reviewer_shadow`
    /// before reviewers could be live.
    #[serde(alias = "reviewer_shadow")]
    ReviewerVerdict,
    /// Someone asked to cancel the run.
    CancelRequested,
    /// The run completed with the model's answer.
    Completed,
    /// The run failed.
    Failed,
    /// The run was cancelled.
    Cancelled,
}

/// One entry of a run's audit trail: what happened, to which call, who did it and through what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When, in milliseconds since the epoch.
    pub at: i64,
    /// The run it is about.
    pub run_id: RunId,
    /// What happened.
    pub kind: AuditKind,
    /// The call it is about, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// Who acted: a principal, or the worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// Where it happened: the door a decision came through, or the channel a call was
    /// announced to (`channel` on the wire, which the chain's hashes cover).
    #[serde(default, rename = "channel", skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// The digest of what the actor was shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// What else the kind records (the receipt of an executed call, a refusal's reason...);
    /// `null` when nothing.
    #[serde(default)]
    pub detail: Value,
}

impl AuditEntry {
    /// An entry of `kind` about `run_id` made now, everything else empty.
    pub fn new(run_id: &RunId, kind: AuditKind) -> Self {
        Self {
            at: crate::now_ms(),
            run_id: run_id.clone(),
            kind,
            call_id: None,
            actor: None,
            via: None,
            digest: None,
            detail: Value::Null,
        }
    }
}

/// An entry as the scripts take it: its canonical JSON and that text's SHA-256.
pub fn prepare(entry: &AuditEntry) -> (String, String) {
    let value = serde_json::to_value(entry).expect("audit entries serialize");
    let text = canonical_json(&value);
    let sha = sha256_hex(&text);
    (text, sha)
}

/// The link after `prev` for an entry whose canonical JSON hashes to `entry_sha`.
pub fn link(prev: &str, entry_sha: &str) -> String {
    let mut bytes = hex::decode(prev).unwrap_or_default();
    bytes.extend(hex::decode(entry_sha).unwrap_or_default());
    sha256_hex(bytes)
}

/// Checks a chain of stored elements; `Err(i)` names the first element that does not fit.
/// An element whose receipt is withheld ([`withholding_receipt`]) fits by its
/// `entry_sha256`.
pub fn verify(elements: &[Value]) -> Result<(), usize> {
    let mut prev = String::new();
    for (i, element) in elements.iter().enumerate() {
        let (Some(p), Some(hash)) = (element["prev"].as_str(), element["hash"].as_str()) else {
            return Err(i);
        };
        if p != prev || stored_sha(element).is_none() {
            return Err(i);
        }
        prev = hash.to_string();
    }
    Ok(())
}

/// The SHA-256 of an element's entry as it was stored, if it fits the element's link: of
/// its canonical form (or of the older form entries written before the canonical form became
/// RFC 8785 hashed), or its `entry_sha256` when its receipt is withheld.
fn stored_sha(element: &Value) -> Option<String> {
    let (p, hash) = (element["prev"].as_str()?, element["hash"].as_str()?);
    let entry = &element["entry"];
    let candidates = match element.get("entry_sha256") {
        Some(sha) if entry["detail"]["receipt"] == withheld() => vec![sha.as_str()?.to_string()],
        Some(_) => return None,
        None => vec![
            sha256_hex(canonical_json(entry)),
            sha256_hex(pre_jcs_canonical_json(entry)),
        ],
    };
    candidates.into_iter().find(|sha| link(p, sha) == hash)
}

/// What a receipt kept in an entry shows to whoever may not see it.
pub fn withheld() -> Value {
    serde_json::json!({"withheld": true})
}

/// A stored chain element as shown to a key that may not see receipts: an entry that keeps
/// one (a string in `detail.receipt`) has it replaced by [`withheld`], and the element gets
/// `entry_sha256`, the digest of the entry as stored, so that [`verify`] still checks the
/// chain. An element that does not fit its link is left as it is, for [`verify`] to report.
pub fn withholding_receipt(mut element: Value) -> Value {
    if !element["entry"]["detail"]["receipt"].is_string() {
        return element;
    }
    if let Some(sha) = stored_sha(&element) {
        element["entry"]["detail"]["receipt"] = withheld();
        element["entry_sha256"] = sha.into();
    }
    element
}

/// A refused decision as shown to a key that may not see receipts: a refusal of a call
/// decided already keeps the decision that stands in `detail` (JSON text), whose receipt is
/// replaced by [`withheld`].
pub fn refusal_withholding_receipt(mut refusal: Value) -> Value {
    let Some(detail) = refusal["detail"].as_str() else {
        return refusal;
    };
    let Ok(mut decision) = serde_json::from_str::<Value>(detail) else {
        return refusal;
    };
    if decision["receipt"].is_string() {
        decision["receipt"] = withheld();
        refusal["detail"] = decision.to_string().into();
    }
    refusal
}

impl AuditEntry {
    /// The entry with the receipt it keeps, if any, replaced by [`withheld`]: for pages
    /// people read, which never show a receipt.
    pub fn without_receipt(mut self) -> Self {
        if self.detail["receipt"].is_string() {
            self.detail["receipt"] = withheld();
        }
        self
    }
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
                let (text, sha) = prepare(&e);
                let hash = link(&prev, &sha);
                let element = serde_json::json!({
                    "prev": prev, "hash": hash,
                    "entry": serde_json::from_str::<Value>(&text).unwrap(),
                });
                prev = hash;
                element
            })
            .collect()
    }

    #[test]
    fn a_chain_verifies_with_its_receipts_withheld_and_not_once_a_withheld_entry_is_forged() {
        let mut chain = entries(3);
        chain[1]["entry"]["detail"] = serde_json::json!({"receipt": "eyJ.a.b"});
        let (_, sha) = prepare(&serde_json::from_value(chain[1]["entry"].clone()).unwrap());
        chain[1]["hash"] = link(chain[1]["prev"].as_str().unwrap(), &sha).into();
        chain[2]["prev"] = chain[1]["hash"].clone();
        let (_, sha) = prepare(&serde_json::from_value(chain[2]["entry"].clone()).unwrap());
        chain[2]["hash"] = link(chain[2]["prev"].as_str().unwrap(), &sha).into();
        assert_eq!(verify(&chain), Ok(()));

        let shown: Vec<Value> = chain.into_iter().map(withholding_receipt).collect();
        assert_eq!(shown[1]["entry"]["detail"]["receipt"], withheld());
        assert_eq!(
            shown[1]["entry_sha256"],
            sha256_hex(canonical_json(&{
                let mut e = shown[1]["entry"].clone();
                e["detail"]["receipt"] = "eyJ.a.b".into();
                e
            }))
        );
        assert!(shown[0].get("entry_sha256").is_none());
        assert_eq!(verify(&shown), Ok(()));

        // A digest that is not the stored entry's, or one on an entry not withheld, breaks it.
        let mut forged = shown.clone();
        forged[1]["entry_sha256"] = sha256_hex("another entry").into();
        assert_eq!(verify(&forged), Err(1));
        let mut forged = shown;
        forged[0]["entry_sha256"] = forged[1]["entry_sha256"].clone();
        assert_eq!(verify(&forged), Err(0));
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

    #[test]
    fn a_chain_written_before_rfc_8785_still_verifies() {
        let run = RunId::parse("run_1").unwrap();
        let mut e = AuditEntry::new(&run, AuditKind::Decided);
        e.detail = serde_json::json!({"input": {"amount": 129.0}});
        let value = serde_json::to_value(&e).unwrap();
        let old = pre_jcs_canonical_json(&value);
        assert_ne!(old, canonical_json(&value));
        let hash = link("", &sha256_hex(&old));
        let element = serde_json::json!({"prev": "", "hash": hash, "entry": value});
        assert_eq!(verify(std::slice::from_ref(&element)), Ok(()));
        let mut edited = element;
        edited["entry"]["detail"]["input"]["amount"] = 1290.0.into();
        assert_eq!(verify(&[edited]), Err(0));
    }
}
