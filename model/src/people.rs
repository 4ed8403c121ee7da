//! The people who review, configured once and read by both services: the worker resolves a
//! policy's approver entries (principal ids and `role:NAME`) to the people who may decide when
//! it holds a call, so the decision script can check the decider against that stored list
//! without any configuration; the gateway maps Slack users and email addresses to them.

use serde::Deserialize;
use std::collections::BTreeSet;

/// A person who reviews (a `[[people]]` entry): their principal id, and how Slack and email
/// reach them.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Person {
    /// The principal id used in approver lists, `requested_by` and `decided_by`.
    pub id: String,
    /// Roles matched by `role:NAME` approver entries.
    #[serde(default)]
    pub roles: Vec<String>,
    /// What this person may do when a door names them rather than a key (Slack, email, an
    /// inbox session from an emailed link): see the gateway's `Config::person_role`.
    #[serde(default)]
    pub role: Option<crate::authority::Role>,
    /// Slack user id (`U…`), for Slack decisions.
    #[serde(default)]
    pub slack_user: Option<String>,
    /// Email address, for email approvals.
    #[serde(default)]
    pub email: Option<String>,
}

/// The configured people, to look up by principal id, Slack user or email address.
#[derive(Clone, Debug, Default)]
pub struct Directory {
    people: Vec<Person>,
}

impl Directory {
    /// The directory of `people`.
    pub fn new(people: &[Person]) -> Self {
        Self {
            people: people.to_vec(),
        }
    }

    /// Everyone configured, in the order given.
    pub fn people(&self) -> &[Person] {
        &self.people
    }

    /// The person of principal id `id`, if configured.
    pub fn person(&self, id: &str) -> Option<&Person> {
        self.people.iter().find(|p| p.id == id)
    }

    /// The principal a Slack user id maps to.
    pub fn by_slack_user(&self, user: &str) -> Option<&Person> {
        self.people
            .iter()
            .find(|p| p.slack_user.as_deref() == Some(user))
    }

    /// The principals an approver list names, sorted: ids as they are, `role:NAME` as every
    /// person holding the role today. An empty list means anyone (`None`).
    pub fn resolve(&self, approvers: &[String]) -> Option<Vec<String>> {
        if approvers.is_empty() {
            return None;
        }
        let mut who = BTreeSet::new();
        for entry in approvers {
            match entry.strip_prefix("role:") {
                Some(role) => who.extend(
                    self.people
                        .iter()
                        .filter(|p| p.roles.iter().any(|r| r == role))
                        .map(|p| p.id.clone()),
                ),
                None => {
                    who.insert(entry.clone());
                }
            }
        }
        Some(who.into_iter().collect())
    }

    /// The `role:NAME` entries of an approver list that nobody holds.
    pub fn empty_roles<'a>(&self, approvers: &'a [String]) -> Vec<&'a str> {
        approvers
            .iter()
            .filter_map(|e| e.strip_prefix("role:"))
            .filter(|role| {
                !self
                    .people
                    .iter()
                    .any(|p| p.roles.iter().any(|r| r == role))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directory() -> Directory {
        let person = |id: &str, role: &str| Person {
            id: id.into(),
            roles: vec![role.into()],
            slack_user: Some(format!("U_{id}")),
            email: None,
            role: None,
        };
        Directory::new(&[
            person("alice", "finance"),
            person("bob", "finance"),
            person("carol", "support"),
        ])
    }

    #[test]
    fn roles_resolve_to_the_people_holding_them_and_ids_stay() {
        let d = directory();
        let list = |s: &[&str]| {
            s.iter()
                .map(std::string::ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            d.resolve(&list(&["role:finance", "rita"])),
            Some(list(&["alice", "bob", "rita"]))
        );
        assert_eq!(d.resolve(&list(&["role:nobody"])), Some(Vec::new()));
        assert_eq!(d.resolve(&[]), None);
        assert_eq!(
            d.empty_roles(&list(&["role:nobody", "role:support"])),
            ["nobody"]
        );
    }

    #[test]
    fn slack_users_map_to_people() {
        assert_eq!(directory().by_slack_user("U_alice").unwrap().id, "alice");
        assert!(directory().by_slack_user("U_zed").is_none());
    }
}
