//! Who is calling: API keys, senders that sign their requests per Standard Webhooks, and the
//! extractors that give a handler its caller and body with the API's own errors.

mod caller;
pub(crate) mod error;
mod extract;
mod signed;

pub(crate) use caller::{Caller, Permission};
pub(crate) use extract::{Authenticated, IdempotencyKey, JsonBody, QueryParams};
