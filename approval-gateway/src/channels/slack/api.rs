//! The few Slack Web API methods the gateway calls, as JSON `POST`s with the bot token.
//! Slack answers HTTP 200 with `{"ok": false, "error"}` for most failures, and HTTP 429 with
//! `Retry-After` (seconds) when a method is rate limited.

use crate::config::SlackConfig;
use countersign_runtime::redact::redact_error;
use serde_json::Value;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub(crate) enum SlackError {
    /// Worth trying again: transport errors, Slack's own failures.
    #[error("Slack unavailable: {0}")]
    Unavailable(String),
    /// Slack asked us to wait this long before calling `method` again.
    #[error("Slack rate limits {method}: retry after {retry_after:?}")]
    RateLimited {
        method: String,
        retry_after: Duration,
    },
    /// Slack refused the call.
    #[error("Slack refused {method}: {error}")]
    Refused { method: String, error: String },
}

/// Slack's errors for a message whose blocks or text it will not take as they are.
const CONTENT_ERRORS: [&str; 4] = [
    "invalid_blocks",
    "invalid_blocks_format",
    "msg_too_long",
    "msg_blocks_too_long",
];

impl SlackError {
    /// Slack's error code when it refused the message's content: a smaller message may pass.
    pub(crate) fn refused_content(&self) -> Option<&str> {
        match self {
            SlackError::Refused { error, .. } if CONTENT_ERRORS.contains(&error.as_str()) => {
                Some(error)
            }
            _ => None,
        }
    }
}

/// When `Retry-After` is missing or unreadable.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One call, one attempt.
pub(crate) async fn call(
    http: &reqwest::Client,
    slack: &SlackConfig,
    method: &str,
    body: &Value,
) -> Result<Value, SlackError> {
    let response = http
        .post(format!(
            "{}/{method}",
            slack.api_base_url.trim_end_matches('/')
        ))
        .bearer_auth(slack.bot_token.expose())
        .header("content-type", "application/json; charset=utf-8")
        .json(body)
        .send()
        .await
        .map_err(|e| SlackError::Unavailable(redact_error(e).to_string()))?;
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let rate_limited = |retry_after: Option<Duration>| SlackError::RateLimited {
        method: method.to_string(),
        retry_after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
    };
    if status.as_u16() == 429 {
        return Err(rate_limited(retry_after));
    }
    if status.is_server_error() {
        return Err(SlackError::Unavailable(format!("HTTP {status}")));
    }
    let answer: Value = response
        .json()
        .await
        .map_err(|e| SlackError::Unavailable(redact_error(e).to_string()))?;
    if answer["ok"] == true {
        return Ok(answer);
    }
    match answer["error"].as_str().unwrap_or("unknown") {
        "ratelimited" | "rate_limited" => Err(rate_limited(retry_after)),
        error => Err(SlackError::Refused {
            method: method.to_string(),
            error: error.to_string(),
        }),
    }
}

/// The longest rate limit a delivery waits out itself. Longer ones go back to the delivery
/// queue, whose messages must be acknowledged within 30 seconds.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(15);

/// Like `call`, but when Slack rate limits it for at most `MAX_WAIT`, waits as long as Slack
/// asked and tries once more. For deliveries, not for answers to clicks (those have three
/// seconds).
pub(crate) async fn call_patiently(
    http: &reqwest::Client,
    slack: &SlackConfig,
    method: &str,
    body: &Value,
) -> Result<Value, SlackError> {
    match call(http, slack, method, body).await {
        Err(SlackError::RateLimited { retry_after, .. }) if retry_after <= MAX_WAIT => {
            tracing::info!(
                method,
                ?retry_after,
                "Slack rate limited a call; waiting as asked"
            );
            tokio::time::sleep(retry_after).await;
            call(http, slack, method, body).await
        }
        other => other,
    }
}
