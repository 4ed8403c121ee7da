//! A run's live events: what a worker publishes on `live.<run>` as it drives the run, beside
//! the copy of every announcement about the run (the [`crate::events::Event`]s). The gateway
//! serves them, numbered, as server-sent events (`GET /v1/runs/{id}/events`). They are a view:
//! the stored run is the record, and a turn's text is stored whole when the turn ends.

use crate::run::{CallOutcome, CallResult, RunId, TurnCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The event types that end a run's stream: nothing follows them.
pub const ENDINGS: [&str; 3] = ["run.completed", "run.failed", "run.cancelled"];

/// What became of a call the model asked for, when the policy sorted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    /// Needs nobody: it runs now.
    Run,
    /// Waits for a person.
    Held,
    /// Cannot run (no such tool, or its input does not fit the schema); the model is told.
    Refused,
}

/// One live event of a run, as a worker publishes it on `live.<run>`; `type` on the wire names
/// the case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum LiveEvent {
    /// The model is asked for turn `turn`. The same turn can start again (a worker died
    /// during it, or the model was unavailable and the step is tried again): whoever shows
    /// the turn's text starts it anew.
    #[serde(rename = "turn.started")]
    TurnStarted {
        /// The run the event is about.
        run_id: RunId,
        /// The turn, counting model calls from 1.
        turn: u32,
    },
    /// A piece of the model's text in turn `turn`, as it arrives.
    #[serde(rename = "text.delta")]
    TextDelta {
        /// The run the event is about.
        run_id: RunId,
        /// The turn the text belongs to.
        turn: u32,
        /// The piece of text.
        text: String,
    },
    /// A call the model asked for in turn `turn`, as the policy sorted it.
    #[serde(rename = "tool.call")]
    ToolCall {
        /// The run the event is about.
        run_id: RunId,
        /// The turn that asked for the call.
        turn: u32,
        /// The call's id in the run (`TurnCall::call_id`).
        call_id: String,
        /// The tool asked for.
        tool: String,
        /// The arguments the model gave.
        input: Value,
        /// Whether it runs now, waits for a person, or cannot run.
        disposition: Disposition,
    },
    /// A call's result, as the model is told it.
    #[serde(rename = "tool.result")]
    ToolResult {
        /// The run the event is about.
        run_id: RunId,
        /// The turn that asked for the call.
        turn: u32,
        /// The call's id in the run.
        call_id: String,
        /// The tool called.
        tool: String,
        /// What happened to the call.
        outcome: CallOutcome,
        /// Whether the model is told it as an error.
        is_error: bool,
        /// What the model is told.
        content: String,
    },
    /// A worker took the paused run up again: its held calls are decided, and their results
    /// (`tool.result`) and the next turn follow.
    #[serde(rename = "run.resumed")]
    RunResumed {
        /// The run the event is about.
        run_id: RunId,
        /// The turn the held calls were asked in.
        turn: u32,
    },
}

impl LiveEvent {
    /// The `tool.call` event of `call`, asked for in turn `turn` of `run` and sorted as
    /// `disposition`.
    pub fn call(run: &RunId, turn: u32, call: &TurnCall, disposition: Disposition) -> Self {
        Self::ToolCall {
            run_id: run.clone(),
            turn,
            call_id: call.call_id.clone(),
            tool: call.tool.clone(),
            input: call.input.clone(),
            disposition,
        }
    }

    /// The `tool.result` event of `call`, asked for in turn `turn` of `run`, answered with
    /// `result`.
    pub fn result(run: &RunId, turn: u32, call: &TurnCall, result: &CallResult) -> Self {
        Self::ToolResult {
            run_id: run.clone(),
            turn,
            call_id: call.call_id.clone(),
            tool: call.tool.clone(),
            outcome: result.outcome,
            is_error: result.is_error,
            content: result.content.clone(),
        }
    }

    /// The event as published: JSON with its `type` and the events' `version`.
    pub fn to_json(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Versioned<'a> {
            version: u32,
            #[serde(flatten)]
            event: &'a LiveEvent,
        }
        serde_json::to_vec(&Versioned {
            version: crate::events::EVENT_VERSION,
            event: self,
        })
        .expect("live events serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_event_carries_its_type_and_version() {
        let event = LiveEvent::TextDelta {
            run_id: RunId::parse("run_1").unwrap(),
            turn: 2,
            text: "Refund".into(),
        };
        let json: Value = serde_json::from_slice(&event.to_json()).unwrap();
        assert_eq!(json["type"], "text.delta");
        assert_eq!(json["version"], 1);
        assert_eq!(json["turn"], 2);
        assert_eq!(serde_json::from_value::<LiveEvent>(json).unwrap(), event);
    }
}
