//! Request extractors that answer in the API's error format: the caller behind the bearer
//! key, query strings (a malformed one is a 400), and JSON bodies (malformed JSON is a 400, an
//! oversized body a 413).

use super::caller::Caller;
use super::error::AuthError;
use super::signed::signed_caller;
use crate::state::AppState;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;

impl FromRequestParts<AppState> for Caller {
    type Rejection = AuthError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AuthError> {
        let unauthorized = |message: &str| AuthError::Unauthorized(message.to_string());
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing Authorization: Bearer <key>"))?;
        let key = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| unauthorized("the Authorization header must be Bearer <key>"))?;
        let key = state
            .api_key(key.trim())
            .ok_or_else(|| unauthorized("unknown API key"))?;
        Ok(Caller {
            principal: key.principal.clone(),
            role: key.role,
            speaks_for: key.speaks_for.clone(),
        })
    }
}

/// A query string parsed with the API's own errors.
pub(crate) struct QueryParams<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = AuthError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AuthError> {
        serde_urlencoded::from_str(parts.uri.query().unwrap_or_default())
            .map(QueryParams)
            .map_err(|e| AuthError::InvalidQuery(format!("invalid query string: {e}")))
    }
}

/// The request's `Idempotency-Key`, if it has one: 1 to 255 visible ASCII characters.
pub(crate) struct IdempotencyKey(pub(crate) Option<String>);

const MAX_IDEMPOTENCY_KEY: usize = 255;

impl<S: Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = AuthError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AuthError> {
        let Some(key) = parts.headers.get("idempotency-key") else {
            return Ok(IdempotencyKey(None));
        };
        key.to_str()
            .ok()
            .filter(|k| !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY)
            .map(|k| IdempotencyKey(Some(k.to_string())))
            .ok_or_else(|| {
                AuthError::InvalidHeader(
                    "Idempotency-Key must be 1 to 255 visible ASCII characters".into(),
                )
            })
    }
}

/// A JSON body parsed with the API's own errors.
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned> JsonBody<T> {
    /// Parses bytes already read, with the API's errors.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, AuthError> {
        parse_json(bytes).map(JsonBody)
    }
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = AuthError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, AuthError> {
        let bytes = read_body(req, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// A JSON body and who sent it: the holder of a bearer key, or, for a request with no
/// `Authorization` header, a configured sender whose Standard Webhooks signature over the
/// raw body verifies. The body is parsed only after the sender is known. A signed request's
/// `webhook-id` is remembered for the signature's tolerance window: the same request again is
/// let through (it is a retry), the same id with another body is refused.
pub(crate) struct Authenticated<T> {
    pub(crate) caller: Caller,
    /// Whether the body was signed (so only what it says is vouched for, not the path).
    pub(crate) signed: bool,
    pub(crate) body: T,
}

impl<T: DeserializeOwned> FromRequest<AppState> for Authenticated<T> {
    type Rejection = AuthError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, AuthError> {
        let (mut parts, body) = req.into_parts();
        let signed = !parts
            .headers
            .contains_key(axum::http::header::AUTHORIZATION)
            && parts.headers.contains_key("webhook-signature");
        let by_key = if signed {
            None
        } else {
            Some(Caller::from_request_parts(&mut parts, state).await?)
        };
        let headers = parts.headers.clone();
        let bytes = read_body(Request::from_parts(parts, body), state).await?;
        let caller = match by_key {
            Some(caller) => caller,
            None => signed_caller(state, &headers, &bytes).await?,
        };
        Ok(Self {
            caller,
            signed,
            body: parse_json(&bytes)?,
        })
    }
}

async fn read_body(req: Request, state: &AppState) -> Result<Bytes, AuthError> {
    Bytes::from_request(req, state)
        .await
        .map_err(|rejection| AuthError::Body(rejection.status(), rejection.body_text()))
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, AuthError> {
    serde_json::from_slice(bytes)
        .map_err(|e| AuthError::InvalidJson(format!("invalid JSON body: {e}")))
}
