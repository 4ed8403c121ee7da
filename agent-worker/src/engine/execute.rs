//! Running an approved or free call through its execution record (`started` before the side
//! effect, the result after), so a call whose worker died mid-way is sent again only to a tool
//! declared idempotent and is otherwise reported as `unknown`, with `run.attention`.

use super::Engine;
use crate::tools;
use countersign_model::agent::ToolDef;
use countersign_model::events::Event;
use countersign_model::run::{CallOutcome, CallResult, RunId};
use countersign_runtime::names::msg_id;
use countersign_store::{ExecBegin, StoreError};
use serde_json::Value;
use tracing::warn;

impl Engine {
    /// Runs one call of `turn` through its execution record, so it never runs twice silently.
    pub(super) async fn execute(
        &self,
        run: &RunId,
        turn: u32,
        tool: &ToolDef,
        call_id: &str,
        input: &Value,
        outcome: CallOutcome,
    ) -> Result<CallResult, StoreError> {
        // This attempt's own mark, so a lost reply is not taken for an interrupted call.
        let token = uuid::Uuid::new_v4().simple().to_string();
        match self.store.exec_begin(run, call_id, &token).await? {
            ExecBegin::Done(result) => return Ok(result),
            ExecBegin::InterruptedBefore if !tool.idempotent => {
                warn!(call_id, tool = %tool.name, "call outcome unknown after a crash");
                let reason = format!(
                    "The outcome of this {} call is unknown: it was started, but the worker running it stopped before recording the result. It was not sent again because the tool is not idempotent. A person should check whether it took effect.",
                    tool.name
                );
                let attention = Event::RunAttention {
                    run_id: run.clone(),
                    call_id: Some(call_id.to_string()),
                    tool: Some(tool.name.clone()),
                    input: input.clone(),
                    reason: reason.clone(),
                };
                let msg_id = msg_id::attention(run, Some(call_id));
                if let Err(e) = self
                    .bus
                    .publish(self.bus.names.run_attention(run), &msg_id, attention)
                    .await
                {
                    // Still recorded below and told to the model; the audit trail has it too.
                    warn!(error = %e, "could not publish run.attention");
                }
                let result = CallResult {
                    outcome: CallOutcome::Unknown,
                    is_error: true,
                    content: reason,
                };
                self.store.exec_finish(run, call_id, &result).await?;
                return Ok(result);
            }
            ExecBegin::InterruptedBefore | ExecBegin::Run => {}
        }
        let started = std::time::Instant::now();
        let result = tools::call_http(&self.http, tool, run, turn, call_id, input, outcome).await;
        self.metrics.tool_call(&tool.name, started.elapsed());
        self.store.exec_finish(run, call_id, &result).await?;
        Ok(result)
    }
}
