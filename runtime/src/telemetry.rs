//! Logging and traces. Logs: `RUST_LOG` filters (default [`DEFAULT_FILTER`]); `LOG_FORMAT=json` gives one
//! JSON object a line; the text lines are coloured only on a terminal and when `NO_COLOR` is
//! unset or empty. Traces: when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, the services' spans are exported over OTLP/HTTP
//! (protobuf), configured by the standard `OTEL_*` variables; [`crate::trace_context`] carries
//! a run's trace across NATS and Redis.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Whether this process exports spans (set once, by [`init_with`]).
static EXPORTING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether spans are exported, so that work done only to place a span in its run's trace
/// is skipped when they are not.
pub fn exporting() -> bool {
    EXPORTING.get().copied().unwrap_or(false)
}

/// The crates whose spans are exported: the services' own, not their libraries'.
const TRACED_CRATES: [&str; 5] = [
    "approval_gateway",
    "agent_worker",
    "countersign_runtime",
    "countersign_store",
    "countersign_local",
];

/// Keeps the trace exporter alive; dropping it sends what is still buffered.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans buffered so far (blocking).
    pub fn flush(&self) {
        if let Some(provider) = &self.provider
            && let Err(e) = provider.force_flush()
        {
            tracing::warn!(error = %e, "could not send the buffered spans");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("could not send the last spans: {e}");
        }
    }
}

/// Logging, and traces when the environment names an OTLP endpoint. `service` is the
/// `service.name` unless `OTEL_SERVICE_NAME` says otherwise.
pub fn init(service: &str) -> Telemetry {
    let configured = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()));
    init_with(service, configured.then_some(Endpoint::FromEnvironment))
}

/// Where spans go.
pub enum Endpoint {
    /// As the `OTEL_EXPORTER_OTLP_*` variables say.
    FromEnvironment,
    /// This URL, the full path included (`http://collector:4318/v1/traces`).
    Url(String),
}

/// The log filter without `RUST_LOG`: `info`, but for the MCP SDK (rmcp), whose `info`
/// lines (every session opened and served, with `Debug` dumps of its messages) would be a third
/// of what an operator reads.
pub const DEFAULT_FILTER: &str = "info,rmcp=warn";

/// Logging, and traces to `endpoint` if there is one. A second call (tests, the local runner)
/// keeps the first subscriber and exports nothing of its own.
pub fn init_with(service: &str, endpoint: Option<Endpoint>) -> Telemetry {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let logs = if std::env::var("LOG_FORMAT").as_deref() == Ok("json") {
        tracing_subscriber::fmt::layer()
            .json()
            .with_filter(filter)
            .boxed()
    } else {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
        let no_color = std::env::var_os("NO_COLOR");
        tracing_subscriber::fmt::layer()
            .with_ansi(colour(terminal, no_color.as_deref()))
            .with_filter(filter)
            .boxed()
    };
    let provider = endpoint.and_then(|endpoint| match tracer_provider(service, endpoint) {
        Ok(provider) => Some(provider),
        Err(e) => {
            eprintln!("traces are not exported: {e}");
            None
        }
    });
    let traces = provider.as_ref().map(|provider| {
        let targets = TRACED_CRATES.iter().fold(Targets::new(), |t, krate| {
            t.with_target(*krate, Level::INFO)
        });
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("countersign"))
            .with_filter(targets)
    });
    let installed = Registry::default()
        .with(logs)
        .with(traces)
        .try_init()
        .is_ok();
    if installed {
        let _ = EXPORTING.set(provider.is_some());
    }
    Telemetry {
        provider: provider.filter(|_| installed),
    }
}

/// Whether log lines get colour codes: only for a person at a terminal who did not ask for
/// none (`NO_COLOR` set and not empty, as no-color.org says). A file, a pipe or a log
/// collector gets plain text.
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

fn tracer_provider(
    service: &str,
    endpoint: Endpoint,
) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_http();
    if let Endpoint::Url(url) = endpoint {
        exporter = exporter.with_endpoint(url);
    }
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service.to_string());
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter.build()?)
        .with_resource(resource.build())
        .build())
}

#[cfg(test)]
mod tests {
    use super::colour;
    use std::ffi::OsStr;

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
        assert!(!colour(false, Some(OsStr::new(""))));
    }
}
