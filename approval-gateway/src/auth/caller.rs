//! Who is calling and what they may do.

use super::error::AuthError;
use crate::config::{Config, Role};

/// Who is calling: the holder of a bearer key, or a signed sender.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    pub(crate) principal: String,
    pub(crate) role: Role,
    /// Principals this caller may decide for besides itself (`*`: anyone).
    pub(crate) speaks_for: Vec<String>,
}

/// What a route needs the caller to be allowed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Permission {
    Read,
    Start,
    Decide,
    /// What only an admin does (ending others' sessions).
    Administer,
}

impl Caller {
    /// The principal a decision is made by, with the role they decide with: the caller
    /// itself, with its own role; or someone it may speak for, with their role as a person
    /// (`Config::person_role`), or, for someone the configuration does not know, the
    /// caller's (a system that authenticates its own users vouches for them).
    pub(crate) fn deciding_as(
        &self,
        named: Option<&str>,
        config: &Config,
    ) -> Result<(String, Role), AuthError> {
        let principal = self.speaking_as(named, "decide")?;
        let role = match principal == self.principal {
            true => self.role,
            false => config.person_role(&principal).unwrap_or(self.role),
        };
        Ok((principal, role))
    }

    /// The caller's own principal, or `named` if the caller may speak for them; `what` says
    /// what was attempted, for the refusal.
    pub(crate) fn speaking_as(&self, named: Option<&str>, what: &str) -> Result<String, AuthError> {
        match named {
            None => Ok(self.principal.clone()),
            Some(p) if p == self.principal => Ok(p.to_string()),
            Some(p) if self.speaks_for.iter().any(|s| s == "*" || s == p) => Ok(p.to_string()),
            Some(p) => Err(AuthError::Forbidden(format!(
                "the key of {} may not {what} on behalf of {p}",
                self.principal
            ))),
        }
    }

    /// Who cancels run `run_id`, asked for by `requester`: an admin as themselves; anyone
    /// else only as the requester, whom they must be or speak for.
    pub(crate) fn cancelling(
        &self,
        run_id: &str,
        requester: Option<&str>,
    ) -> Result<String, AuthError> {
        match (self.role, requester) {
            (Role::Admin, _) => Ok(self.principal.clone()),
            (_, Some(requester)) => self.speaking_as(Some(requester), "cancel runs").map_err(
                |_| {
                    AuthError::Forbidden(format!(
                        "only {requester}, who asked for run {run_id:?}, or an admin may cancel it"
                    ))
                },
            ),
            (_, None) => Err(AuthError::Forbidden(format!(
                "run {run_id:?} has no requester: only an admin may cancel it"
            ))),
        }
    }

    /// The caller as the authority rule names it.
    pub(crate) fn as_principal(&self) -> countersign_model::authority::Principal<'_> {
        countersign_model::authority::Principal {
            id: &self.principal,
            role: self.role,
        }
    }

    /// Whether the caller may read run `run_id`, asked for by `requester` (the rule is
    /// `countersign_model::authority::may_read`).
    pub(crate) fn reading(&self, run_id: &str, requester: Option<&str>) -> Result<(), AuthError> {
        if countersign_model::authority::may_read(self.as_principal(), &self.speaks_for, requester)
        {
            return Ok(());
        }
        Err(AuthError::Forbidden(format!(
            "the key of {} may read only the runs it asked for or speaks for; run {run_id:?} is {}'s",
            self.principal,
            requester.unwrap_or("nobody")
        )))
    }

    /// Whether the caller may hold the receipts of a run asked for by `requester` (the rule
    /// is `countersign_model::authority::may_hold_receipt`).
    pub(crate) fn holds_receipts(&self, requester: Option<&str>) -> bool {
        countersign_model::authority::may_hold_receipt(
            self.as_principal(),
            &self.speaks_for,
            requester,
        )
    }

    pub(crate) fn require(&self, permission: Permission) -> Result<(), AuthError> {
        let allowed = matches!(
            (self.role, permission),
            (Role::Admin, _)
                | (_, Permission::Read)
                | (Role::Requester, Permission::Start)
                | (Role::Reviewer, Permission::Decide)
        );
        if allowed {
            Ok(())
        } else {
            Err(AuthError::Forbidden(
                format!(
                    "the key of {} ({:?}) may not {permission:?}",
                    self.principal, self.role
                )
                .to_lowercase(),
            ))
        }
    }
}
