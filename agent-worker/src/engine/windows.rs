//! A call's shares of its policy's windows (see [`countersign_model::window`]): added before
//! the policy decides the call, so it reads the totals before it and two calls at once cannot
//! both slip under a limit; counted again from when a held call runs (with an edit's input);
//! given back when a held call does not run.

use super::Engine;
use crate::agents::RunnableAgent;
use countersign_model::policy::Gate;
use countersign_model::run::Run;
use countersign_model::window::{self, Facts, Share};
use countersign_store::StoreError;
use serde_json::Value;

impl Engine {
    /// What `tool`'s policy says of `run`'s call `call_id` with `input`, and the shares it
    /// added to the policy's windows (none without windows; none when one cannot be read:
    /// then the call waits, and the reviewer is told why).
    pub(super) async fn sort_call(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        tool: &str,
        call_id: &str,
        input: &Value,
    ) -> Result<(Gate, Vec<Share>), StoreError> {
        let policy = &agent.policies[tool];
        if !policy.has_windows() {
            return Ok((policy.gate(input, &run.metadata), Vec::new()));
        }
        let mut shares = match policy.shares(&run.agent, &self.facts(run, input)) {
            Ok(shares) => shares,
            Err(why) => return Ok((policy.unreadable(&why), Vec::new())),
        };
        for share in &mut shares {
            self.store
                .add_share(run.run_id.as_str(), call_id, share)
                .await?;
        }
        let gate = policy.gate_with(input, &run.metadata, &window::totals(&shares));
        Ok((gate, shares))
    }

    /// Counts the shares of a held call that runs now, with `input` (an edit's, if edited),
    /// from now, and gives back those of `counted` (its shares so far) it no longer has: the
    /// new ones are added first, so no total is ever lower than what ran.
    pub(super) async fn count_run(
        &self,
        run: &Run,
        agent: &RunnableAgent,
        (tool, call_id): (&str, &str),
        input: &Value,
        counted: &[Share],
    ) -> Result<(), StoreError> {
        let policy = &agent.policies[tool];
        if !policy.has_windows() {
            return Ok(());
        }
        // A share that cannot be read for the input that runs keeps what was counted.
        let Ok(mut shares) = policy.shares(&run.agent, &self.facts(run, input)) else {
            return Ok(());
        };
        for share in &mut shares {
            self.store
                .add_share(run.run_id.as_str(), call_id, share)
                .await?;
        }
        self.give_back(&not_among(counted, &shares)).await
    }

    /// Gives back `shares` of a call that did not run.
    pub(super) async fn give_back(&self, shares: &[Share]) -> Result<(), StoreError> {
        for share in shares {
            self.store.remove_share(share).await?;
        }
        Ok(())
    }

    fn facts<'a>(&self, run: &'a Run, input: &'a Value) -> Facts<'a> {
        Facts {
            input,
            metadata: &run.metadata,
            requester: run.requested_by.as_deref().unwrap_or(""),
        }
    }
}

/// The shares of `old` that `new` does not count again (another window, or another id).
pub(super) fn not_among(old: &[Share], new: &[Share]) -> Vec<Share> {
    old.iter()
        .filter(|o| !new.iter().any(|n| n.id == o.id && n.member == o.member))
        .cloned()
        .collect()
}
