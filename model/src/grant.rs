//! Standing grants: a decision that approves, in advance, calls like the one in front of the
//! reviewer. A grant names the agent and tool, the tool's policy version it was made under (a
//! changed policy voids it), a condition on the input ([`crate::condition`]), optionally the
//! requester its calls must come from, a number of uses and an expiry. It is created by
//! approving a held call with [`GrantTerms`], by everyone that call's approval needs, and each
//! later call it covers is decided by the decision script in their names, `under grant`.

use crate::span::Span;
use serde::{Deserialize, Serialize};

/// The longest a grant may last, whatever the policy says.
pub const MAX_DURATION_SECS: u64 = 30 * 86400;

/// What a reviewer asks for when they approve a call and allow calls like it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantTerms {
    /// CEL over `input`: the calls covered. It must cover the call it is made on.
    pub condition: String,
    /// Only calls of runs requested by the same requester as this one.
    #[serde(default)]
    pub same_requester: bool,
    /// How many later calls it may approve.
    pub max_uses: u32,
    /// How long it lasts from when it is made (`30m`, `8h`, `7d`).
    pub expires_in: Span,
    /// A cap on what the calls it approves may add up to, besides their number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<GrantTotal>,
}

/// A cap on what a grant's calls add up to: `{"sum": "input.amount", "max": 500}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantTotal {
    /// CEL over `input` giving what each call adds (a number of at least 0), within the
    /// bounds of a condition ([`crate::condition`]).
    pub sum: String,
    /// The most the calls it approves may add up to.
    pub max: f64,
}

impl GrantTerms {
    /// The digest two approvals of a quorum must share for their grant to be made.
    pub fn digest(&self) -> String {
        let value = serde_json::to_value(self).unwrap_or_default();
        crate::digest::sha256_hex(crate::digest::canonical_json(&value))
    }
}

/// A grant as stored: what it covers, who made it, and how it stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    /// `grt_` and 24 hex digits, from the run and call it was made on: one call, one grant.
    pub id: String,
    /// The agent whose calls it covers.
    pub agent: String,
    /// The tool whose calls it covers.
    pub tool: String,
    /// The tool's policy version when it was made: calls held under another are not covered.
    pub policy_version: String,
    /// CEL over `input`: the calls covered (see [`crate::condition`]).
    pub condition: String,
    /// The requester every covered call's run must have, when the grant is so limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester: Option<String>,
    /// How many calls it may approve before it is used up.
    pub max_uses: u32,
    /// Everyone whose approval made it, sorted. It approves nothing once one of them is no
    /// longer someone the configuration knows with a role that decides
    /// ([`crate::authority::grant_stands`]).
    pub granted_by: Vec<String>,
    /// The door the (last) approval came through.
    pub channel: String,
    /// The run of the call it was made on.
    pub run_id: String,
    /// The call it was made on.
    pub call_id: String,
    /// Who requested the run it was made on: whoever may read that run may read the grant
    /// ([`crate::authority::may_read_grant`]). Absent on grants made before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_requested_by: Option<String>,
    /// When it was made, in milliseconds since the epoch.
    pub created_at: i64,
    /// When it stops approving, in milliseconds since the epoch.
    pub expires_at: i64,
    /// Uses so far (the store counts them).
    #[serde(default)]
    pub uses: u32,
    /// The cap on what its calls add up to, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<GrantTotal>,
    /// What the calls it approved added up to (the store counts it), with a `total`.
    #[serde(default)]
    pub spent: f64,
    /// Set once someone revoked it; it approves nothing more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<Revocation>,
}

/// Who revoked a grant, when and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Revocation {
    /// The principal who revoked it.
    pub by: String,
    /// When, in milliseconds since the epoch.
    pub at: i64,
    /// Why, in their words; `None` when they gave no reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How a grant stands at a moment (see [`Grant::status`]); only an active one approves calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantStatus {
    /// It approves the calls it covers.
    Active,
    /// It has approved as many calls as `max_uses` allows.
    UsedUp,
    /// Its `expires_at` has passed.
    Expired,
    /// Someone revoked it.
    Revoked,
    /// A maker is no longer someone the configuration knows with a role that decides
    /// ([`crate::authority::grant_stands`]): it approves nothing while that lasts.
    MakerGone,
}

/// One call a grant approved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GrantUse {
    /// The run of the call.
    pub run_id: String,
    /// The call approved.
    pub call_id: String,
    /// The call's digest, as the decision quoted it.
    pub digest: String,
    /// When, in milliseconds since the epoch.
    pub at: i64,
    /// What it added to the grant's total, with one.
    #[serde(default)]
    pub amount: f64,
}

impl Grant {
    /// The grant's id for the call `call_id` of run `run_id`.
    pub fn id_for(run_id: &str, call_id: &str) -> String {
        let hash = crate::digest::sha256_hex(format!("{run_id}\n{call_id}"));
        format!("grt_{}", &hash[..24])
    }

    /// How the grant stands at `now_ms`, `makers_stand` saying whether its makers still may
    /// make it ([`crate::authority::grant_stands`]). An ending for good (revoked, expired,
    /// used up) is told before a maker gone, which a restored configuration undoes.
    pub fn status(&self, now_ms: i64, makers_stand: bool) -> GrantStatus {
        if self.revoked.is_some() {
            GrantStatus::Revoked
        } else if now_ms >= self.expires_at {
            GrantStatus::Expired
        } else if self.uses >= self.max_uses {
            GrantStatus::UsedUp
        } else if !makers_stand {
            GrantStatus::MakerGone
        } else {
            GrantStatus::Active
        }
    }

    /// Who a decision under this grant names: `alice, under grant grt_…`.
    pub fn decided_by(&self) -> String {
        format!("{}, under grant {}", self.granted_by.join(", "), self.id)
    }

    /// The people a decision's `decided_by` names: its grant's makers for one made under a
    /// grant ([`Grant::decided_by`]), else the decider as named.
    pub fn people_of(decided_by: &str) -> Vec<&str> {
        match decided_by.split_once(", under grant ") {
            Some((makers, _)) => makers.split(", ").collect(),
            None => vec![decided_by],
        }
    }

    /// Whether the grant is about `held` (its condition and its uses are checked apart: see
    /// [`crate::condition`] and the store). Never about the call it was made on, which its
    /// making decided.
    pub fn is_for(&self, held: &Held<'_>) -> bool {
        (self.run_id != held.run_id || self.call_id != held.call_id)
            && self.agent == held.agent
            && self.tool == held.tool
            && self.policy_version == held.policy_version
            && self
                .requester
                .as_deref()
                .is_none_or(|r| Some(r) == held.requester)
    }
}

/// A held call as a grant is matched against it.
#[derive(Clone, Copy, Debug)]
pub struct Held<'a> {
    /// The agent of the call's run.
    pub agent: &'a str,
    /// The call's run.
    pub run_id: &'a str,
    /// Who requested the run.
    pub requester: Option<&'a str>,
    /// The call's id in its run.
    pub call_id: &'a str,
    /// The tool called.
    pub tool: &'a str,
    /// The tool's policy version the call was held under.
    pub policy_version: &'a str,
}

/// What a policy allows of grants on one tool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GrantLimits {
    /// Whether the policy allows grants at all (its `grants`).
    pub allowed: bool,
    /// The most uses a grant may have (its `grant_max_uses`).
    pub max_uses: u32,
    /// The longest a grant may last, in seconds: its `grant_max_duration`, never more than
    /// [`MAX_DURATION_SECS`].
    pub max_duration_secs: u64,
}

impl GrantLimits {
    /// Why `terms` are not allowed, in a reviewer's words.
    pub fn check(&self, terms: &GrantTerms) -> Result<(), String> {
        if !self.allowed {
            return Err("the policy does not allow grants for this tool (grants = false)".into());
        }
        if terms.max_uses == 0 || terms.max_uses > self.max_uses {
            return Err(format!(
                "max_uses must be 1 to {} for this tool",
                self.max_uses
            ));
        }
        if let Some(total) = &terms.total
            && !(total.max.is_finite() && total.max > 0.0)
        {
            return Err("total.max must be a number above 0".into());
        }
        if terms.expires_in.duration.as_secs() > self.max_duration_secs {
            return Err(format!(
                "expires_in may be at most {}s for this tool",
                self.max_duration_secs
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn grant(requester: Option<&str>) -> Grant {
        Grant {
            id: Grant::id_for("run_1", "c1"),
            agent: "refunds".into(),
            tool: "issue_refund".into(),
            policy_version: "v1".into(),
            condition: "true".into(),
            requester: requester.map(str::to_string),
            max_uses: 2,
            granted_by: vec!["alice".into(), "bob".into()],
            channel: "api".into(),
            run_id: "run_1".into(),
            call_id: "c1".into(),
            run_requested_by: Some("rick".into()),
            created_at: 0,
            expires_at: 1000,
            uses: 0,
            total: None,
            spent: 0.0,
            revoked: None,
        }
    }

    const HELD: Held = Held {
        agent: "refunds",
        run_id: "run_2",
        requester: Some("rick"),
        call_id: "c2",
        tool: "issue_refund",
        policy_version: "v1",
    };

    #[test]
    fn a_grant_is_for_its_agent_tool_policy_version_and_requester_only() {
        let open = grant(None);
        assert!(open.is_for(&HELD));
        assert!(!open.is_for(&Held {
            agent: "other",
            ..HELD
        }));
        assert!(!open.is_for(&Held {
            tool: "cancel_order",
            ..HELD
        }));
        // A changed policy ends the grants made under the old one.
        assert!(!open.is_for(&Held {
            policy_version: "v2",
            ..HELD
        }));
        let scoped = grant(Some("rick"));
        assert!(scoped.is_for(&HELD));
        assert!(!scoped.is_for(&Held {
            requester: Some("carol"),
            ..HELD
        }));
        assert!(!scoped.is_for(&Held {
            requester: None,
            ..HELD
        }));
        // The call it was made on was decided by its making.
        let origin = Held {
            run_id: "run_1",
            call_id: "c1",
            ..HELD
        };
        assert!(!open.is_for(&origin));
        assert!(open.is_for(&Held {
            run_id: "run_2",
            ..origin
        }));
    }

    #[test]
    fn a_grant_stands_until_revoked_used_up_or_expired() {
        let mut g = grant(None);
        assert_eq!(g.status(999, true), GrantStatus::Active);
        assert_eq!(g.status(999, false), GrantStatus::MakerGone);
        assert_eq!(g.status(1000, true), GrantStatus::Expired);
        assert_eq!(g.status(1000, false), GrantStatus::Expired);
        g.uses = 2;
        assert_eq!(g.status(0, true), GrantStatus::UsedUp);
        g.revoked = Some(Revocation {
            by: "bob".into(),
            at: 1,
            reason: None,
        });
        assert_eq!(g.status(0, true), GrantStatus::Revoked);
        assert_eq!(g.decided_by(), format!("alice, bob, under grant {}", g.id));
        assert_eq!(Grant::people_of(&g.decided_by()), ["alice", "bob"]);
        assert_eq!(Grant::people_of("carol"), ["carol"]);
    }

    #[test]
    fn limits_refuse_what_the_policy_does_not_allow() {
        let terms = |uses, span: &str| GrantTerms {
            condition: "true".into(),
            same_requester: false,
            max_uses: uses,
            expires_in: serde_json::from_value(json!(span)).unwrap(),
            total: None,
        };
        let limits = GrantLimits {
            allowed: true,
            max_uses: 10,
            max_duration_secs: 3600,
        };
        assert!(limits.check(&terms(10, "1h")).is_ok());
        assert!(limits.check(&terms(0, "1h")).is_err());
        assert!(limits.check(&terms(11, "1h")).is_err());
        assert!(limits.check(&terms(1, "2h")).is_err());
        let closed = GrantLimits {
            allowed: false,
            ..limits
        };
        assert!(
            closed
                .check(&terms(1, "1m"))
                .unwrap_err()
                .contains("grants = false")
        );
    }
}
