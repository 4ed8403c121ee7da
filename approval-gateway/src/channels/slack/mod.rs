//! Slack, outbound: approval requests are posted to channels (`slack:#channel`) with Approve,
//! Reject and Edit buttons (`deliver`, with the messages built in `blocks`), and every
//! decision, from any channel, updates the message. Clicks come back through the Slack door
//! (`crate::doors::slack`).

pub(crate) mod api;
pub(crate) mod blocks;
mod deliver;

pub(crate) use deliver::Slack;
