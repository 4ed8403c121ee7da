//! Delegations: a person hands their approvals to another for a period (a holiday, a shift),
//! with an end. While one is active, the delegate may decide the calls held for the person who
//! delegated, in both their names (`carol for alice`), under every other rule: the delegate's
//! own role must decide, and a delegation never lets anyone approve their own request (the
//! requester check is the delegate's, see [`crate::authority::deciding_for`]). It may be ended
//! early by either of them or an admin; from the answer on, nothing is decided under it (each
//! decision takes a use of it first, atomic with ending it, as a standing grant's use is).

use crate::span::Span;
use serde::{Deserialize, Serialize};

/// The longest a delegation may last.
pub const MAX_DURATION_SECS: u64 = 90 * 86400;

/// A delegation as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Delegation {
    /// `dlg_` and 24 hex digits.
    pub id: String,
    /// The person whose approvals are handed over.
    pub from: String,
    /// The person who may decide in their place.
    pub to: String,
    /// Why, in the words of whoever made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who made it: `from` themselves, or an admin.
    pub created_by: String,
    /// When it was made (ms since the epoch, Redis's clock): it starts then.
    pub created_at: i64,
    /// When it ends by itself (ms since the epoch).
    pub ends_at: i64,
    /// Set once someone ended it early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Ended>,
}

/// Who ended a delegation early, when and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ended {
    /// The principal who ended it.
    pub by: String,
    /// When (ms since the epoch, Redis's clock).
    pub at: i64,
    /// Why, in their words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One call decided under a delegation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DelegationUse {
    /// The run of the call.
    pub run_id: String,
    /// The call decided.
    pub call_id: String,
    /// When the use was taken (ms, Redis's clock): before any end of the delegation.
    pub at: i64,
}

/// How a delegation stands at a moment; only an active one lets its delegate decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DelegationStatus {
    /// Its delegate decides in its maker's place.
    Active,
    /// Someone ended it early.
    Ended,
    /// Its end has come.
    Expired,
}

/// What a request to delegate asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegationTerms {
    /// The person whose approvals are handed over; absent, the person asking.
    #[serde(default)]
    pub from: Option<String>,
    /// The person who may decide in their place.
    pub to: String,
    /// For how long from now (`8h`, `14d`), at most 90 days.
    #[serde(rename = "for")]
    pub lasts: Span,
    /// Why.
    #[serde(default)]
    pub reason: Option<String>,
}

impl Delegation {
    /// A new delegation's id.
    pub fn new_id() -> String {
        format!("dlg_{}", &uuid::Uuid::new_v4().simple().to_string()[..24])
    }

    /// How it stands at `now_ms`.
    pub fn status(&self, now_ms: i64) -> DelegationStatus {
        if self.ended.is_some() {
            DelegationStatus::Ended
        } else if now_ms >= self.ends_at {
            DelegationStatus::Expired
        } else {
            DelegationStatus::Active
        }
    }

    /// The name a decision under it is recorded in: both people, `carol for alice`.
    pub fn decider_name(&self) -> String {
        format!("{} for {}", self.to, self.from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delegation() -> Delegation {
        Delegation {
            id: Delegation::new_id(),
            from: "alice".into(),
            to: "carol".into(),
            reason: None,
            created_by: "alice".into(),
            created_at: 1_000,
            ends_at: 2_000,
            ended: None,
        }
    }

    #[test]
    fn it_is_active_until_it_ends_or_is_ended() {
        let mut d = delegation();
        assert!(d.id.starts_with("dlg_") && d.id.len() == 28);
        assert_eq!(d.status(1_500), DelegationStatus::Active);
        assert_eq!(d.status(2_000), DelegationStatus::Expired);
        d.ended = Some(Ended {
            by: "alice".into(),
            at: 1_200,
            reason: None,
        });
        assert_eq!(d.status(1_500), DelegationStatus::Ended);
        assert_eq!(d.decider_name(), "carol for alice");
    }

    #[test]
    fn terms_read_for_as_a_span() {
        let terms: DelegationTerms =
            serde_json::from_str(r#"{"to": "carol", "for": "14d", "reason": "holiday"}"#).unwrap();
        assert_eq!(terms.lasts.duration.as_secs(), 14 * 86400);
        assert!(serde_json::from_str::<DelegationTerms>(r#"{"to": "carol"}"#).is_err());
    }
}
