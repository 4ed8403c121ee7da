//! A tool's shadow policy: a candidate watched on real traffic before it is switched on.
//! Every call is sorted by both; the live policy decides, and where the shadow would have
//! done otherwise the difference is recorded, nothing more.

use super::{Changes, Engine};
use crate::agents::RunnableAgent;
use countersign_model::agent::ToolDef;
use countersign_model::approval::Reviewers;
use countersign_model::audit::AuditKind;
use countersign_model::events::Event;
use countersign_model::policy::Gate;
use countersign_model::run::{Run, TurnCall};
use countersign_runtime::names::msg_id;
use countersign_store::Announcement;
use serde_json::{Value, json};

impl Engine {
    /// Sorts `call` by its tool's shadow policy too, if it has one; where that differs from
    /// `live` (it would hold a call the live one runs, run one it holds, or ask other people),
    /// the difference is audited (`policy_shadow`), announced (`run.policy_shadow`) and
    /// counted, through `unsaved`.
    pub(super) fn shadow(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        tool: &ToolDef,
        call: &TurnCall,
        live: &Gate,
        unsaved: &mut Changes,
    ) {
        let (Some(policy), Some(def)) = (agent.shadows.get(&tool.name), &tool.shadow) else {
            return;
        };
        let shadow = policy.gate(&call.input, &run.metadata);
        let (live_reviewers, shadow_reviewers) = (tool.reviewers(), def.reviewers());
        let outcome = match (live, &shadow) {
            (Gate::Run, Gate::Run) => return,
            (Gate::Run, Gate::Ask { .. }) => "would_hold",
            (Gate::Ask { .. }, Gate::Run) => "would_release",
            (Gate::Ask { .. }, Gate::Ask { .. }) => {
                if (&live_reviewers.approvers, live_reviewers.quorum)
                    == (&shadow_reviewers.approvers, shadow_reviewers.quorum)
                {
                    return;
                }
                "other_reviewers"
            }
        };
        let live = described(live, &live_reviewers);
        let shadow = described(&shadow, &shadow_reviewers);
        let detail = json!({
            "tool": tool.name, "outcome": outcome, "live": live, "shadow": shadow,
        });
        let mut entry = self.entry(run, AuditKind::PolicyShadow, None, detail);
        entry.call_id = Some(call.call_id.clone());
        unsaved.audits.push(entry);
        let event = Event::RunPolicyShadow {
            run_id: run.run_id.clone(),
            call_id: call.call_id.clone(),
            tool: tool.name.clone(),
            outcome: outcome.to_string(),
            live,
            shadow,
        };
        unsaved.announce.push(Announcement::new(
            msg_id::policy_shadow(&run.run_id, &call.call_id),
            self.bus.names.run_policy_shadow(&run.run_id),
            event,
        ));
        self.metrics.policy_shadow(&tool.name, outcome);
    }
}

/// What a policy did with a call: ran it, or held it for whom.
fn described(gate: &Gate, reviewers: &Reviewers) -> Value {
    match gate {
        Gate::Run => json!({"gate": "run"}),
        Gate::Ask { .. } => json!({
            "gate": "hold", "approvers": reviewers.approvers, "quorum": reviewers.quorum,
        }),
    }
}
