//! Where people are asked and told, outbound only: one module per channel, behind the
//! contract in `delivery`. What comes back (Slack's clicks, email's link pages) comes in
//! through its door (`crate::doors`).

pub(crate) mod delivery;
pub(crate) mod email;
pub(crate) mod granted;
pub(crate) mod slack;
pub(crate) mod webhook;
