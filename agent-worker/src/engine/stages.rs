//! Stages (see [`countersign_model::stage`]): a decided call held at a stage before the last
//! is not run but held again, under a new id, at the stage its decision sends it to, with the
//! input it was decided with (an edit's) and who approved each stage before. The next stage's
//! approvers are asked when the run pauses on it, as for any held call.

use super::hold::Asked;
use super::{Engine, StepError};
use crate::agents::RunnableAgent;
use countersign_model::agent::ToolDef;
use countersign_model::run::{Decision, Run, TurnCall};
use serde_json::Value;

impl Engine {
    /// `call` held again at the stage `decision` sends it to with `input`; None when it runs
    /// now (no stages, the last stage's approval, or a policy change let it through).
    pub(super) async fn next_stage(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        tool: &ToolDef,
        call: &TurnCall,
        decision: Option<&Decision>,
        input: &Value,
    ) -> Result<Option<TurnCall>, StepError> {
        let (Some(held), Some(decision)) = (call.held.as_ref(), decision) else {
            return Ok(None);
        };
        let stages = tool.approval.stages();
        let Some(stage) = held
            .stage
            .as_ref()
            .and_then(|s| s.after(decision.action, &decision.decided_by, stages))
        else {
            return Ok(None);
        };
        let mut again = call.clone();
        again.held_again();
        again.input = input.clone();
        let (reason, summary) = agent.policies[&tool.name].described(input, &run.metadata);
        let asked = Asked {
            call_id: &again.call_id,
            input,
            reason,
            summary,
            // Its shares stay counted under the id they were taken under until it runs.
            shares: held.windows.clone(),
            stage: Some(stage),
        };
        let now = self.store.time_ms().await?;
        again.held = Some(self.hold(run, tool, asked, now, None));
        Ok(Some(again))
    }
}
