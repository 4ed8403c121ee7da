//! Deciding held calls through `lua/decide.lua`, the one place a decision becomes true.

use super::{Announcement, Chain, Store, StoreError, event, from_json, to_json};
use crate::script::{self, Argv};
use countersign_model::audit::AuditEntry;
use countersign_model::events::Event;
use countersign_model::grant::Grant;
pub use countersign_model::refusal::RefusalCode;
use countersign_model::run::{Decision, RunId};
use countersign_runtime::names::msg_id;
use redis::ScriptInvocation;
use serde::{Deserialize, Serialize};

/// One decision of a request, with its audit entry.
pub struct Proposal {
    /// The decision to record.
    pub decision: Decision,
    /// For an edit: the digest of the held call its input was checked against (the tool's
    /// schema), or None if it could not be checked; the script refuses an edit checked
    /// against anything but the call it decides.
    pub checked_digest: Option<String>,
    /// The audit entry recorded with it.
    pub entry: AuditEntry,
    /// Everyone the decision's receipt (in `decision.receipt`) names, sorted and joined with
    /// ", "; empty without one. The script refuses a receipt that does not name exactly who
    /// the recorded decision will (a quorum another approval completed in between).
    pub receipt_for: String,
}

/// The decisions of one request, all by one principal through one door.
pub struct DecideRequest<'a> {
    /// Who the decision is recorded as made by.
    pub principal: &'a str,
    /// The door it came through (`api`, `web`, `slack`, `email`, `webhook`, `grant`,
    /// `deadline`, `policy`).
    pub door: &'a str,
    /// Who decides: a person, a reviewer model, or (no approver checks) the deadline or a
    /// policy change.
    pub by: DecisionSource,
    /// The email link used, as (token hash, the grant it stored): spent with the decision.
    pub link: Option<(&'a str, &'a str)>,
    /// Whether the principal's role decides (`authority::Role::decides`), which only the
    /// gateway's configuration knows; the script refuses everything else.
    pub role_decides: bool,
    /// Whether the gateway signs receipts: then a decision that lets a call run must carry
    /// one naming exactly who decided it.
    pub receipts: bool,
    /// The standing grant deciding: its terms (agent, tool, policy version, requester) are
    /// checked against each call as stored, and everyone who made it as a decider of it (then
    /// `principal` is the name recorded, `alice, under grant grt_…`); none when a person
    /// decides.
    pub grant: Option<&'a Grant>,
    /// The delegation a person decides under: (its maker, its delegate). `principal` is then
    /// the name recorded (`carol for alice`); the delegate is checked against the requester,
    /// the maker against each call's deciders.
    pub delegation: Option<(&'a str, &'a str)>,
    /// The decisions, one per call.
    pub proposals: Vec<Proposal>,
}

/// What decides a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionSource {
    /// A person (or the grant they made), checked against the held call's terms.
    Person,
    /// The deadline, once it has passed (Redis's clock): the call expires.
    Deadline,
    /// A change of the call's policy while it waited: the call is closed undecided
    /// (`superseded`), so its run is checked again under the policy now.
    Policy,
    /// A reviewer model whose approval the pause stored on the call (`principal` is its name):
    /// checked against that alone.
    Model,
}

impl DecisionSource {
    /// Its name for the script.
    fn as_str(self) -> &'static str {
        match self {
            DecisionSource::Person => "",
            DecisionSource::Deadline => "deadline",
            DecisionSource::Policy => "policy",
            DecisionSource::Model => "model",
        }
    }
}

/// How one decision of a request stands once the script ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecidedStatus {
    /// The call is decided.
    Recorded,
    /// One approval of several needed was counted.
    ApprovalRecorded,
    /// The same decision by the same person was recorded before: nothing changed.
    AlreadyRecorded,
    /// This person's approval was counted before; the quorum is still short.
    AlreadyVoted,
}

/// How one decision of a request stands.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct CallDecided {
    /// The call decided.
    pub call_id: String,
    /// How the decision stands.
    pub status: DecidedStatus,
    /// The approvals counted so far, when this was an approval of a call that needs several;
    /// `None` otherwise.
    #[serde(default)]
    pub approvals: Option<u32>,
    /// How many approvals that call needs, set with `approvals`.
    #[serde(default)]
    pub quorum: Option<u32>,
    /// Whether every held call of the turn is now decided (the run resumes).
    #[serde(default)]
    pub all_decided: bool,
    /// The standing grant the decision made, once made (the gateway makes it after the
    /// script recorded the approval that carries its terms).
    #[serde(skip)]
    pub grant: Option<countersign_model::grant::Grant>,
}

/// A refused decision, as kept in the run's capped list of refusals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    /// The call the refused decision was about.
    pub call_id: String,
    /// Why it was refused.
    pub code: RefusalCode,
    /// More about why, in words; empty when the code says it all.
    #[serde(default)]
    pub detail: String,
}

/// The answer to a request.
#[derive(Debug, PartialEq)]
pub enum DecideOutcome {
    /// Every decision of the request stands as `calls` say; `queued` are the announcements
    /// (and audit copies) to publish now.
    Decided {
        /// How each decision stands, in the request's order.
        calls: Vec<CallDecided>,
        /// The announcements (and audit copies) to publish now.
        queued: Vec<Announcement>,
    },
    /// The script refused the request, for the first decision it could not record; nothing but
    /// the refusal is kept.
    Refused(Refusal),
    /// No run of this id is stored.
    NoRun,
    /// An expiry found its call decided already (by a person, or by an earlier sweep).
    Settled(Box<Decision>),
    /// An expiry came before the deadline (Redis's clock): nothing yet.
    NotDue,
}

impl Store {
    /// Checks and records the decisions of one request atomically (see `lua/decide.lua`).
    pub(crate) async fn decide(
        &self,
        id: &RunId,
        request: &DecideRequest<'_>,
    ) -> Result<DecideOutcome, StoreError> {
        let link_key = request
            .link
            .map(|(hash, _)| self.keys.link_token_key(id, hash));
        let args = script::Decide {
            principal: request.principal,
            door: request.door,
            by: request.by.as_str(),
            role_decides: request.role_decides,
            receipts: request.receipts,
            decided_subject: &self.names.approval_decided(id),
            expired_subject: &self.names.approval_expired(id),
            grant: request.link.map_or("", |(_, grant)| grant),
            under_grant: &match request.grant {
                None => String::new(),
                Some(grant) => to_json(grant)?,
            },
            delegated: &match request.delegation {
                None => String::new(),
                Some((from, to)) => serde_json::json!({"from": from, "to": to}).to_string(),
            },
        };
        let (status, detail, queued) = self
            .on_run(&script::DECIDE, id, &args, |script, chain| {
                if let Some(key) = &link_key {
                    script.key(key);
                }
                script.arg(request.proposals.len());
                for p in &request.proposals {
                    push_proposal(script, chain, id, p)?;
                }
                Ok(())
            })
            .await?;
        Ok(match status.as_str() {
            "ok" => DecideOutcome::Decided {
                calls: from_json(&detail)?,
                queued,
            },
            "refused" => DecideOutcome::Refused(from_json(&detail)?),
            "missing" => DecideOutcome::NoRun,
            "settled" => DecideOutcome::Settled(Box::new(from_json(&detail)?)),
            "not_due" => DecideOutcome::NotDue,
            other => return Err(StoreError::Corrupt(format!("decide replied {other:?}"))),
        })
    }
}

/// Adds one proposed decision to the script's arguments: the decision, its audit entry
/// linked into the chain, and the events it announces once decided or expired.
fn push_proposal(
    script: &mut ScriptInvocation<'_>,
    chain: &mut Chain,
    id: &RunId,
    p: &Proposal,
) -> Result<(), StoreError> {
    let d = &p.decision;
    let action = serde_json::to_value(d.action).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let audit = chain.link(&p.entry);
    let decided = event(Event::ApprovalDecided {
        run_id: id.clone(),
        call_id: d.call_id.clone(),
        action: d.action,
        decided_by: d.decided_by.clone(),
        door: d.door.clone(),
        all_decided: false,
        channels: Vec::new(),
        under_grant: d.under_grant.clone(),
        superseded: d.superseded,
    });
    let expired = event(Event::ApprovalExpired {
        run_id: id.clone(),
        call_id: d.call_id.clone(),
        deadline: 0,
        channels: Vec::new(),
    });
    script::Proposed {
        call_id: &d.call_id,
        digest: &d.digest,
        action: action.as_str().unwrap_or_default(),
        json: &to_json(d)?,
        fingerprint: &d.fingerprint,
        checked: p.checked_digest.as_deref().unwrap_or_default(),
        receipt_for: &p.receipt_for,
        entry: &audit.entry,
        sha: &audit.sha,
        prev_guess: &audit.prev_guess,
        link: &audit.link,
        decided_id: &msg_id::decided(id, &d.call_id),
        expired_id: &msg_id::expired(id, &d.call_id),
        decided_event: &decided,
        expired_event: &expired,
    }
    .push(script);
    Ok(())
}
