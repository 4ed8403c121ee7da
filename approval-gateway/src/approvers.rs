//! Who may decide a held call: the people of the config, matched against the call's
//! approver list (principal ids and `role:NAME`), with the requester kept from approving
//! their own request unless the policy allows it.

use crate::config::Person;
use countersign_shared::agent::Reviewers;
use countersign_shared::run::Action;
use std::collections::HashMap;

pub struct Directory {
    by_id: HashMap<String, Person>,
}

impl Directory {
    pub fn new(people: &[Person]) -> Self {
        Self {
            by_id: people.iter().map(|p| (p.id.clone(), p.clone())).collect(),
        }
    }

    pub fn person(&self, id: &str) -> Option<&Person> {
        self.by_id.get(id)
    }

    /// The principal a Slack user id maps to.
    pub fn by_slack_user(&self, user: &str) -> Option<&Person> {
        self.by_id
            .values()
            .find(|p| p.slack_user.as_deref() == Some(user))
    }

    /// Whether `principal` may take `action` on a call with these reviewers, in a run
    /// `requested_by` someone; the error says why not.
    pub fn may_decide(
        &self,
        principal: &str,
        action: Action,
        reviewers: &Reviewers,
        requested_by: Option<&str>,
    ) -> Result<(), String> {
        let listed = reviewers.approvers.is_empty()
            || reviewers
                .approvers
                .iter()
                .any(|entry| match entry.strip_prefix("role:") {
                    Some(role) => self
                        .person(principal)
                        .is_some_and(|p| p.roles.iter().any(|r| r == role)),
                    None => entry == principal,
                });
        if !listed {
            return Err(format!(
                "{principal} is not among the approvers of this call ({})",
                reviewers.approvers.join(", ")
            ));
        }
        // Turning one's own request down is always allowed; carrying it out is not.
        if action != Action::Reject
            && !reviewers.allow_self_approval
            && requested_by == Some(principal)
        {
            return Err(format!(
                "{principal} requested this run and may not approve their own request"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directory() -> Directory {
        Directory::new(&[Person {
            id: "alice".into(),
            roles: vec!["finance".into()],
            slack_user: Some("U1".into()),
            email: None,
        }])
    }

    fn reviewers(approvers: &[&str]) -> Reviewers {
        Reviewers {
            approvers: approvers.iter().map(|s| s.to_string()).collect(),
            ..Reviewers::default()
        }
    }

    #[test]
    fn approvers_match_by_id_or_role() {
        let d = directory();
        assert!(
            d.may_decide(
                "alice",
                Action::Approve,
                &reviewers(&["role:finance"]),
                None
            )
            .is_ok()
        );
        assert!(
            d.may_decide("bob", Action::Approve, &reviewers(&["bob"]), None)
                .is_ok()
        );
        let err = d.may_decide("bob", Action::Approve, &reviewers(&["role:finance"]), None);
        assert!(err.unwrap_err().contains("not among the approvers"));
        assert!(
            d.may_decide("anyone", Action::Approve, &reviewers(&[]), None)
                .is_ok()
        );
    }

    #[test]
    fn requesters_may_reject_but_not_approve_their_own_request() {
        let d = directory();
        let r = reviewers(&["alice"]);
        let err = d
            .may_decide("alice", Action::Approve, &r, Some("alice"))
            .unwrap_err();
        assert!(err.contains("their own request"), "{err}");
        assert!(
            d.may_decide("alice", Action::Edit, &r, Some("alice"))
                .is_err()
        );
        assert!(
            d.may_decide("alice", Action::Reject, &r, Some("alice"))
                .is_ok()
        );
        let allowed = Reviewers {
            allow_self_approval: true,
            ..r
        };
        assert!(
            d.may_decide("alice", Action::Approve, &allowed, Some("alice"))
                .is_ok()
        );
    }

    #[test]
    fn slack_users_map_to_people() {
        assert_eq!(directory().by_slack_user("U1").unwrap().id, "alice");
        assert!(directory().by_slack_user("U2").is_none());
    }
}
