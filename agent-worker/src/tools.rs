//! Calling HTTP tools: `POST` the input as JSON with an `Idempotency-Key` made of the run, the
//! turn and the call id, so a tool that honours it never applies one call twice, nor takes two
//! calls for one (as it could if a model numbered its calls afresh each turn). A non-2xx
//! answer or a timeout is an error result for the model, never a crash. An approved call
//! carries its countersignature receipt in `Countersign-Receipt`; a tool that verifies
//! receipts and refuses one says so in `WWW-Authenticate` (scheme `Countersign-Receipt`).

use countersign_model::agent::ToolDef;
use countersign_model::run::{CallOutcome, CallResult, RunId};
use countersign_runtime::redact::redact_error;
use std::time::Duration;

/// The most of a tool's answer passed on to the model.
const MAX_RESULT_CHARS: usize = 16_000;

pub fn idempotency_key(run: &RunId, turn: u32, call_id: &str) -> String {
    format!("{run}:{turn}:{call_id}")
}

/// The header an approved call's receipt travels in.
pub const RECEIPT_HEADER: &str = "Countersign-Receipt";

/// What a tool answered.
pub struct Answer {
    pub result: CallResult,
    /// Set when the tool refused the call's receipt (or its lack of one): the
    /// `WWW-Authenticate` challenge it answered with.
    pub receipt_refused: Option<String>,
}

/// One call as its tool receives it.
pub struct ToolCall<'a> {
    pub run: &'a RunId,
    pub turn: u32,
    pub call_id: &'a str,
    pub input: &'a serde_json::Value,
    /// The receipt of the decision that approved it; none for a call the policy let through.
    pub receipt: Option<&'a str>,
}

/// Runs one call; `outcome` is what a success is reported as (executed, approved, edited).
#[tracing::instrument(name = "tool.call", skip_all, fields(tool = %tool.name, call_id = call.call_id))]
pub async fn call_http(
    http: &reqwest::Client,
    tool: &ToolDef,
    call: &ToolCall<'_>,
    outcome: CallOutcome,
) -> Answer {
    let mut request = http
        .post(&tool.http.url)
        .header(
            "Idempotency-Key",
            idempotency_key(call.run, call.turn, call.call_id),
        )
        .timeout(Duration::from_millis(tool.http.timeout_ms))
        .json(call.input);
    if let Some(receipt) = call.receipt {
        request = request.header(RECEIPT_HEADER, receipt);
    }
    let response = request.send().await;
    let failed = |content: String| CallResult {
        outcome: CallOutcome::Failed,
        content,
        is_error: true,
    };
    let mut receipt_refused = None;
    let result = match response {
        Err(e) if e.is_timeout() => failed(format!(
            "The tool {} did not answer within {} ms.",
            tool.name, tool.http.timeout_ms
        )),
        Err(e) => failed(format!(
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
            let body: String = body.chars().take(MAX_RESULT_CHARS).collect();
            if status.is_success() {
                CallResult {
                    outcome,
                    content: body,
                    is_error: false,
                }
            } else {
                failed(format!(
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
