//! Why a decision was not recorded: for each refusal (`RefusalCode`, the one name the script,
//! the metric and the API's `error.refusal` share), the status and broader code the API
//! answers with and its message, and the sentence a person reads on a page or in a channel,
//! side by side, so a new refusal is one arm in each function here (and its code in
//! `lua/decide.lua` and `RefusalCode`).

use crate::time::rfc3339;
use axum::http::StatusCode;
use countersign_model::run::Decision;
use countersign_store::{Refusal, RefusalCode};

#[derive(Debug, thiserror::Error)]
pub(crate) enum DecideError {
    /// The decisions are malformed or incomplete; nothing was looked up.
    #[error("{0}")]
    BadInput(String),
    /// An edit's input does not match its tool's schema.
    #[error("{message}")]
    InvalidEdit {
        message: String,
        errors: Vec<String>,
    },
    /// The decision script refused, for `code`, answered with `status` and `api_code`;
    /// `recorded` is the decision that stands when the call was decided already.
    #[error("{message}")]
    Refused {
        code: RefusalCode,
        status: StatusCode,
        api_code: &'static str,
        message: String,
        recorded: Option<Box<Decision>>,
    },
    /// A grant's condition is past a limit that bounds what evaluating it costs (or the
    /// call's input is too large to evaluate it on): the message names the limit.
    #[error("{0}")]
    ConditionLimit(String),
    /// The policy does not allow the grant asked for (`grants = false`, or past its caps).
    #[error("{0}")]
    GrantRefused(String),
    #[error("{0}")]
    NoRun(String),
    /// Redis or NATS failed, or the script answered what it should not.
    #[error("{0}")]
    Backend(String),
}

impl From<countersign_store::StoreError> for DecideError {
    fn from(e: countersign_store::StoreError) -> Self {
        Self::Backend(e.to_string())
    }
}

/// What a person is told when their own decision is refused, on any page or channel, where
/// the request in front of them is "this request" (the API's message names the principal and
/// the call instead, for clients and logs); None for a refusal a person's click cannot meet,
/// which is told in the API's words.
pub(crate) fn told(code: RefusalCode) -> Option<&'static str> {
    Some(match code {
        RefusalCode::NotApprover => "you are not among the approvers of this request",
        RefusalCode::AboveLimit => {
            "your edit puts this request above your authority limit: others must decide it"
        }
        RefusalCode::OwnRequest => {
            "you asked for this run, so you may reject this request but not approve or edit it"
        }
        RefusalCode::CountedOtherwise => {
            "your approval of this request already counts, as yourself or through a delegation"
        }
        RefusalCode::RoleMayNotDecide => "your role in countersign does not decide requests",
        RefusalCode::EditWithQuorum => {
            "this request needs several approvals, so it cannot be edited: approve or reject it"
        }
        RefusalCode::RunCancelled => "this run was cancelled; nothing in it can be decided",
        RefusalCode::Decided | RefusalCode::PastDeadline | RefusalCode::NotWaiting => {
            "this request can no longer be decided"
        }
        RefusalCode::StaleDigest => "this request changed since it was shown",
        RefusalCode::LinkUsed => "this link was already used or has expired",
        RefusalCode::NoCall
        | RefusalCode::EditUnchecked
        | RefusalCode::GrantShort
        | RefusalCode::GrantMismatch
        | RefusalCode::ReceiptStale
        | RefusalCode::ModelName
        | RefusalCode::NoModelApproval => return None,
    })
}

impl DecideError {
    // Long because it is one table: an arm per refusal code of the decision script, each
    // giving the status, the API's code and the message said for it. Split up, a reader would
    // lose the one place where every refusal is seen next to the others.
    /// A refusal of the decision script, said for `principal` deciding on run `run_id`.
    pub(super) fn refused(run_id: &str, principal: &str, refusal: Refusal) -> Self {
        let call = refusal.call_id.as_str();
        let detail = refusal.detail;
        let mut recorded = None;
        let (status, api_code, message) = match refusal.code {
            RefusalCode::Decided => match serde_json::from_str::<Decision>(&detail) {
                Ok(existing) if existing.expired => {
                    let message = format!(
                        "call {call:?} expired at {}: nobody decided before its deadline, so it did not run",
                        rfc3339(existing.decided_at)
                    );
                    recorded = Some(Box::new(existing));
                    (StatusCode::GONE, "expired", message)
                }
                Ok(existing) => {
                    let message = format!(
                        "call {call:?} was already decided: {} by {} at {}",
                        existing.action.as_str(),
                        existing.decided_by,
                        rfc3339(existing.decided_at)
                    );
                    recorded = Some(Box::new(existing));
                    (StatusCode::CONFLICT, "already_decided", message)
                }
                Err(_) => (
                    StatusCode::CONFLICT,
                    "already_decided",
                    format!("call {call:?} was already decided"),
                ),
            },
            RefusalCode::NotWaiting => (
                StatusCode::CONFLICT,
                "not_awaiting_approval",
                format!("run {run_id:?} is {detail}, not awaiting approval"),
            ),
            RefusalCode::NoCall => (
                StatusCode::NOT_FOUND,
                "not_found",
                format!("run {run_id:?} has no call {call:?} waiting for a decision"),
            ),
            // The current digest is not told: a careless script could quote it and approve
            // what nobody looked at. The reader looks again.
            RefusalCode::StaleDigest => (
                StatusCode::CONFLICT,
                "stale_digest",
                format!(
                    "the digest for call {call:?} does not match what is pending now: the call changed since it was shown; look at it again"
                ),
            ),
            RefusalCode::PastDeadline => (
                StatusCode::GONE,
                "expired",
                format!(
                    "the deadline of call {call:?} passed at {}; it can no longer be decided",
                    detail.parse().map(rfc3339).unwrap_or(detail)
                ),
            ),
            RefusalCode::NotApprover => {
                let deciders: Vec<String> = serde_json::from_str(&detail).unwrap_or_default();
                let message = format!(
                    "{principal} is not among the approvers of call {call:?} ({})",
                    deciders.join(", ")
                );
                (StatusCode::FORBIDDEN, "not_an_approver", message)
            }
            RefusalCode::AboveLimit => (
                StatusCode::FORBIDDEN,
                "not_an_approver",
                format!("{principal} may not edit call {call:?} to that input: {detail}"),
            ),
            RefusalCode::OwnRequest => (
                StatusCode::FORBIDDEN,
                "not_an_approver",
                format!("{principal} requested this run and may not approve their own request"),
            ),
            RefusalCode::CountedOtherwise => (
                StatusCode::FORBIDDEN,
                "not_an_approver",
                format!(
                    "{detail}'s approval of call {call:?} already counts under another name (as themselves, as someone's delegate, or through theirs): one person counts once"
                ),
            ),
            RefusalCode::RoleMayNotDecide => (
                StatusCode::FORBIDDEN,
                "not_an_approver",
                format!("{principal} does not hold a role that decides held calls"),
            ),
            RefusalCode::EditWithQuorum => (
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!(
                    "call {call:?} needs {detail} approvals, and an edit cannot be approved by several people at once: approve it as it is, or reject it with a reason"
                ),
            ),
            RefusalCode::EditUnchecked => (
                StatusCode::CONFLICT,
                "not_checked",
                format!(
                    "call {call:?} was not waiting when the edit was checked against its tool's schema; send it again"
                ),
            ),
            RefusalCode::LinkUsed => (
                StatusCode::GONE,
                "link_used",
                "this link was already used or has expired".to_string(),
            ),
            RefusalCode::ReceiptStale => (
                StatusCode::CONFLICT,
                "approvals_changed",
                format!(
                    "other approvals of call {call:?} were recorded while this one was; send it again"
                ),
            ),
            RefusalCode::GrantShort => (
                StatusCode::FORBIDDEN,
                "not_an_approver",
                format!(
                    "call {call:?} needs {detail} approvals, more than the standing grant's makers"
                ),
            ),
            RefusalCode::GrantMismatch => (
                StatusCode::FORBIDDEN,
                "not_covered",
                format!("the standing grant does not cover call {call:?}: its {detail} differs"),
            ),
            RefusalCode::ModelName => (
                StatusCode::FORBIDDEN,
                "not_an_approver",
                format!(
                    "{principal} is the name of a reviewer model: only the model decides in it, never a person or a key"
                ),
            ),
            RefusalCode::NoModelApproval => (
                StatusCode::FORBIDDEN,
                "not_an_approver",
                format!(
                    "call {call:?} holds no approval of {principal}: a reviewer model approves only a call its verdict, stored with the pause, approved"
                ),
            ),
            RefusalCode::RunCancelled => (
                StatusCode::CONFLICT,
                "run_cancelled",
                format!("run {run_id:?} was cancelled: nothing in it is decided any more"),
            ),
        };
        Self::Refused {
            code: refusal.code,
            status,
            api_code,
            message,
            recorded,
        }
    }
}
