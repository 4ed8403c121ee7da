//! The execution record of a run's calls: `started` before a side effect, its result after,
//! so an approved call never runs twice silently.

use super::{Store, StoreError, from_json, to_json};
use crate::run::{CallResult, RunId};
use std::sync::LazyLock;

static EXEC_BEGIN: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../lua/exec_begin.lua")));

/// What the execution record says about an approved call about to run.
#[derive(Debug, PartialEq)]
pub enum ExecBegin {
    /// First attempt: marked started, run it now.
    Run,
    /// An earlier attempt started and never recorded a result.
    InterruptedBefore,
    /// An earlier attempt finished with this result.
    Done(CallResult),
}

impl Store {
    /// Marks an approved call as started, or says what an earlier attempt left.
    pub async fn exec_begin(&self, id: &RunId, call_id: &str) -> Result<ExecBegin, StoreError> {
        let reply: Vec<String> = EXEC_BEGIN
            .key(self.names.exec_key(id))
            .arg(call_id)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(match reply[0].as_str() {
            "run" => ExecBegin::Run,
            "started" => ExecBegin::InterruptedBefore,
            _ => ExecBegin::Done(from_json(&reply[1])?),
        })
    }
    /// Records the result of a call marked started.
    pub async fn exec_finish(
        &self,
        id: &RunId,
        call_id: &str,
        result: &CallResult,
    ) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("HSET")
            .arg(self.names.exec_key(id))
            .arg(call_id)
            .arg(to_json(result)?)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}
