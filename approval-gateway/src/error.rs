//! The API's errors: each decides its status code and says what is wrong, as
//! `{"error": {"code", "message", "details"?}}`. Internal failures never leak their cause.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The message with the listed `details.errors` after it, for pages and modals that
    /// show one line to a person.
    pub fn explained(&self) -> String {
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

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// Logs the cause and answers 503: Redis or NATS is unreachable or misbehaving, and a
    /// retry later may work.
    pub fn unavailable(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "backend failure");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the service cannot reach its state store or message bus; try again",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(details) = self.details {
            error["details"] = details;
        }
        (self.status, Json(json!({ "error": error }))).into_response()
    }
}

impl From<countersign_shared::store::StoreError> for ApiError {
    fn from(e: countersign_shared::store::StoreError) -> Self {
        Self::unavailable(e)
    }
}

impl From<countersign_shared::bus::BusError> for ApiError {
    fn from(e: countersign_shared::bus::BusError) -> Self {
        Self::unavailable(e)
    }
}
