//! The API's errors: each decides its status code and says what is wrong, as
//! `{"error": {"code", "message", "refusal"?, "details"?}}` (`refusal`: for a refused decision,
//! its exact `RefusalCode`, where `code` is the broader, stable class). Internal failures
//! never leak their cause.
//!
//! This is the one place where a domain's error becomes an HTTP answer: the `From` impls
//! below are the table of status codes and `code` strings (the domains themselves know
//! nothing of HTTP).

use crate::auth::error::AuthError;
use crate::decide::error::DecideError;
use crate::runs::RunError;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
    /// A refused decision's exact code, as the decision script and the metric name it.
    pub(crate) refusal: Option<&'static str>,
    /// Seconds the client should wait before trying again (`Retry-After`).
    pub(crate) retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: None,
            refusal: None,
            retry_after: None,
        }
    }

    pub(crate) fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The message with the listed `details.errors` after it, for pages and modals that
    /// show one line to a person.
    pub(crate) fn explained(&self) -> String {
        let listed: Vec<&str> = self
            .details
            .as_ref()
            .and_then(|d| d["errors"].as_array())
            .map(|list| list.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if listed.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.message, listed.join("; "))
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    pub(crate) fn invalid_cursor(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_cursor", message)
    }

    pub(crate) fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            message,
        )
    }

    /// One stream more than a cap on live events streams allows (see `crate::live`).
    pub(crate) fn too_many_streams(message: impl Into<String>, retry_after_secs: u64) -> Self {
        let mut error = Self::new(StatusCode::TOO_MANY_REQUESTS, "too_many_streams", message);
        error.retry_after = Some(retry_after_secs);
        error
    }

    pub(crate) fn body_timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", message)
    }

    /// An answer of axum's own (a rejection, a fallback) rewritten in the API's format, with
    /// the code its status stands for.
    pub(crate) fn for_status(status: StatusCode, message: impl Into<String>) -> Self {
        let code = match status {
            StatusCode::BAD_REQUEST => "bad_request",
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
            s if s.is_server_error() => "internal",
            _ => "error",
        };
        Self::new(status, code, message)
    }

    /// Logs the cause and answers 503: Redis or NATS is unreachable or misbehaving, and a
    /// retry later may work.
    pub(crate) fn unavailable(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "backend failure");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the service cannot reach its state store or message bus; try again",
        )
    }
}

impl ApiError {
    /// What the answer's `error` holds: `{code, message, details?}`.
    pub(crate) fn body(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(refusal) = self.refusal {
            error["refusal"] = refusal.into();
        }
        if let Some(details) = &self.details {
            error["details"] = details.clone();
        }
        error
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "error": self.body() }))).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

impl From<countersign_store::StoreError> for ApiError {
    fn from(e: countersign_store::StoreError) -> Self {
        Self::unavailable(e)
    }
}

impl From<countersign_runtime::bus::BusError> for ApiError {
    fn from(e: countersign_runtime::bus::BusError) -> Self {
        Self::unavailable(e)
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthorized(m) => Self::new(StatusCode::UNAUTHORIZED, "unauthorized", m),
            AuthError::Forbidden(m) => Self::new(StatusCode::FORBIDDEN, "forbidden", m),
            AuthError::InvalidQuery(m) => Self::new(StatusCode::BAD_REQUEST, "invalid_query", m),
            AuthError::InvalidHeader(m) => Self::new(StatusCode::BAD_REQUEST, "bad_request", m),
            AuthError::InvalidJson(m) => Self::new(StatusCode::BAD_REQUEST, "invalid_json", m),
            AuthError::Body(StatusCode::PAYLOAD_TOO_LARGE, m) => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", m)
            }
            AuthError::Body(status, m) => Self::new(status, "bad_request", m),
            AuthError::Backend(e) => Self::unavailable(e),
        }
    }
}

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

impl From<crate::grants::RevokeError> for ApiError {
    fn from(e: crate::grants::RevokeError) -> Self {
        use crate::grants::RevokeError;
        match e {
            RevokeError::NoGrant(_) => Self::not_found(e.to_string()),
            RevokeError::NotAllowed(..) => {
                Self::new(StatusCode::FORBIDDEN, "forbidden", e.to_string())
            }
            RevokeError::Store(cause) => Self::unavailable(cause),
        }
    }
}

impl From<DecideError> for ApiError {
    fn from(e: DecideError) -> Self {
        match e {
            DecideError::BadInput(m) => Self::bad_request(m),
            DecideError::InvalidEdit { message, errors } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
                    .with_details(json!({ "errors": errors }))
            }
            DecideError::NoRun(m) => Self::not_found(m),
            DecideError::GrantRefused(m) => Self::new(StatusCode::FORBIDDEN, "grant_refused", m),
            DecideError::ConditionLimit(m) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "condition_too_costly", m)
            }
            DecideError::Backend(cause) => Self::unavailable(cause),
            DecideError::Refused {
                code,
                status,
                api_code,
                message,
                recorded,
            } => {
                let mut error = Self::new(status, api_code, message);
                error.refusal = Some(code.as_str());
                match recorded {
                    // Whoever is refused sees the decision that stands, never its receipt.
                    Some(decision) if !decision.expired => error.with_details(json!({
                        "decision": crate::view::decision_view(
                            &decision,
                            crate::view::Receipts::Withheld,
                        ),
                    })),
                    _ => error,
                }
            }
        }
    }
}

impl From<RunError> for ApiError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::NoRun(m) => Self::not_found(m),
            RunError::Finished(m) => Self::conflict("finished", m),
            RunError::IdempotencyKeyReused(m) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                m,
            ),
            RunError::Backend(cause) => Self::unavailable(cause),
        }
    }
}
