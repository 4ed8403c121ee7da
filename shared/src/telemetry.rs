//! Logging: `RUST_LOG` filters (default `info`); `LOG_FORMAT=json` gives one JSON object a line.

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = if std::env::var("LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    // A second init (tests, the local runner) keeps the first subscriber.
    let _ = result;
}
