//! Slack: approval requests are posted to channels (`slack:#channel`) with Approve, Reject
//! and Edit buttons (`deliver`, with the messages built in `blocks`); clicks and modal
//! submissions come back to `POST /slack/interactions` (`interactions`), signed by Slack
//! (`signature`), and every decision, from any channel, updates the message.

mod api;
mod blocks;
mod deliver;
mod interactions;
pub mod signature;

pub(crate) use deliver::Slack;
pub(crate) use interactions::router;
