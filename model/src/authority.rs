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
//! It approves in its makers' names only while [`grant_stands`]: each maker still someone the
//! configuration knows with a role that decides, so a grant ends with its maker's key, as
//! their sessions do; and it is made only in the name of someone it knows
//! ([`may_make_grant`]). It is read by whoever may read the run it was made on, or the runs
//! it is limited to ([`may_read_grant`]).
//!
//! A reviewer model ([`crate::reviewer`]) decides in its own name, `model:NAME@VERSION`,
//! which no person, key or door may take ([`names_a_model`]); it approves only a call whose
//! pause stored its approval under that name, and nothing else ([`may_model_approve`]).
//!
//! A delegation ([`crate::delegation`]) lets its delegate take its maker's place among a
//! call's deciders ([`deciding_for`]), never the requester's check; it is made by a person
//! for their own approvals or by an admin ([`may_delegate`]), and read or ended by either of
//! its people or an admin ([`may_touch_delegation`]).

use crate::delegation::Delegation;
use crate::grant::Grant;
use crate::refusal::RefusalCode;
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

    /// The role as configuration and the API name it (`admin`, `requester`, ...).
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
    /// The principal id.
    pub id: &'a str,
    /// What the principal's role lets them do.
    pub role: Role,
}

/// What the rule needs to know of the run a call is held in.
#[derive(Clone, Copy, Debug)]
pub struct RunFacts<'a> {
    /// Who requested the run; `None` when unknown.
    pub requested_by: Option<&'a str>,
    /// Someone asked to cancel the run.
    pub cancelling: bool,
}

impl<'a> RunFacts<'a> {
    /// The facts of `run` as stored.
    pub fn of(run: &'a Run) -> Self {
        Self {
            requested_by: run.requested_by.as_deref(),
            cancelling: run.cancel.is_some(),
        }
    }
}

/// Every action, in the order surfaces offer them.
pub const ALL_ACTIONS: [Action; 3] = [Action::Approve, Action::Reject, Action::Edit];

/// Whether `who` may take `action` on `call`, held in a run described by `run`.
pub fn may_decide(
    who: Principal<'_>,
    action: Action,
    call: &HeldCall,
    run: RunFacts<'_>,
) -> Result<(), RefusalCode> {
    if run.cancelling {
        return Err(RefusalCode::RunCancelled);
    }
    if !who.role.decides() {
        return Err(RefusalCode::RoleMayNotDecide);
    }
    if names_a_model(who.id) {
        return Err(RefusalCode::ModelName);
    }
    if let Some(deciders) = &call.deciders
        && !deciders.iter().any(|p| p == who.id)
    {
        return Err(RefusalCode::NotApprover);
    }
    action_allowed(action, call, run.requested_by == Some(who.id))
}

/// Whether `id` is a reviewer model's name (`model:…`): no person, key or door may decide
/// in it, or a person's approval would read, in the trail and the receipt, as a model's (and
/// a tool that refuses a model's would be told otherwise).
pub fn names_a_model(id: &str) -> bool {
    id.starts_with(crate::reviewer::MODEL_PREFIX)
}

/// Whether the reviewer model named `model` may take `action` on `call`, held in a run
/// described by `run`: only an approval, only of a call whose pause stored that model's
/// approval (its verdict inside the envelope, live), never on a run someone asked to cancel.
/// Who else may decide the call (its approvers, the requester) does not come into it: the
/// policy that names the model names it as a decider of exactly these calls.
pub fn may_model_approve(
    model: &str,
    action: Action,
    call: &HeldCall,
    run: RunFacts<'_>,
) -> Result<(), RefusalCode> {
    if run.cancelling {
        return Err(RefusalCode::RunCancelled);
    }
    let approved = call.model_approval.as_ref().is_some_and(|a| a.by == model);
    if action != Action::Approve || !approved || !names_a_model(model) {
        return Err(RefusalCode::NoModelApproval);
    }
    Ok(())
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

/// Whether `who` may hold the receipts of a run `requested_by` asked for: a receipt is a
/// bearer token for the call it approves, so only an admin, and the client that asked for
/// the run (the requester, or a key speaking for them) which runs the call itself when its
/// agent is `external`; never a reviewer or a reader.
pub fn may_hold_receipt(
    who: Principal<'_>,
    speaks_for: &[String],
    requested_by: Option<&str>,
) -> bool {
    match who.role {
        Role::Admin => true,
        Role::Requester => may_read(who, speaks_for, requested_by),
        Role::Reviewer | Role::Reader => false,
    }
}

/// Whether `maker`, whose role the configuration gives as `role` (None: someone it does not
/// know), may make a standing grant: a grant approves later calls in its makers' names, so
/// only in the name of someone it knows with a role that decides.
pub fn may_make_grant(role: Option<Role>) -> bool {
    role.is_some_and(Role::decides)
}

/// Whether `grant` still approves anything: each of its makers, whose roles `role_of` tells
/// as the configuration gives them now (None: someone it no longer knows), must still be
/// someone who may make it ([`may_make_grant`]). A maker whose key was removed, or whose
/// role no longer decides, leaves the grant approving nothing; the decision script checks
/// each maker against each call besides.
pub fn grant_stands(grant: &Grant, role_of: impl Fn(&str) -> Option<Role>) -> bool {
    !grant.granted_by.is_empty() && grant.granted_by.iter().all(|m| may_make_grant(role_of(m)))
}

/// Whether `who`, who speaks for `speaks_for`, may read `grant` (its terms, uses and makers):
/// whoever may read the run it was made on, or the runs it is limited to ([`may_read`]).
pub fn may_read_grant(who: Principal<'_>, speaks_for: &[String], grant: &Grant) -> bool {
    may_read(who, speaks_for, grant.run_requested_by.as_deref())
        || grant
            .requester
            .as_deref()
            .is_some_and(|r| may_read(who, speaks_for, Some(r)))
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

/// Who `who` decides `call` as, if they may take `action` on it: `None`, themselves, when
/// [`may_decide`] lets them; else the first of `delegators` (the people whose approvals are
/// handed to `who` by a delegation active now) whose place among the call's deciders `who`
/// takes, under every other rule. The requester check stays `who`'s own: a delegation never
/// lets anyone approve their own request.
pub fn deciding_for<'d>(
    who: Principal<'_>,
    delegators: &'d [String],
    action: Action,
    call: &HeldCall,
    run: RunFacts<'_>,
) -> Result<Option<&'d str>, RefusalCode> {
    match may_decide(who, action, call, run) {
        Err(RefusalCode::NotApprover) => {}
        done => return done.map(|()| None),
    }
    let deciders = call.deciders.as_deref().unwrap_or_default();
    let Some(from) = delegators
        .iter()
        .find(|d| *d != who.id && deciders.contains(d))
    else {
        return Err(RefusalCode::NotApprover);
    };
    action_allowed(action, call, run.requested_by == Some(who.id))?;
    Ok(Some(from.as_str()))
}

/// [`actions_for`] for someone to whom `delegators` handed their approvals.
pub fn actions_for_delegate(
    who: Principal<'_>,
    delegators: &[String],
    call: &HeldCall,
    run: RunFacts<'_>,
) -> Vec<Action> {
    ALL_ACTIONS
        .into_iter()
        .filter(|a| deciding_for(who, delegators, *a, call, run).is_ok())
        .collect()
}

/// Whether `who` may hand `from`'s approvals to `to`: a person their own, an admin anyone's,
/// between two people the configuration knows with roles that decide (`role_of`), never to
/// oneself.
pub fn may_delegate(
    who: Principal<'_>,
    from: &str,
    to: &str,
    role_of: impl Fn(&str) -> Option<Role>,
) -> Result<(), String> {
    if who.role != Role::Admin && !(who.role.decides() && who.id == from) {
        return Err(format!(
            "{} may hand over only their own approvals (an admin, anyone's)",
            who.id
        ));
    }
    if from == to {
        return Err("a delegation hands approvals to someone else".into());
    }
    for person in [from, to] {
        if !role_of(person).is_some_and(Role::decides) {
            return Err(format!(
                "{person} is not someone the configuration knows with a role that decides"
            ));
        }
    }
    Ok(())
}

/// Whether `who` may read or end `delegation`: either of its two people, or an admin.
pub fn may_touch_delegation(who: Principal<'_>, delegation: &Delegation) -> bool {
    who.role == Role::Admin || who.id == delegation.from || who.id == delegation.to
}

/// The part of the rule that depends on the action: self-approval and quorum.
fn action_allowed(action: Action, call: &HeldCall, own_run: bool) -> Result<(), RefusalCode> {
    if action != Action::Reject && own_run && !call.reviewers.allow_self_approval {
        return Err(RefusalCode::OwnRequest);
    }
    if action == Action::Edit && call.reviewers.quorum > 1 {
        return Err(RefusalCode::EditWithQuorum);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::Reviewers;

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

    fn grant(by: &[&str], run_of: Option<&str>, requester: Option<&str>) -> Grant {
        Grant {
            id: "grt_1".into(),
            agent: "refunds".into(),
            tool: "issue_refund".into(),
            policy_version: "v1".into(),
            condition: "true".into(),
            requester: requester.map(str::to_string),
            max_uses: 1,
            granted_by: by.iter().map(std::string::ToString::to_string).collect(),
            channel: "api".into(),
            run_id: "run_1".into(),
            call_id: "c1".into(),
            run_requested_by: run_of.map(str::to_string),
            created_at: 0,
            expires_at: 1,
            uses: 0,
            total: None,
            spent: 0.0,
            revoked: None,
        }
    }

    #[test]
    fn a_grant_stands_while_each_maker_is_known_with_a_deciding_role() {
        let roles = |id: &str| match id {
            "alice" => Some(Role::Reviewer),
            "ann" => Some(Role::Admin),
            "reed" => Some(Role::Reader),
            _ => None,
        };
        assert!(grant_stands(&grant(&["alice", "ann"], None, None), roles));
        // A maker gone from the configuration, or left with a role that does not decide.
        assert!(!grant_stands(&grant(&["alice", "gone"], None, None), roles));
        assert!(!grant_stands(&grant(&["reed"], None, None), roles));
        assert!(!grant_stands(&grant(&[], None, None), roles));
        assert!(may_make_grant(Some(Role::Reviewer)));
        assert!(!may_make_grant(None));
        assert!(!may_make_grant(Some(Role::Requester)));
    }

    #[test]
    fn a_grant_is_read_by_whoever_reads_its_run_or_the_runs_it_is_limited_to() {
        let rick = Principal {
            id: "rick",
            role: Role::Requester,
        };
        assert!(may_read_grant(
            rick,
            &[],
            &grant(&["a"], Some("rick"), None)
        ));
        assert!(!may_read_grant(
            rick,
            &[],
            &grant(&["a"], Some("bob"), None)
        ));
        assert!(may_read_grant(
            rick,
            &[],
            &grant(&["a"], None, Some("rick"))
        ));
        assert!(!may_read_grant(rick, &[], &grant(&["a"], None, None)));
        let reed = Principal {
            id: "reed",
            role: Role::Reader,
        };
        assert!(may_read_grant(reed, &[], &grant(&["a"], Some("bob"), None)));
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
            deciders: deciders.map(|d| d.iter().map(std::string::ToString::to_string).collect()),
            deadline: None,
            remind_at: None,
            escalated: false,
            recheck: None,
            risk: None,
            windows: Vec::new(),
            stage: None,
            model_approval: None,
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
                Err(RefusalCode::RoleMayNotDecide)
            );
        }
    }

    #[test]
    fn a_model_approves_only_what_its_stored_verdict_approved_and_nobody_takes_its_name() {
        let model = "model:haiku@v1";
        let mut approved = call(Some(&["alice"]), 1, false);
        approved.model_approval = Some(crate::reviewer::ModelApproval {
            by: model.into(),
            reason: "routine".into(),
        });
        // Not among the approvers, and still: the policy names the model for these calls.
        assert_eq!(
            may_model_approve(model, Action::Approve, &approved, RUN),
            Ok(())
        );
        for action in [Action::Reject, Action::Edit] {
            assert_eq!(
                may_model_approve(model, action, &approved, RUN),
                Err(RefusalCode::NoModelApproval)
            );
        }
        let other = "model:haiku@v2";
        assert_eq!(
            may_model_approve(other, Action::Approve, &approved, RUN),
            Err(RefusalCode::NoModelApproval)
        );
        let unapproved = call(None, 1, false);
        assert_eq!(
            may_model_approve(model, Action::Approve, &unapproved, RUN),
            Err(RefusalCode::NoModelApproval)
        );
        let cancelling = RunFacts {
            cancelling: true,
            ..RUN
        };
        assert_eq!(
            may_model_approve(model, Action::Approve, &approved, cancelling),
            Err(RefusalCode::RunCancelled)
        );
        // A person (or a key deciding as one) never decides in a model's name.
        let open = call(None, 1, false);
        assert_eq!(
            may_decide(who(model, Role::Admin), Action::Approve, &open, RUN),
            Err(RefusalCode::ModelName)
        );
        assert!(names_a_model(model) && !names_a_model("alice"));
    }

    #[test]
    fn a_listed_call_is_decided_by_its_deciders_holding_a_deciding_role() {
        let listed = call(Some(&["alice"]), 1, false);
        assert_eq!(
            may_decide(who("bob", Role::Admin), Action::Approve, &listed, RUN),
            Err(RefusalCode::NotApprover)
        );
        assert_eq!(
            may_decide(who("alice", Role::Reader), Action::Approve, &listed, RUN),
            Err(RefusalCode::RoleMayNotDecide)
        );
        assert!(may_decide(who("alice", Role::Reviewer), Action::Approve, &listed, RUN).is_ok());
    }

    #[test]
    fn a_delegate_takes_the_delegator_s_place_but_never_approves_their_own_request() {
        let listed = call(Some(&["alice"]), 1, false);
        let from_alice = ["alice".to_string()];
        let carol = who("carol", Role::Reviewer);
        assert_eq!(
            deciding_for(carol, &[], Action::Approve, &listed, RUN),
            Err(RefusalCode::NotApprover)
        );
        assert_eq!(
            deciding_for(carol, &from_alice, Action::Approve, &listed, RUN),
            Ok(Some("alice"))
        );
        assert_eq!(
            actions_for_delegate(carol, &from_alice, &listed, RUN),
            ALL_ACTIONS
        );
        // Someone a call lists decides as themselves; someone else's delegation is no help.
        let alice = who("alice", Role::Reviewer);
        assert_eq!(
            deciding_for(alice, &[], Action::Approve, &listed, RUN),
            Ok(None)
        );
        let bob_only = ["bob".to_string()];
        assert_eq!(
            deciding_for(carol, &bob_only, Action::Approve, &listed, RUN),
            Err(RefusalCode::NotApprover)
        );
        // The requester (rita) approves nothing of her own run as anyone's delegate, and a
        // delegate whose role does not decide decides nothing.
        assert_eq!(
            deciding_for(
                who("rita", Role::Reviewer),
                &from_alice,
                Action::Approve,
                &listed,
                RUN
            ),
            Err(RefusalCode::OwnRequest)
        );
        assert_eq!(
            deciding_for(
                who("carol", Role::Reader),
                &from_alice,
                Action::Reject,
                &listed,
                RUN
            ),
            Err(RefusalCode::RoleMayNotDecide)
        );
    }

    #[test]
    fn a_person_delegates_their_own_approvals_and_an_admin_anyone_s() {
        let roles = |id: &str| match id {
            "alice" | "carol" => Some(Role::Reviewer),
            "reed" => Some(Role::Reader),
            _ => None,
        };
        let alice = who("alice", Role::Reviewer);
        assert!(may_delegate(alice, "alice", "carol", roles).is_ok());
        assert!(may_delegate(alice, "carol", "alice", roles).is_err());
        assert!(may_delegate(alice, "alice", "alice", roles).is_err());
        assert!(may_delegate(alice, "alice", "reed", roles).is_err());
        assert!(may_delegate(alice, "alice", "nobody", roles).is_err());
        assert!(may_delegate(who("ann", Role::Admin), "carol", "alice", roles).is_ok());
        assert!(may_delegate(who("reed", Role::Reader), "reed", "alice", roles).is_err());
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
            Err(RefusalCode::RunCancelled)
        );
    }
}
