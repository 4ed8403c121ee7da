//! Where people are asked and told: one module per channel, behind the contract in
//! `delivery`. Slack and email each keep their inbound side (Slack's interactivity endpoint,
//! email's link pages) in their own folder, since it shares their message formats and tokens
//! and nothing else does.

pub(crate) mod delivery;
pub(crate) mod email;
pub(crate) mod granted;
pub mod slack;
pub(crate) mod webhook;
