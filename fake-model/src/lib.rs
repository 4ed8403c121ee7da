//! A local stand-in for the LLM APIs that speaks their real wire formats: Anthropic's
//! `POST /v1/messages` and OpenAI's `POST /chat/completions`. What it answers comes from a
//! brain: a test's function of each request, or a script's turns (the `*.script.toml` format
//! the worker's `scripted` provider plays in-process). A request asking for a stream gets the
//! same answer streamed in that API's server-sent events. The tests keep every request for
//! their assertions; the benchmark runs it keeping none.
//!
//! A crate of its own, light, so that the benchmark can use it without the tests' harness.

mod brain;
mod refund;
mod reviewer;
mod server;
mod wire;

pub use brain::{Brain, Turns};
pub use refund::{REFUND_ANSWER, REFUND_SCRIPT, refund_brain};
pub use reviewer::{reviewed_call, verdict};
pub use server::FakeModel;
pub use wire::{
    anthropic_message, anthropic_text, anthropic_tool_use, first_user_text, last_results,
    openai_answer, openai_message, turn,
};
