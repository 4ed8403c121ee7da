//! The tests' logging: what `RUST_LOG` asks for (warnings by default) written to the test's
//! output, and every NATS permissions violation a service logs (the warning
//! `countersign_runtime::bus` writes when the server refuses a publish or a subscription)
//! recorded, so that [`crate::infra::Infra`] fails the test that caused one. The services run
//! in the test's process and nextest runs each test in a process of its own, so what is
//! recorded is that test's.

use countersign_runtime::bus::SERVER_ERROR_TARGET;
use std::sync::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The violations logged so far in this process.
static VIOLATIONS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Whether this process's logging is the one [`init`] installs (a test that installs its own,
/// such as the trace exporter's, records nothing).
static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Installs the tests' logging, once per process; whether it is the one in place.
pub fn init() -> bool {
    *INSTALLED.get_or_init(|| {
        let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_test_writer()
                    .with_filter(tracing_subscriber::EnvFilter::new(filter)),
            )
            .with(
                Recorder.with_filter(
                    tracing_subscriber::filter::Targets::new()
                        .with_target(SERVER_ERROR_TARGET, Level::WARN),
                ),
            )
            .try_init()
            .is_ok()
    })
}

/// How many violations this process has logged; a mark for [`violations_since`].
pub fn violations_logged() -> usize {
    VIOLATIONS.lock().unwrap().len()
}

/// The violations logged after `mark` (from [`violations_logged`]).
pub fn violations_since(mark: usize) -> Vec<String> {
    VIOLATIONS.lock().unwrap()[mark..].to_vec()
}

/// Whether violations are being recorded in this process.
pub fn recording() -> bool {
    INSTALLED.get().copied().unwrap_or(false)
}

/// Records the server's refusals that are permissions violations.
struct Recorder;

impl<S: Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let metadata = event.metadata();
        if metadata.target() != SERVER_ERROR_TARGET || *metadata.level() > Level::WARN {
            return;
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        if text.0.to_lowercase().contains("permissions violation") {
            VIOLATIONS.lock().unwrap().push(text.0);
        }
    }
}

/// An event's fields as one line.
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0 += &format!("{}={value:?} ", field.name());
    }
}
