//! The gateway's HTTP API, as JSON values: commands print them as they came with `--json` and
//! read the parts they show otherwise. An error answer becomes a [`Refusal`] carrying the
//! gateway's own message.

use crate::config::Config;
use crate::error::{CliError, Refusal};
use reqwest::{Method, RequestBuilder, Url};
use serde_json::Value;
use std::time::Duration;

pub(crate) struct Gateway {
    http: reqwest::Client,
    /// For streams, which last as long as what they follow: no overall timeout, but one
    /// between reads, which the gateway's heartbeats keep from passing on a quiet stream.
    streams: reqwest::Client,
    base: Url,
    api_key: String,
}

impl Gateway {
    pub(crate) fn new(config: &Config) -> Result<Self, CliError> {
        let base = Url::parse(&config.url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| {
                CliError::Usage(format!(
                    "the gateway URL {:?} is not an http:// or https:// URL",
                    config.url
                ))
            })?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| CliError::Unreachable(e.to_string()))?;
        let streams = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| CliError::Unreachable(e.to_string()))?;
        Ok(Self {
            http,
            streams,
            base,
            api_key: config.api_key.clone(),
        })
    }

    /// The URL of the API path made of `segments`, each escaped as one path segment (so a
    /// run id typed with a `/` or `?` names no other route).
    pub(crate) fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("http URLs have paths")
            .pop_if_empty()
            .extend(segments);
        url
    }

    pub(crate) async fn get(&self, url: Url) -> Result<Value, CliError> {
        self.send(self.request(Method::GET, url)).await
    }

    pub(crate) async fn post(&self, url: Url, body: &Value) -> Result<Value, CliError> {
        self.send(self.request(Method::POST, url).json(body)).await
    }

    pub(crate) fn request(&self, method: Method, url: Url) -> RequestBuilder {
        self.http.request(method, url).bearer_auth(&self.api_key)
    }

    pub(crate) async fn send(&self, request: RequestBuilder) -> Result<Value, CliError> {
        let response = request
            .send()
            .await
            .map_err(|e| CliError::Unreachable(describe(&e)))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| CliError::Unreachable(describe(&e)))?;
        let body: Option<Value> = serde_json::from_str(&text).ok();
        if status.is_success() {
            return body.ok_or_else(|| {
                CliError::Unreachable(format!(
                    "the answer to a {status} was not JSON; is {} a countersign gateway?",
                    self.base
                ))
            });
        }
        Err(self.refusal(status, body))
    }

    /// The server-sent events at `url` from after `last_event_id`: the answer to read them
    /// from, or None when the gateway says there is nothing more to follow (204).
    pub(crate) async fn events(
        &self,
        url: Url,
        last_event_id: Option<&str>,
    ) -> Result<Option<reqwest::Response>, CliError> {
        let mut request = self
            .streams
            .get(url)
            .bearer_auth(&self.api_key)
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request
            .send()
            .await
            .map_err(|e| CliError::Unreachable(describe(&e)))?;
        let status = response.status();
        if status == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        if status.is_success() {
            return Ok(Some(response));
        }
        let text = response
            .text()
            .await
            .map_err(|e| CliError::Unreachable(describe(&e)))?;
        Err(self.refusal(status, serde_json::from_str(&text).ok()))
    }

    /// An error answer as the gateway's refusal, or as an answer from something else.
    fn refusal(&self, status: reqwest::StatusCode, body: Option<Value>) -> CliError {
        // Every error the gateway gives is `{"error": {"code", "message", "details"?}}`;
        // another answer (a proxy's page, another server) is not the gateway's refusal.
        let error = body.as_ref().map(|b| &b["error"]);
        let (Some(code), Some(message)) = (
            error.and_then(|e| e["code"].as_str()),
            error.and_then(|e| e["message"].as_str()),
        ) else {
            return CliError::Unreachable(format!(
                "{} answered {status}, not as a countersign gateway does",
                self.base
            ));
        };
        CliError::Refused(Refusal {
            status: status.as_u16(),
            code: code.to_string(),
            message: message.to_string(),
            details: error.and_then(|e| e.get("details")).cloned(),
            hint: None,
        })
    }
}

/// reqwest's error with its causes, which hold the useful part ("Connection refused").
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}
