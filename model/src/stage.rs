//! Stages: approvals in order (`[[tools.approval.stages]]`: first the on-call engineer, then a
//! change manager), each stage with its own approvers, quorum, deadline and channels.
//!
//! A call is held at stage 1. Each stage's decision is recorded through the decision script
//! like any other; an approval that completes a stage before the last lets nothing run: the
//! worker holds the call again (a new call id, as a call held again after a policy change) at
//! the next stage, keeping who approved each stage before, and the next stage's approvers are
//! asked only then. A rejection or an expiry at any stage ends it. An edit changes the call
//! (its digest), so the earlier stages approved something else: an edit at stage 1 counts as
//! stage 1's approval of the edited call, and an edit at a later stage sends the edited call
//! back to stage 1. Only the last stage's approval runs the call, with a receipt that names
//! every stage's deciders.

use crate::approval::Channel;
use crate::run::Action;
use crate::span::Span;
use serde::{Deserialize, Serialize};

/// The most stages a policy may have.
pub const MAX_STAGES: usize = 5;

/// One stage as a policy writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageDef {
    /// What the stage is called (`on-call`, `change manager`), as reviewers read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Who decides at this stage: principal ids and `role:NAME` entries.
    pub approvers: Vec<String>,
    /// How many distinct people of them must approve. Default 1.
    #[serde(default = "one")]
    pub quorum: u32,
    /// How long they have (`30m`, `4h`); default the worker's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Span>,
    /// Where they are asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<Channel>,
}

fn one() -> u32 {
    1
}

/// Where a held call stands among its policy's stages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// The stage it is held at, from 1.
    pub number: u32,
    /// How many stages the policy has.
    pub of: u32,
    /// The stage's name, if the policy gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The stages approved before, in order, each with who approved it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved: Vec<StageApproval>,
    /// Set when an edit at a later stage sent the call back to stage 1: who edited, at which
    /// stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_back: Option<StageApproval>,
}

/// Who decided one stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageApproval {
    /// The stage, from 1.
    pub number: u32,
    /// Its name, if the policy gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Who decided it, as the decision names them.
    pub decided_by: String,
}

impl Stage {
    /// The first stage of `stages`, if the policy has any.
    pub fn first(stages: &[StageDef]) -> Option<Self> {
        (!stages.is_empty()).then(|| Self {
            number: 1,
            of: stages.len() as u32,
            name: stages[0].name.clone(),
            approved: Vec::new(),
            sent_back: None,
        })
    }

    /// The stage an `action` taken here sends the call to; `None` when it lets the call run
    /// (the last stage's approval) or ends it (a rejection).
    pub fn next(&self, action: Action) -> Option<u32> {
        match action {
            Action::Reject => None,
            Action::Approve if self.number < self.of => Some(self.number + 1),
            Action::Approve => None,
            // Stage 1 approves the call it edited; a later stage's edit asks every stage again.
            Action::Edit if self.number == 1 && self.of > 1 => Some(2),
            Action::Edit if self.number > 1 => Some(1),
            Action::Edit => None,
        }
    }

    /// Where the call stands once `action` by `decided_by` took it to stage `number` of
    /// `stages`.
    pub fn after(&self, action: Action, decided_by: &str, stages: &[StageDef]) -> Option<Self> {
        let number = self.next(action)?;
        let this = StageApproval {
            number: self.number,
            name: self.name.clone(),
            decided_by: decided_by.to_string(),
        };
        let (approved, sent_back) = match number {
            1 => (Vec::new(), Some(this)),
            _ => {
                let mut approved = self.approved.clone();
                approved.push(this);
                (approved, None)
            }
        };
        Some(Self {
            number,
            of: stages.len() as u32,
            name: stages.get(number as usize - 1).and_then(|s| s.name.clone()),
            approved,
            sent_back,
        })
    }

    /// The stage as a reviewer reads it: `stage 2 of 2 (change manager); stage 1 (on-call)
    /// approved by bob`.
    pub fn told(&self) -> String {
        let named = |n: u32, name: &Option<String>| match name {
            Some(name) => format!("stage {n} ({name})"),
            None => format!("stage {n}"),
        };
        let mut told = format!("{} of {}", named(self.number, &self.name), self.of);
        for a in &self.approved {
            told += &format!(
                "; {} approved by {}",
                named(a.number, &a.name),
                a.decided_by
            );
        }
        if let Some(back) = &self.sent_back {
            told += &format!(
                "; sent back by {}'s edit at {}",
                back.decided_by,
                named(back.number, &back.name)
            );
        }
        told
    }
}

/// Checks a policy's stages: at most [`MAX_STAGES`], each listing its approvers with a quorum
/// of at least 1, on a policy that leaves approvers, quorum, timeout, channels and limits to
/// them.
pub fn check(stages: &[StageDef], rule: &crate::approval::ApprovalRule) -> Result<(), String> {
    if stages.is_empty() {
        return Ok(());
    }
    if stages.len() > MAX_STAGES {
        return Err(format!("a policy has at most {MAX_STAGES} stages"));
    }
    if !rule.approvers.is_empty()
        || rule.quorum != 1
        || rule.timeout.is_some()
        || !rule.channels.is_empty()
        || !rule.limits.is_empty()
    {
        return Err(
            "with stages, give approvers, quorum, timeout and channels in each stage (and no limits)"
                .into(),
        );
    }
    for (i, stage) in stages.iter().enumerate() {
        if stage.approvers.is_empty() || stage.approvers.iter().any(|a| a.trim().is_empty()) {
            return Err(format!("stage {} lists no approvers", i + 1));
        }
        if stage.quorum == 0 {
            return Err(format!("stage {}: quorum must be at least 1", i + 1));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stages(n: usize) -> Vec<StageDef> {
        (1..=n)
            .map(|i| StageDef {
                name: Some(format!("s{i}")),
                approvers: vec![format!("p{i}")],
                quorum: 1,
                timeout: None,
                channels: Vec::new(),
            })
            .collect()
    }

    /// Each action at each stage of a three-stage policy, and where it sends the call.
    #[test]
    fn approvals_go_forward_and_edits_after_the_first_stage_go_back() {
        let defs = stages(3);
        let first = Stage::first(&defs).unwrap();
        let rows: [(u32, Action, Option<u32>); 9] = [
            (1, Action::Approve, Some(2)),
            (2, Action::Approve, Some(3)),
            (3, Action::Approve, None),
            (1, Action::Edit, Some(2)),
            (2, Action::Edit, Some(1)),
            (3, Action::Edit, Some(1)),
            (1, Action::Reject, None),
            (2, Action::Reject, None),
            (3, Action::Reject, None),
        ];
        for (number, action, next) in rows {
            let at = Stage {
                number,
                ..first.clone()
            };
            assert_eq!(at.next(action), next, "stage {number}, {action:?}");
        }
        let second = first.after(Action::Approve, "p1", &defs).unwrap();
        assert_eq!((second.number, second.name.as_deref()), (2, Some("s2")));
        let third = second.after(Action::Approve, "p2", &defs).unwrap();
        assert_eq!(
            third.told(),
            "stage 3 (s3) of 3; stage 1 (s1) approved by p1; stage 2 (s2) approved by p2"
        );
        let back = third.after(Action::Edit, "p3", &defs).unwrap();
        assert_eq!(back.number, 1);
        assert!(back.approved.is_empty());
        assert_eq!(
            back.told(),
            "stage 1 (s1) of 3; sent back by p3's edit at stage 3 (s3)"
        );
        // A single stage runs on its approval or its edit, like a policy without stages.
        let only = Stage::first(&stages(1)).unwrap();
        assert_eq!(
            (only.next(Action::Approve), only.next(Action::Edit)),
            (None, None)
        );
    }
}
