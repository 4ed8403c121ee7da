//! HTTP tools: `POST` the input as JSON with the call's `Idempotency-Key`; an approved call
//! carries its receipt in `Countersign-Receipt`, and a tool that verifies receipts and refuses
//! one says so in `WWW-Authenticate` (scheme `Countersign-Receipt`).

use super::{Answer, RECEIPT_HEADER, ToolCall, bounded, idempotency_key};
use countersign_model::agent::{HttpToolDef, ToolDef};
use countersign_model::run::{CallOutcome, CallResult};
use countersign_runtime::redact::redact_error;
use std::time::Duration;

/// Runs one call; `outcome` is what a success is reported as (executed, approved, edited).
pub(super) async fn call(
    http: &reqwest::Client,
    tool: &ToolDef,
    endpoint: &HttpToolDef,
    call: &ToolCall<'_>,
    outcome: CallOutcome,
) -> Answer {
    let mut request = http
        .post(&endpoint.url)
        .header(
            "Idempotency-Key",
            idempotency_key(call.run, call.turn, call.call_id),
        )
        .timeout(Duration::from_millis(endpoint.timeout_ms))
        .json(call.input);
    if let Some(receipt) = call.receipt {
        request = request.header(RECEIPT_HEADER, receipt);
    }
    let response = request.send().await;
    let mut receipt_refused = None;
    let result = match response {
        Err(e) if e.is_timeout() => CallResult::failed(format!(
            "The tool {} did not answer within {} ms.",
            tool.name, endpoint.timeout_ms
        )),
        Err(e) => CallResult::failed(format!(
            "The tool {} could not be reached: {}",
            tool.name,
            redact_error(e)
        )),
        Ok(response) => {
            let status = response.status();
            receipt_refused = response
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .filter(|v| {
                    status == reqwest::StatusCode::UNAUTHORIZED && v.starts_with(RECEIPT_HEADER)
                })
                .map(str::to_string);
            let body = response.text().await.unwrap_or_default();
            let body = bounded(&body);
            if status.is_success() {
                CallResult {
                    outcome,
                    content: body,
                    is_error: false,
                    images: Vec::new(),
                    mcp: None,
                }
            } else {
                CallResult::failed(format!(
                    "The tool {} answered HTTP {status}: {body}",
                    tool.name
                ))
            }
        }
    };
    Answer {
        result,
        receipt_refused,
    }
}
