//! Waiting for the services' readiness probes, so the runner says it is running only once
//! the gateway answers and the worker takes work.

use countersign_runtime::probe::{ProbeError, probe};
use std::time::{Duration, Instant};

/// How often a probe is asked again.
const POLL: Duration = Duration::from_millis(50);
/// How often the wait says what it still waits for.
const SAY_EVERY: Duration = Duration::from_secs(10);

/// Waits until each `(name, url)` answers 200; every ten seconds it says which does not yet,
/// and why.
pub async fn wait_ready(probes: &[(&str, String)]) {
    let mut said = Instant::now();
    for (name, url) in probes {
        loop {
            let asked = url.clone();
            let answer = tokio::task::spawn_blocking(move || probe(&asked, POLL * 10)).await;
            let why = match answer {
                Ok(Ok(())) => break,
                Ok(Err(ProbeError::Status { body, .. })) => body,
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            if said.elapsed() >= SAY_EVERY {
                tracing::warn!(%url, %why, "still waiting for the {name} to be ready");
                said = Instant::now();
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
