//! Windows' shares (see [`countersign_model::window`]): each window and key is a sorted set
//! of the calls counted (scored by when) and a hash of their amounts, both in the window's own
//! Cluster slot, so adding a share and reading the total of the others is one script.

use super::{Store, StoreError};
use crate::script;
use countersign_model::window::Share;

impl Store {
    /// Adds `run_id`'s call `call_id`'s `share` (or sets it again, counted from now) and sets
    /// its `before` to the total of every other share in the window.
    pub async fn add_share(
        &self,
        run_id: &str,
        call_id: &str,
        share: &mut Share,
    ) -> Result<(), StoreError> {
        share.member = format!("{run_id}|{call_id}");
        let args = script::WindowAdd {
            member: &share.member,
            amount: &share.amount.to_string(),
            over_ms: share.over_ms,
        };
        let before: String = script::WINDOW_ADD
            .invocation(None, &args)
            .key(self.keys.window_entries_key(&share.id))
            .key(self.keys.window_amounts_key(&share.id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        share.before = before
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("a window's total read {before:?}")))?;
        Ok(())
    }

    /// Gives back a call's `share` (as [`Store::add_share`] left it): the call did not run.
    pub async fn remove_share(&self, share: &Share) -> Result<(), StoreError> {
        let args = script::WindowMember {
            member: &share.member,
        };
        let _: i64 = script::WINDOW_REMOVE
            .invocation(None, &args)
            .key(self.keys.window_entries_key(&share.id))
            .key(self.keys.window_amounts_key(&share.id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}
