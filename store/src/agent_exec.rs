//! The execution record of calls released to external agents, which run them themselves (see
//! `lua/agent_exec.lua`): the attempt that claims a call before running it, then how it
//! ended, each written with its audit entry in one script step. Kept beside the worker's own
//! record of the call (which says it was released), under fields of their own.

use super::{Announcement, GatewayStore, Store, StoreError, from_json, to_json};
use crate::script;
use countersign_model::audit::AuditEntry;
use countersign_model::door::{ExecEnd, ExecStart};
use countersign_model::run::RunId;

/// A step of the record: the claim, or the end.
#[derive(Debug)]
pub enum AgentStep<'a> {
    /// An attempt claims the call before running it.
    Start(&'a ExecStart),
    /// The attempt that claimed it says how it ended.
    End {
        /// The attempt, as it claimed the call.
        attempt: &'a str,
        /// How it ended.
        end: &'a ExecEnd,
    },
}

/// What the record made of a step.
#[derive(Debug)]
pub enum AgentStepped {
    /// Written and audited; the announcements to publish.
    Written(Vec<Announcement>),
    /// This attempt had written this step already: what it wrote then (an `ExecStart` or an
    /// `ExecEnd`, as JSON).
    Repeat(String),
    /// Another attempt claimed the call: its claim.
    Taken(ExecStart),
    /// An end from an attempt that never claimed the call.
    NotStarted,
    /// No such run (or no longer retained).
    Missing,
}

/// The record of one call: its claim, and its end once reported.
pub type AgentExecution = (ExecStart, Option<ExecEnd>);

impl GatewayStore {
    /// Writes `step` of the call `call_id` of run `id` with its audit `entry`, unless the
    /// record says it may not be (see [`AgentStepped`]).
    pub async fn agent_exec(
        &self,
        id: &RunId,
        call_id: &str,
        step: AgentStep<'_>,
        entry: &AuditEntry,
    ) -> Result<AgentStepped, StoreError> {
        let (attempt, phase, record) = match step {
            AgentStep::Start(start) => (start.attempt.as_str(), "started", to_json(start)?),
            AgentStep::End { attempt, end } => (attempt, "ended", to_json(end)?),
        };
        let (start_field, end_field) = fields(call_id);
        let args = script::AgentExec {
            start_field: &start_field,
            end_field: &end_field,
            attempt,
            phase,
            record: &record,
        };
        let (status, detail, queued) = self
            .on_run(&script::AGENT_EXEC, id, &args, |script, chain| {
                chain.args(script, std::slice::from_ref(entry));
                Ok(())
            })
            .await?;
        Ok(match status.as_str() {
            "ok" => AgentStepped::Written(queued),
            "repeat" => AgentStepped::Repeat(detail),
            "taken" => AgentStepped::Taken(from_json(&detail)?),
            "not_started" => AgentStepped::NotStarted,
            _ => AgentStepped::Missing,
        })
    }
}

impl Store {
    /// The record of the call `call_id` of run `id`, if an attempt claimed it.
    pub async fn agent_execution(
        &self,
        id: &RunId,
        call_id: &str,
    ) -> Result<Option<AgentExecution>, StoreError> {
        let (started, ended): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys.exec_key(id))
            .arg(fields(call_id))
            .query_async(&mut self.conn.clone())
            .await?;
        let Some(started) = started else {
            return Ok(None);
        };
        let ended = ended.map(|e| from_json(&e)).transpose()?;
        Ok(Some((from_json(&started)?, ended)))
    }
}

/// The fields of the run's execution record that hold the agent's claim of `call_id` and its
/// end: apart from the worker's own field of the call (named by the call id alone, which
/// holds no `:`).
fn fields(call_id: &str) -> (String, String) {
    (format!("agent:{call_id}"), format!("agent:{call_id}:end"))
}
