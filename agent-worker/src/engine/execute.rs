//! Running an approved or free call through its execution record (`started` before the side
//! effect, the result after), so a call whose worker died mid-way is sent again only to a tool
//! declared idempotent and is otherwise reported as `unknown`, with `run.attention`. The mark
//! is refused once the run's cancel was accepted or its lease lost: no call starts then.

use super::Engine;
use crate::agents::RunnableAgent;
use crate::tools::{self, ToolCall};
use countersign_model::agent::ToolDef;
use countersign_model::events::Event;
use countersign_model::run::{CallOutcome, CallResult, RunId};
use countersign_runtime::names::msg_id;
use countersign_store::{ExecBegin, StoreError};
use serde_json::Value;
use tracing::warn;

impl Engine {
    /// Runs one call of `turn` through its execution record, so it never runs twice silently
    /// and never starts on a cancelled run ([`StoreError::Cancelled`]); an approved call
    /// carries its `receipt`. A call `marked` started by the save that stored its turn (see
    /// `Save::Turn`) is called at once. A tool that refuses the receipt is reported to
    /// the model as a failure and to a person with `run.attention`: the call did not run,
    /// though someone (or something) let it through to the tool.
    pub(super) async fn execute(
        &self,
        agent: &RunnableAgent,
        tool: &ToolDef,
        call: ToolCall<'_>,
        outcome: CallOutcome,
        marked: bool,
    ) -> Result<CallResult, StoreError> {
        let ToolCall {
            run,
            call_id,
            input,
            receipt,
            ..
        } = call;
        let begun = if marked {
            ExecBegin::Run
        } else {
            // This attempt's own mark, so a lost reply is not taken for an interrupted call.
            let token = uuid::Uuid::new_v4().simple().to_string();
            let owner = &self.settings.owner;
            self.store.exec_begin(run, owner, call_id, &token).await?
        };
        match begun {
            ExecBegin::Done(result) => return Ok(result),
            ExecBegin::InterruptedBefore if !tool.idempotent => {
                warn!(call_id, tool = %tool.name, "call outcome unknown after a crash");
                let reason = format!(
                    "The outcome of this {} call is unknown: it was started, but the worker running it stopped before recording the result. It was not sent again because the tool is not idempotent. A person should check whether it took effect.",
                    tool.name
                );
                // Still recorded below and told to the model; the audit trail has it too.
                let about = (call_id, tool.name.as_str(), input);
                let result = self.reported_unknown(run, about, reason).await;
                self.store.exec_finish(run, call_id, &result).await?;
                return Ok(result);
            }
            ExecBegin::InterruptedBefore | ExecBegin::Run => {}
        }
        let started = std::time::Instant::now();
        let answer = tools::call(&self.http, agent, tool, &call, outcome).await;
        self.metrics.tool_call(&tool.name, started.elapsed());
        if let Some(challenge) = &answer.receipt_refused {
            warn!(call_id, tool = %tool.name, challenge, "the tool refused the call's receipt");
            let reason = format!(
                "The tool {} refused this call's countersignature receipt ({challenge}), so it did not run. {}",
                tool.name,
                match receipt {
                    Some(_) =>
                        "The receipt did not match the call, had expired or was used before.",
                    None =>
                        "The call carried no receipt: no decision the gateway signed let it run.",
                }
            );
            self.attention(run, Some((call_id, &tool.name, input)), reason)
                .await;
        }
        self.store.exec_finish(run, call_id, &answer.result).await?;
        Ok(answer.result)
    }

    /// The result of a call (id, tool's name, input) started and never finished, whose
    /// outcome is unknown for `reason`; a person is told with `run.attention`.
    pub(super) async fn reported_unknown(
        &self,
        run: &RunId,
        call: (&str, &str, &Value),
        reason: String,
    ) -> CallResult {
        self.attention(run, Some(call), reason.clone()).await;
        CallResult {
            outcome: CallOutcome::Unknown,
            is_error: true,
            content: reason,
            images: Vec::new(),
            mcp: None,
        }
    }

    /// Publishes `run.attention` for the run, or one of its calls (id, tool's name, input): a
    /// person should look. Best effort: what it reports is recorded and audited besides.
    pub(super) async fn attention(
        &self,
        run: &RunId,
        call: Option<(&str, &str, &Value)>,
        reason: String,
    ) {
        let attention = Event::RunAttention {
            run_id: run.clone(),
            call_id: call.map(|(id, _, _)| id.to_string()),
            tool: call.map(|(_, tool, _)| tool.to_string()),
            input: call.map_or(Value::Null, |(_, _, input)| input.clone()),
            reason,
        };
        let msg_id = msg_id::attention(run, call.map(|(id, _, _)| id));
        if let Err(e) = self
            .bus
            .publish(self.bus.names.run_attention(run), &msg_id, attention)
            .await
        {
            warn!(error = %e, "could not publish run.attention");
        }
    }
}
