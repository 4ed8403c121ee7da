//! `countersign runs start | get | cancel`.

use super::show;
use crate::args::RunsCommand;
use crate::client::Gateway;
use crate::error::CliError;
use crate::render::print_json;
use crate::view::{RunView, read};
use reqwest::Method;
use serde_json::{Value, json};

pub(super) async fn run(
    gateway: &Gateway,
    command: RunsCommand,
    json: bool,
) -> Result<(), CliError> {
    match command {
        RunsCommand::Start {
            agent,
            input,
            requested_by,
            metadata,
            idempotency_key,
        } => {
            let mut body = json!({"agent": agent, "input": input});
            if let Some(by) = requested_by {
                body["requested_by"] = by.into();
            }
            if let Some(text) = metadata {
                body["metadata"] = json_object("--metadata", &text)?;
            }
            let mut request = gateway
                .request(Method::POST, gateway.url(&["v1", "runs"]))
                .json(&body);
            if let Some(key) = idempotency_key {
                request = request.header("Idempotency-Key", key);
            }
            let started = gateway.send(request).await?;
            if json {
                print_json(&started);
            } else {
                // The id alone, so that `RUN=$(countersign runs start …)` keeps it.
                println!("{}", started["run_id"].as_str().unwrap_or_default());
            }
        }
        RunsCommand::Get { run } => {
            let answer = gateway.get(gateway.url(&["v1", "runs", &run])).await?;
            if json {
                print_json(&answer);
            } else {
                print!("{}", show::overview(&read::<RunView>(answer)?));
            }
        }
        RunsCommand::Cancel { run, reason } => {
            let body = match reason {
                Some(reason) => json!({"reason": reason}),
                None => json!({}),
            };
            let url = gateway.url(&["v1", "runs", &run, "cancel"]);
            let answer = gateway.post(url, &body).await?;
            if json {
                print_json(&answer);
            } else {
                println!("run {run} is being cancelled");
            }
        }
    }
    Ok(())
}

/// A flag's JSON object, or a usage error naming the flag.
pub(super) fn json_object(flag: &str, text: &str) -> Result<Value, CliError> {
    match serde_json::from_str::<Value>(text) {
        Ok(value) if value.is_object() => Ok(value),
        Ok(_) => Err(CliError::Usage(format!("{flag} must be a JSON object"))),
        Err(e) => Err(CliError::Usage(format!("{flag} is not JSON: {e}"))),
    }
}
