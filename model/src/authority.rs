//! Who may do what: the one rule every door and every surface asks.
//!
//! A door (an API key, an inbox session, an email link, a Slack click, a signed sender) only
//! establishes *who* is asking and with which [`Role`]. [`may_decide`] then answers whether
//! that principal may take an action on a held call, from the call as it was held and the
//! run. The decision script applies the same rule in the atomic step that records a decision
//! (`lua/decide.lua`: it is given whether the principal's role decides); the inbox's forms,
//! the email links and Slack's buttons are rendered from [`actions_for`] and [`offered`], so
//! no surface offers what the script refuses. A table test in the tests crate walks doors,
//! principals, actions and policies against the script.
//!
//! The rule:
//! - only a role that decides (`reviewer`, `admin`) decides anything, on every door;
//! - a call whose policy names approvers is decided by them alone (roles resolved to people
//!   when it was held, escalation targets added when it escalated); a call that names none,
//!   by anyone whose role decides;
//! - the run's requester may reject their own run's calls, but approve or edit them only when
//!   the policy allows self-approval;
//! - a call that needs several approvals cannot be edited;
//! - nothing is decided on a run someone asked to cancel.
//!
//! Reading a run (its state, its audit trail, its live events) is [`may_read`]'s rule: every
//! role but `requester` reads every run; a requester reads the runs asked for by itself or by
//! someone it speaks for, so a chat app's key that starts runs for one user does not see
//! another's.
//!
//! A standing grant is made by approving a call, so whoever may approve it may grant (and the
//! script checks each maker again for every call the grant decides); it is revoked by
//! [`may_revoke`]'s rule: its makers, an admin, or anyone who may decide its tool's calls.

use crate::grant::Grant;
use crate::run::{Action, HeldCall, Run};
use serde::{Deserialize, Serialize};

/// What a principal is allowed, by configuration (an API key's role, or a person's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything.
    Admin,
    /// Start runs and read them.
    Requester,
    /// Read runs and decide on held calls.
    Reviewer,
    /// Read only.
    Reader,
}

impl Role {
    /// Whether this role decides held calls.
    pub fn decides(self) -> bool {
        matches!(self, Role::Admin | Role::Reviewer)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Requester => "requester",
            Role::Reviewer => "reviewer",
            Role::Reader => "reader",
        }
    }
}

/// Who is asking, as a door established it.
#[derive(Clone, Copy, Debug)]
pub struct Principal<'a> {
    pub id: &'a str,
    pub role: Role,
}

/// What the rule needs to know of the run a call is held in.
#[derive(Clone, Copy, Debug)]
pub struct RunFacts<'a> {
    pub requested_by: Option<&'a str>,
    /// Someone asked to cancel the run.
    pub cancelling: bool,
}

impl<'a> RunFacts<'a> {
    pub fn of(run: &'a Run) -> Self {
        Self {
            requested_by: run.requested_by.as_deref(),
            cancelling: run.cancel.is_some(),
        }
    }
}

/// Why the rule refuses: each is a refusal code of the decision script too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The principal's role does not decide.
    RoleMayNotDecide,
    /// The call names approvers and the principal is not among them.
    NotApprover,
    /// The requester may not approve or edit their own run's call.
    OwnRequest,
    /// A call that needs several approvals cannot be edited.
    EditWithQuorum,
    /// The run is being cancelled.
    RunCancelled,
}

/// Every action, in the order surfaces offer them.
pub const ALL_ACTIONS: [Action; 3] = [Action::Approve, Action::Reject, Action::Edit];

/// Whether `who` may take `action` on `call`, held in a run described by `run`.
pub fn may_decide(
    who: Principal<'_>,
    action: Action,
    call: &HeldCall,
    run: RunFacts<'_>,
) -> Result<(), Refused> {
    if run.cancelling {
        return Err(Refused::RunCancelled);
    }
    if !who.role.decides() {
        return Err(Refused::RoleMayNotDecide);
    }
    if let Some(deciders) = &call.deciders
        && !deciders.iter().any(|p| p == who.id)
    {
        return Err(Refused::NotApprover);
    }
    action_allowed(action, call, run.requested_by == Some(who.id))
}

/// What `who` may do with `call`: the forms and links a surface made for one person shows.
pub fn actions_for(who: Principal<'_>, call: &HeldCall, run: RunFacts<'_>) -> Vec<Action> {
    ALL_ACTIONS
        .into_iter()
        .filter(|a| may_decide(who, *a, call, run).is_ok())
        .collect()
}

/// The actions someone may take on `call`: what a surface seen by many (a Slack message)
/// offers; each click is then checked for the person who made it.
pub fn offered(call: &HeldCall, run: RunFacts<'_>) -> Vec<Action> {
    if run.cancelling {
        return Vec::new();
    }
    ALL_ACTIONS
        .into_iter()
        .filter(|a| action_allowed(*a, call, false).is_ok())
        .collect()
}

/// Whether `who`, who speaks for `speaks_for` (`*`: anyone), may read a run asked for by
/// `requested_by`.
pub fn may_read(who: Principal<'_>, speaks_for: &[String], requested_by: Option<&str>) -> bool {
    match (who.role, requested_by) {
        (Role::Requester, Some(requester)) => {
            requester == who.id || speaks_for.iter().any(|s| s == "*" || s == requester)
        }
        (Role::Requester, None) => false,
        (Role::Admin | Role::Reviewer | Role::Reader, _) => true,
    }
}

/// Whether `who` may revoke `grant`, on a tool whose calls `deciders` decide (None: anyone
/// whose role decides). Revoking only takes relief away, so anyone who could decide the calls
/// it covers may.
pub fn may_revoke(who: Principal<'_>, grant: &Grant, deciders: Option<&[String]>) -> bool {
    who.role == Role::Admin
        || (who.role.decides()
            && (grant.granted_by.iter().any(|g| g == who.id)
                || deciders.is_none_or(|d| d.iter().any(|p| p == who.id))))
}

/// The part of the rule that depends on the action: self-approval and quorum.
fn action_allowed(action: Action, call: &HeldCall, own_run: bool) -> Result<(), Refused> {
    if action != Action::Reject && own_run && !call.reviewers.allow_self_approval {
        return Err(Refused::OwnRequest);
    }
    if action == Action::Edit && call.reviewers.quorum > 1 {
        return Err(Refused::EditWithQuorum);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::Reviewers;

    #[test]
    fn a_requester_reads_only_the_runs_of_those_it_speaks_for() {
        let rick = Principal {
            id: "rick",
            role: Role::Requester,
        };
        let for_alice = ["alice".to_string()];
        assert!(may_read(rick, &[], Some("rick")));
        assert!(may_read(rick, &for_alice, Some("alice")));
        assert!(!may_read(rick, &for_alice, Some("bob")));
        assert!(!may_read(rick, &for_alice, None));
        assert!(may_read(rick, &["*".to_string()], Some("bob")));
        for role in [Role::Admin, Role::Reviewer, Role::Reader] {
            let who = Principal { id: "x", role };
            assert!(may_read(who, &[], Some("bob")), "{role:?}");
            assert!(may_read(who, &[], None), "{role:?}");
        }
    }

    fn call(deciders: Option<&[&str]>, quorum: u32, self_ok: bool) -> HeldCall {
        HeldCall {
            call_id: "c1".into(),
            tool: "issue_refund".into(),
            input: serde_json::json!({}),
            digest: String::new(),
            policy_version: String::new(),
            summary: String::new(),
            reason: String::new(),
            reviewers: Reviewers {
                quorum,
                allow_self_approval: self_ok,
                ..Reviewers::default()
            },
            deciders: deciders.map(|d| d.iter().map(|s| s.to_string()).collect()),
            deadline: None,
            remind_at: None,
            escalated: false,
            recheck: None,
        }
    }

    const RUN: RunFacts = RunFacts {
        requested_by: Some("rita"),
        cancelling: false,
    };

    fn who(id: &str, role: Role) -> Principal<'_> {
        Principal { id, role }
    }

    #[test]
    fn only_deciding_roles_decide_a_call_that_names_nobody() {
        let open = call(None, 1, false);
        assert_eq!(
            actions_for(who("bob", Role::Reviewer), &open, RUN),
            ALL_ACTIONS
        );
        assert_eq!(
            actions_for(who("ann", Role::Admin), &open, RUN),
            ALL_ACTIONS
        );
        for role in [Role::Reader, Role::Requester] {
            assert_eq!(
                may_decide(who("bob", role), Action::Reject, &open, RUN),
                Err(Refused::RoleMayNotDecide)
            );
        }
    }

    #[test]
    fn a_listed_call_is_decided_by_its_deciders_holding_a_deciding_role() {
        let listed = call(Some(&["alice"]), 1, false);
        assert_eq!(
            may_decide(who("bob", Role::Admin), Action::Approve, &listed, RUN),
            Err(Refused::NotApprover)
        );
        assert_eq!(
            may_decide(who("alice", Role::Reader), Action::Approve, &listed, RUN),
            Err(Refused::RoleMayNotDecide)
        );
        assert!(may_decide(who("alice", Role::Reviewer), Action::Approve, &listed, RUN).is_ok());
    }

    #[test]
    fn requesters_reject_their_own_unless_self_approval_is_allowed() {
        let rita = who("rita", Role::Reviewer);
        assert_eq!(
            actions_for(rita, &call(None, 1, false), RUN),
            [Action::Reject]
        );
        assert_eq!(actions_for(rita, &call(None, 1, true), RUN), ALL_ACTIONS);
    }

    #[test]
    fn quorum_calls_are_never_edited_and_cancelling_runs_offer_nothing() {
        let quorum = call(None, 2, false);
        assert_eq!(offered(&quorum, RUN), [Action::Approve, Action::Reject]);
        let cancelling = RunFacts {
            cancelling: true,
            ..RUN
        };
        assert!(offered(&quorum, cancelling).is_empty());
        assert_eq!(
            may_decide(who("bob", Role::Admin), Action::Reject, &quorum, cancelling),
            Err(Refused::RunCancelled)
        );
    }
}
