//! The cap on live events streams ([`Streams`]), apart from the streams themselves so that the
//! gateway's state can hold it without depending on what answers a request.

use crate::config::Config;
use std::collections::HashMap;
use std::sync::Arc;

/// Why a stream was not admitted: which cap is full, said for the client.
#[derive(Debug)]
pub(crate) struct Full(pub(crate) String);

/// The live events streams open on this gateway: in all, per principal and per run.
#[derive(Default)]
pub(crate) struct Streams(std::sync::Mutex<Open>);

#[derive(Default)]
struct Open {
    all: usize,
    by_principal: HashMap<String, usize>,
    by_run: HashMap<String, usize>,
}

/// One open stream's place in [`Streams`], given back when dropped (with the stream's body).
pub(crate) struct Admitted {
    streams: Arc<Streams>,
    principal: String,
    run: String,
}

impl Streams {
    /// A place for one more stream of `run` for `principal`, if every cap allows it.
    pub(super) fn admit(
        self: &Arc<Self>,
        config: &Config,
        principal: &str,
        run: &str,
    ) -> Result<Admitted, Full> {
        let mut open = self.0.lock().expect("lock poisoned");
        let of_principal = open.by_principal.get(principal).copied().unwrap_or(0);
        let of_run = open.by_run.get(run).copied().unwrap_or(0);
        let full = if of_principal >= config.live_max_streams_per_principal {
            Some(format!(
                "{principal} has {of_principal} live event streams open, the most one principal may"
            ))
        } else if of_run >= config.live_max_streams_per_run {
            Some(format!(
                "run {run:?} has {of_run} live event streams open, the most one run may"
            ))
        } else if open.all >= config.live_max_streams {
            Some(format!(
                "this gateway has {} live event streams open, the most it serves",
                open.all
            ))
        } else {
            None
        };
        if let Some(full) = full {
            return Err(Full(full));
        }
        open.all += 1;
        *open.by_principal.entry(principal.to_string()).or_default() += 1;
        *open.by_run.entry(run.to_string()).or_default() += 1;
        Ok(Admitted {
            streams: self.clone(),
            principal: principal.to_string(),
            run: run.to_string(),
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut guard = self.streams.0.lock().expect("lock poisoned");
        let open = &mut *guard;
        open.all -= 1;
        for (counts, key) in [
            (&mut open.by_principal, &self.principal),
            (&mut open.by_run, &self.run),
        ] {
            if let Some(n) = counts.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(key);
                }
            }
        }
    }
}
