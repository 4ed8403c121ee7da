//! SIGINT and SIGTERM: the first cancels the token (stop taking work, finish what is in
//! flight); a second exits at once.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Waits for SIGINT or SIGTERM and cancels `token` on the first; exits the process on a second.
pub async fn on_signal(token: CancellationToken) {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for signals");
        return;
    };
    for n in 0.. {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        if n > 0 {
            tracing::warn!("second signal: exiting now");
            std::process::exit(130);
        }
        tracing::info!("signal received: shutting down (send again to exit at once)");
        token.cancel();
    }
}
