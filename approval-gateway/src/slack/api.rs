//! The few Slack Web API methods the gateway calls, as JSON `POST`s with the bot token.
//! Slack answers HTTP 200 with `{"ok": false, "error"}` for most failures.

use crate::config::SlackConfig;
use countersign_shared::redact::redact_error;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum SlackError {
    /// Worth trying again: transport errors, rate limits, Slack's own failures.
    #[error("Slack unavailable: {0}")]
    Unavailable(String),
    /// Slack refused the call.
    #[error("Slack refused {method}: {error}")]
    Refused { method: String, error: String },
}

pub async fn call(
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
    if status.as_u16() == 429 || status.is_server_error() {
        return Err(SlackError::Unavailable(format!("HTTP {status}")));
    }
    let answer: Value = response
        .json()
        .await
        .map_err(|e| SlackError::Unavailable(redact_error(e).to_string()))?;
    if answer["ok"] == true {
        Ok(answer)
    } else {
        Err(SlackError::Refused {
            method: method.to_string(),
            error: answer["error"].as_str().unwrap_or("unknown").to_string(),
        })
    }
}
