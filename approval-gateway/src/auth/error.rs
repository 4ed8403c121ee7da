//! Why a request was not let in, or could not be read.

use axum::http::StatusCode;

#[derive(Debug, thiserror::Error)]
pub(crate) enum AuthError {
    /// No credential, or one that does not hold (unknown key, bad or reused signature).
    #[error("{0}")]
    Unauthorized(String),
    /// The caller is known but may not do this.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    InvalidQuery(String),
    /// A header the route reads is malformed.
    #[error("{0}")]
    InvalidHeader(String),
    #[error("{0}")]
    InvalidJson(String),
    /// The body could not be read (too large, cut off), with axum's status for it.
    #[error("{1}")]
    Body(StatusCode, String),
    /// Redis did not answer while a signed request's id was remembered.
    #[error("{0}")]
    Backend(#[from] countersign_store::StoreError),
}
