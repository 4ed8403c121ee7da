//! Request extractors that answer in the API's error format: the caller behind the bearer
//! key, and JSON bodies (malformed JSON is a 400, an oversized body a 413).

use crate::config::Role;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use bytes::Bytes;
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
        match named {
            None => Ok(self.principal.clone()),
            Some(p) if p == self.principal => Ok(p.to_string()),
            Some(p) if self.speaks_for.iter().any(|s| s == "*" || s == p) => Ok(p.to_string()),
            Some(p) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "the key of {} may not decide on behalf of {p}",
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

/// A JSON body parsed with the API's own errors.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            let status = rejection.status();
            let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "body_too_large"
            } else {
                "bad_request"
            };
            ApiError::new(status, code, rejection.body_text())
        })?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("invalid JSON body: {e}"),
            )
        })
    }
}
