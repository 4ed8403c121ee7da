//! What a decision comes in as, and the checks that need nothing but the decision itself:
//! sizes, formats, and what each action needs.

use super::error::DecideError;
use crate::config::Role;
use countersign_model::delegation::Delegation;
use countersign_model::grant::{Grant, GrantTerms};
use countersign_model::run::{Action, HeldCall};
use serde::Deserialize;
use serde_json::Value;

/// The longest call id a decision may name.
pub(crate) const MAX_CALL_ID: usize = 128;
/// The longest note or reason, in bytes.
pub(crate) const MAX_TEXT: usize = 4096;

/// A decision as a reviewer submits it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Proposed {
    pub(crate) call_id: String,
    pub(crate) digest: Option<String>,
    pub(crate) action: Action,
    pub(crate) input: Option<Value>,
    pub(crate) note: Option<String>,
    pub(crate) reason: Option<String>,
    /// With an approval: calls like this one are approved in advance on these terms.
    #[serde(default)]
    pub(crate) grant: Option<GrantTerms>,
}

impl Proposed {
    /// An approval of `call` exactly as it was held (its digest, no edit, no note): what a
    /// standing grant or a reviewer model decides, nobody having been asked.
    pub(crate) fn approval_of(call: &HeldCall) -> Self {
        Self {
            call_id: call.call_id.clone(),
            digest: Some(call.digest.clone()),
            action: Action::Approve,
            input: None,
            note: None,
            reason: None,
            grant: None,
        }
    }
}

/// Who decides, with the role their door established, through which door, with which
/// email link if any.
pub(crate) struct Decider<'a> {
    pub(crate) principal: &'a str,
    pub(crate) role: Role,
    pub(crate) door: &'a str,
    /// (token hash, grant) of the email link used: spent with the decision.
    pub(crate) link: Option<(&'a str, &'a str)>,
    /// The standing grant deciding, in its makers' names (then `principal` is
    /// [`Grant::decided_by`]).
    pub(crate) grant: Option<&'a Grant>,
    /// The delegation they decide under (then `principal` is [`Delegation::decider_name`]):
    /// set by `decide` itself, for someone a held call does not list.
    pub(crate) delegation: Option<&'a Delegation>,
    /// A reviewer model deciding in its name (`principal`), from the approval its verdict
    /// stored on the call (see `crate::reviewer_live`); the script checks that alone.
    pub(crate) model: bool,
}

impl<'a> Decider<'a> {
    /// Someone deciding through the API (`door` "api"), by key or signed request.
    pub(crate) fn api(principal: &'a str, role: Role) -> Self {
        Self {
            principal,
            role,
            door: "api",
            link: None,
            grant: None,
            delegation: None,
            model: false,
        }
    }
}

/// Bad input, refused before anything is stored.
pub(super) fn check_shape(p: &Proposed) -> Result<(), DecideError> {
    let bad = |message: String| Err(DecideError::BadInput(message));
    let call = p.call_id.as_str();
    if call.is_empty() || call.len() > MAX_CALL_ID {
        return bad(format!("call_id must be 1 to {MAX_CALL_ID} characters"));
    }
    let digest = p.digest.as_deref().unwrap_or_default();
    if digest.is_empty() {
        return bad(format!(
            "the decision for call {call:?} has no digest: quote the digest of the call you were shown"
        ));
    }
    let well_formed = digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if !well_formed {
        return bad(format!(
            "the digest for call {call:?} must be \"sha256:\" and 64 lowercase hex digits, as shown with the call"
        ));
    }
    for (name, text) in [("note", &p.note), ("reason", &p.reason)] {
        if text.as_ref().is_some_and(|t| t.len() > MAX_TEXT) {
            return bad(format!(
                "the {name} for call {call:?} is longer than {MAX_TEXT} bytes"
            ));
        }
    }
    let blank = |s: &Option<String>| s.as_deref().is_none_or(|s| s.trim().is_empty());
    if p.grant.is_some() && p.action != Action::Approve {
        return bad(format!(
            "only an approval allows calls like it (call {call:?})"
        ));
    }
    match p.action {
        Action::Reject if blank(&p.reason) => {
            bad(format!("rejecting call {call:?} needs a reason"))
        }
        Action::Edit if p.input.is_none() => bad(format!("editing call {call:?} needs an input")),
        Action::Approve | Action::Reject if p.input.is_some() => {
            bad(format!("only an edit carries an input (call {call:?})"))
        }
        _ => Ok(()),
    }
}
