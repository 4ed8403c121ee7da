//! The execution record of a run's calls: `started` before a side effect, its result after,
//! so a call never runs twice silently, and none starts once the run's lease is lost or its
//! cancel accepted.

use super::{StoreError, WorkerStore, from_json, to_json};
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

/// What the execution record holds of a call.
#[derive(Debug, PartialEq)]
pub enum Execution {
    /// An attempt started it and recorded no result (yet).
    Started,
    /// It finished, with the result the model is told.
    Finished(CallResult),
}

impl WorkerStore {
    /// Marks a call as started by the attempt `token` of `owner`, who holds the run's lease,
    /// or says what an earlier attempt left. A reply lost on the way (a Redis restart) is asked
    /// for again with the same token, so losing it does not make this attempt's own call look
    /// interrupted. Refused with [`StoreError::Cancelled`] once someone asked to cancel the
    /// run, and [`StoreError::LostLease`] when `owner` no longer holds it: nothing starts then.
    pub async fn exec_begin(
        &self,
        id: &RunId,
        owner: &str,
        call_id: &str,
        token: &str,
    ) -> Result<ExecBegin, StoreError> {
        let args = script::ExecBegin {
            owner,
            call_id,
            token,
        };
        let reply: Vec<String> = again(|| async {
            script::EXEC_BEGIN
                .invocation(None, &args)
                .key(self.keys.run_key(id))
                .key(self.keys.exec_key(id))
                .invoke_async(&mut self.conn.clone())
                .await
        })
        .await?;
        Ok(match reply[0].as_str() {
            "run" => ExecBegin::Run,
            "started" => ExecBegin::InterruptedBefore,
            "cancelled" => return Err(StoreError::Cancelled),
            "lost" => return Err(StoreError::LostLease(reply[1].clone())),
            _ => ExecBegin::Done(from_json(&reply[1])?),
        })
    }

    /// What the execution record holds of each of `calls`, in their order (`None`: never
    /// started).
    pub async fn executions(
        &self,
        id: &RunId,
        calls: &[&str],
    ) -> Result<Vec<Option<Execution>>, StoreError> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let values: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(self.keys.exec_key(id))
            .arg(calls)
            .query_async(&mut self.conn.clone())
            .await?;
        values
            .into_iter()
            .map(|v| match v {
                None => Ok(None),
                Some(v) if v.starts_with("started") => Ok(Some(Execution::Started)),
                Some(v) => Ok(Some(Execution::Finished(from_json(&v)?))),
            })
            .collect()
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
