//! Every end-to-end test, in one binary (one link instead of one per file): each module is
//! one area, and every test starts its own servers and namespace.

mod authority_table;
mod bad_input;
mod browser;
mod cancel;
mod chaos;
mod cli;
mod decision_authority;
mod doors;
mod email;
mod error_shape;
mod escalation;
mod expiry;
mod inbox;
mod inbox_paging;
mod listener;
mod local_runner;
mod many_workers;
mod metrics;
mod nats;
mod outbox;
mod pause_and_resume;
mod probes;
mod providers_and_tools;
mod receipt_replay;
mod receipts;
mod redis_deployments;
mod restarts;
mod reviewers;
mod run_start;
mod slack;
mod start_race;
mod traces;
mod turn_calls;
mod unknown_outcome;
mod webhooks;
