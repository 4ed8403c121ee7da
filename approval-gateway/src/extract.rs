//! Request extractors that answer in the API's error format: the caller behind the bearer
//! key, query strings (a malformed one is a 400), and JSON bodies (malformed JSON is a 400, an
//! oversized body a 413).

use crate::config::Role;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::http::request::Parts;
use bytes::Bytes;
use countersign_shared::digest::sha256_hex;
use countersign_shared::signing::{SignatureError, TOLERANCE_SECS};
use serde::de::DeserializeOwned;

/// Who is calling, from `Authorization: Bearer <key>`.
#[derive(Clone, Debug)]
pub struct Caller {
    pub principal: String,
    pub role: Role,
    /// Principals this caller may decide for besides itself (`*`: anyone).
    pub speaks_for: Vec<String>,
}

/// What a route needs the caller to be allowed.
#[derive(Clone, Copy, Debug)]
pub enum Permission {
    Read,
    Start,
    Decide,
}

impl Caller {
    /// The principal a decision is made by: the caller itself, or one it may speak for.
    pub fn deciding_as(&self, named: Option<&str>) -> Result<String, ApiError> {
        self.speaking_as(named, "decide")
    }

    /// The caller's own principal, or `named` if the caller may speak for them; `what` says
    /// what was attempted, for the refusal.
    pub fn speaking_as(&self, named: Option<&str>, what: &str) -> Result<String, ApiError> {
        match named {
            None => Ok(self.principal.clone()),
            Some(p) if p == self.principal => Ok(p.to_string()),
            Some(p) if self.speaks_for.iter().any(|s| s == "*" || s == p) => Ok(p.to_string()),
            Some(p) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "the key of {} may not {what} on behalf of {p}",
                    self.principal
                ),
            )),
        }
    }

    pub fn require(&self, permission: Permission) -> Result<(), ApiError> {
        let allowed = matches!(
            (self.role, permission),
            (Role::Admin, _)
                | (_, Permission::Read)
                | (Role::Requester, Permission::Start)
                | (Role::Reviewer, Permission::Decide)
        );
        if allowed {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "the key of {} ({:?}) may not {permission:?}",
                    self.principal, self.role
                )
                .to_lowercase(),
            ))
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let unauthorized = |message: &str| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                message.to_string(),
            )
        };
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing Authorization: Bearer <key>"))?;
        let key = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| unauthorized("the Authorization header must be Bearer <key>"))?;
        state
            .caller_for(key.trim())
            .ok_or_else(|| unauthorized("unknown API key"))
    }
}

/// A query string parsed with the API's own errors.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        serde_urlencoded::from_str(parts.uri.query().unwrap_or_default())
            .map(QueryParams)
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_query",
                    format!("invalid query string: {e}"),
                )
            })
    }
}

/// A JSON body parsed with the API's own errors.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> JsonBody<T> {
    /// Parses bytes already read, with the API's errors.
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        parse_json(bytes).map(JsonBody)
    }
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = read_body(req, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// A JSON body and who sent it: the holder of a bearer key, or, for a request with no
/// `Authorization` header, a configured sender whose Standard Webhooks signature over the
/// raw body verifies. The body is parsed only after the sender is known. A signed request's
/// `webhook-id` is remembered for the signature's tolerance window: the same request again is
/// let through (it is a retry), the same id with another body is refused.
pub struct Authenticated<T> {
    pub caller: Caller,
    /// Whether the body was signed (so only what it says is vouched for, not the path).
    pub signed: bool,
    pub body: T,
}

impl<T: DeserializeOwned> FromRequest<AppState> for Authenticated<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
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

async fn signed_caller(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Caller, ApiError> {
    let unauthorized =
        |message: String| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(timestamp), Some(signature)) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    ) else {
        return Err(unauthorized(SignatureError::MissingHeader.to_string()));
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
                    return Err(unauthorized(format!(
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
    Err(unauthorized(format!(
        "the webhook signature was refused: {error}"
    )))
}

async fn read_body(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        let status = rejection.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else {
            "bad_request"
        };
        ApiError::new(status, code, rejection.body_text())
    })
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("invalid JSON body: {e}"),
        )
    })
}
