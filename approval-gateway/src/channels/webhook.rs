//! Outbound webhooks: `POST {type, timestamp, data}` signed per Standard Webhooks. Only a
//! 2xx answer counts; redirects are not followed; 410 means the endpoint is gone. A webhook
//! gets every event whole, so it has no verbs: it forwards.

use super::delivery::{Delivery, DeliveryError};
use crate::state::AppState;
use countersign_runtime::redact::redact_error;
use serde_json::json;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(15);

/// Posts the delivery's event to the webhook called `name`.
pub(crate) async fn forward(
    state: &AppState,
    name: &str,
    delivery: &Delivery,
) -> Result<(), DeliveryError> {
    let Some(hook) = state.config.webhooks.iter().find(|h| h.name == name) else {
        return Err(DeliveryError::GiveUp(format!(
            "no webhook named {name:?} is configured"
        )));
    };
    let event_type = serde_json::to_value(&delivery.event)
        .ok()
        .and_then(|v| v["type"].as_str().map(String::from))
        .unwrap_or_default();
    let body = json!({"type": event_type, "timestamp": delivery.timestamp, "data": delivery.event})
        .to_string();
    let now = chrono::Utc::now().timestamp();
    let signature = hook.secret.sign(&delivery.id, now, body.as_bytes());
    let response = state
        .http
        .post(&hook.url)
        .timeout(TIMEOUT)
        .header("content-type", "application/json")
        .header("webhook-id", &delivery.id)
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await
        .map_err(|e| DeliveryError::Retry(redact_error(e).to_string()))?;
    match response.status() {
        s if s.is_success() => Ok(()),
        s if s == reqwest::StatusCode::GONE => Err(DeliveryError::GiveUp("HTTP 410 Gone".into())),
        s => Err(DeliveryError::Retry(format!("HTTP {s}"))),
    }
}
