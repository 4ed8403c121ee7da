//! Senders that sign their requests per Standard Webhooks instead of holding a key. A
//! signed request's `webhook-id` is remembered for twice the signature's tolerance window:
//! the same request again is let through (it is a retry), the same id with another body is
//! refused.

use super::caller::Caller;
use super::error::AuthError;
use crate::config::Role;
use crate::state::AppState;
use axum::http::HeaderMap;
use countersign_model::digest::sha256_hex;
use countersign_runtime::signing::{SignatureError, TOLERANCE_SECS};

/// The configured sender whose signature over `body` verifies, as a caller.
pub(super) async fn signed_caller(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Caller, AuthError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(timestamp), Some(signature)) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    ) else {
        return Err(AuthError::Unauthorized(
            SignatureError::MissingHeader.to_string(),
        ));
    };
    let now = chrono::Utc::now().timestamp();
    let mut error = SignatureError::Mismatch;
    for sender in &state.config.signed_senders {
        match sender.secret.verify(id, timestamp, signature, body, now) {
            Ok(()) => {
                let seen = state
                    .store
                    .remember_webhook_id(
                        &sender.name,
                        id,
                        &sha256_hex(body),
                        std::time::Duration::from_secs(2 * TOLERANCE_SECS as u64),
                    )
                    .await?;
                if seen.is_some_and(|first| first != sha256_hex(body)) {
                    return Err(AuthError::Unauthorized(format!(
                        "webhook-id {id:?} was used before for another request"
                    )));
                }
                return Ok(Caller {
                    principal: sender.name.clone(),
                    role: Role::Reviewer,
                    speaks_for: sender.speaks_for.clone(),
                });
            }
            Err(e) => error = e,
        }
    }
    Err(AuthError::Unauthorized(format!(
        "the webhook signature was refused: {error}"
    )))
}
