//! The execution record of a run's calls: `started` before a side effect, its result after,
//! so an approved call never runs twice silently.

use super::{Store, StoreError, from_json, to_json};
use crate::script;
use countersign_model::run::{CallResult, RunId};

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
    /// Marks an approved call as started by the attempt `token`, or says what an earlier
    /// attempt left. A reply lost on the way (a Redis restart) is asked for again with the same
    /// token, so losing it does not make this attempt's own call look interrupted.
    pub async fn exec_begin(
        &self,
        id: &RunId,
        call_id: &str,
        token: &str,
    ) -> Result<ExecBegin, StoreError> {
        let reply: Vec<String> = again(|| async {
            script::EXEC_BEGIN
                .invocation(None, &script::ExecBegin { call_id, token })
                .key(self.keys.exec_key(id))
                .invoke_async(&mut self.conn.clone())
                .await
        })
        .await?;
        Ok(match reply[0].as_str() {
            "run" => ExecBegin::Run,
            "started" => ExecBegin::InterruptedBefore,
            _ => ExecBegin::Done(from_json(&reply[1])?),
        })
    }

    /// Whether an attempt has started the call (its side effect may have happened), so it is
    /// not to be asked about again.
    pub async fn exec_started(&self, id: &RunId, call_id: &str) -> Result<bool, StoreError> {
        let started: bool = redis::cmd("HEXISTS")
            .arg(self.keys.exec_key(id))
            .arg(call_id)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(started)
    }

    /// Records the result of a call marked started (asked again if the reply is lost: the
    /// write is the same each time).
    pub async fn exec_finish(
        &self,
        id: &RunId,
        call_id: &str,
        result: &CallResult,
    ) -> Result<(), StoreError> {
        let result = to_json(result)?;
        let _: i64 = again(|| async {
            redis::cmd("HSET")
                .arg(self.keys.exec_key(id))
                .arg(call_id)
                .arg(&result)
                .query_async(&mut self.conn.clone())
                .await
        })
        .await?;
        Ok(())
    }
}

/// Runs a write that is safe to repeat up to five times, a second apart, while Redis fails.
async fn again<T, F, Fut>(mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(e) if attempt < 5 => {
                tracing::warn!(error = %e, attempt, "execution record not written yet; asking again");
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
