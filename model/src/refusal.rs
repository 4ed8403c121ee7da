//! Why a decision was refused, by one name everywhere: the code the decision script
//! (`store/src/lua/decide.lua`) refuses with, the rule of who may act ([`crate::authority`])
//! answers, the `countersign_decisions_total` metric counts under `outcome`, and the API
//! answers as `error.refusal` beside its broader, stable `error.code`. The gateway's
//! `decide/error.rs` is the one place that gives each its words and HTTP status.

use serde::{Deserialize, Serialize};

/// Why a decision was refused; nothing was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalCode {
    /// The call was decided otherwise, or by someone else (detail: the recorded decision).
    Decided,
    /// The run is not paused (detail: its status).
    NotWaiting,
    /// No such call is held in the run's current turn.
    NoCall,
    /// The digest is not the held call's (detail: the current one).
    StaleDigest,
    /// The deadline passed (detail: when, in ms).
    PastDeadline,
    /// The principal is not among the call's deciders (detail: them, as JSON).
    NotApprover,
    /// The edited call is above the principal's authority limit: they would not be among
    /// its deciders (detail: why, as the reviewer is told).
    AboveLimit,
    /// The requester may not approve or edit their own run.
    OwnRequest,
    /// This person's approval of a call that needs several already counts under another name:
    /// as themselves, as someone's delegate, or through their delegate (detail: the person).
    CountedOtherwise,
    /// A call that needs several approvals cannot be edited (detail: the quorum).
    EditWithQuorum,
    /// The edit was not checked against this call's schema (the call was not held when it
    /// was checked).
    EditUnchecked,
    /// The email link was used already.
    LinkUsed,
    /// The principal's role does not decide held calls.
    RoleMayNotDecide,
    /// Someone asked to cancel the run (detail: its status).
    RunCancelled,
    /// The standing grant was made by fewer people than the call's quorum (detail: the
    /// quorum).
    GrantShort,
    /// The standing grant is not about this call as stored: another agent, tool, policy
    /// version or requester (detail: which).
    GrantMismatch,
    /// The receipt does not name who the decision would (another approval of the quorum came
    /// first, detail: who it would), or the decision lets the call run without one: sign
    /// again and retry.
    ReceiptStale,
    /// A person's decision named a reviewer model (`model:…`), a name only a model decides
    /// in.
    ModelName,
    /// A reviewer model's decision on a call that holds no approval of that model: its
    /// stored verdict was not approve, it names another model, or the decision is not an
    /// approval (detail: the model the call holds, if any).
    NoModelApproval,
}

impl RefusalCode {
    /// The code as the script, the metric and the API write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Decided => "decided",
            Self::NotWaiting => "not_waiting",
            Self::NoCall => "no_call",
            Self::StaleDigest => "stale_digest",
            Self::PastDeadline => "past_deadline",
            Self::NotApprover => "not_approver",
            Self::AboveLimit => "above_limit",
            Self::OwnRequest => "own_request",
            Self::CountedOtherwise => "counted_otherwise",
            Self::EditWithQuorum => "edit_with_quorum",
            Self::EditUnchecked => "edit_unchecked",
            Self::LinkUsed => "link_used",
            Self::RoleMayNotDecide => "role_may_not_decide",
            Self::RunCancelled => "run_cancelled",
            Self::GrantShort => "grant_short",
            Self::GrantMismatch => "grant_mismatch",
            Self::ReceiptStale => "receipt_stale",
            Self::ModelName => "model_name",
            Self::NoModelApproval => "no_model_approval",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code the script refuses with is one of these, written as `as_str` writes it,
    /// and every one of these but those the gateway alone gives is one it refuses with.
    #[test]
    fn the_scripts_codes_are_the_codes() {
        let script = include_str!("../../store/src/lua/decide.lua");
        let used = regex::Regex::new(r"(?:refuse\([^,]+, |code = )'([a-z_]+)'").unwrap();
        let codes: std::collections::BTreeSet<&str> = used
            .captures_iter(script)
            .map(|c| c.get(1).unwrap().as_str())
            .collect();
        for code in &codes {
            let parsed: RefusalCode = serde_json::from_value((*code).into()).unwrap();
            assert_eq!(parsed.as_str(), *code);
        }
        assert_eq!(codes.len(), 18, "{codes:?}");
    }
}
