//! The local runner's parts, watched together so that none stops in silence: the child
//! servers (`nats-server`, `redis-server`) and the in-process services (the gateway, the
//! worker, the demo tools).
//!
//! A part that stops while the runner is not shutting down is not restarted: the runner says
//! at once which part stopped and why (its error, or a child's exit status and the last lines
//! of its log), stops the rest and exits non-zero. On one machine a restart would mostly hide
//! the cause (a port taken, a full disk, a server killed) behind a loop of the same failure,
//! and nothing is lost by stopping: runs and decisions are kept in the data folder, and the
//! next start takes them up.
//!
//! Stopping goes in two steps: the services first (so the worker hands its runs back and the
//! NATS connections drain), then the servers they were using.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;
use tokio::process::Child;
use tokio::task::{Id, JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

/// How many lines of a child server's log are shown when it stops.
const LOG_TAIL: usize = 8;

/// A part that stopped, and why.
#[derive(Debug)]
pub struct Stopped {
    /// The part's name, as it was started (a service or a child server).
    pub part: String,
    /// Why it stopped, in words for the terminal.
    pub why: String,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the {} stopped: {}", self.part, self.why)
    }
}

type Ended = anyhow::Result<()>;

/// The parts of a local start (the child servers and the services), run until one stops or
/// Ctrl-C.
pub struct Parts {
    /// Cancelled on Ctrl-C or when a part stops; the services stop on it.
    shutdown: CancellationToken,
    /// Cancelled once the services have stopped; the child servers are killed on it.
    servers_stop: CancellationToken,
    services: JoinSet<Ended>,
    servers: JoinSet<Ended>,
    /// The name of each part's task.
    names: HashMap<Id, String>,
}

impl Parts {
    /// No parts yet; `shutdown` is the token the services are given.
    pub fn new(shutdown: CancellationToken) -> Self {
        Self {
            shutdown,
            servers_stop: CancellationToken::new(),
            services: JoinSet::new(),
            servers: JoinSet::new(),
            names: HashMap::new(),
        }
    }

    /// Watches an in-process service, which should run until `shutdown`.
    pub fn service(
        &mut self,
        name: &str,
        service: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let task = self.services.spawn(service);
        self.names.insert(task.id(), name.to_string());
    }

    /// Watches a child server writing its output to `log`: its exit, for whatever reason, is
    /// a stop; it is killed once the services have stopped.
    pub fn server(&mut self, name: &str, mut child: Child, log: PathBuf) {
        let stop = self.servers_stop.clone();
        let task = self.servers.spawn(async move {
            tokio::select! {
                status = child.wait() => Err(match status {
                    Ok(status) => anyhow::anyhow!("it exited ({status}){}", tail(&log)),
                    Err(e) => anyhow::anyhow!("cannot wait for it: {e}"),
                }),
                _ = stop.cancelled() => {
                    let _ = child.kill().await;
                    Ok(())
                }
            }
        });
        self.names.insert(task.id(), name.to_string());
    }

    /// Runs `phase` while watching the parts: its output, or the first part that stops
    /// (unless it stopped without an error because the runner is shutting down).
    pub async fn race<T>(&mut self, phase: impl Future<Output = T>) -> Result<T, Stopped> {
        tokio::pin!(phase);
        loop {
            tokio::select! {
                value = &mut phase => return Ok(value),
                (id, ended) = next(&mut self.services, &mut self.servers) => {
                    let part = self.names.get(&id).cloned().unwrap_or_default();
                    match ended {
                        Ok(()) if self.shutdown.is_cancelled() => continue,
                        Ok(()) => return Err(Stopped { part, why: "it ended without an error, before it was asked to".into() }),
                        Err(e) => return Err(Stopped { part, why: format!("{e:#}") }),
                    }
                }
            }
        }
    }

    /// Until Ctrl-C (`Ok`) or the first part that stops.
    pub async fn watch(&mut self) -> Result<(), Stopped> {
        let shutdown = self.shutdown.clone();
        self.race(shutdown.cancelled()).await
    }

    /// Stops the services, giving them `grace` to finish, then the servers; returns the
    /// parts that failed on the way.
    pub async fn stop(mut self, grace: Duration) -> Vec<Stopped> {
        self.shutdown.cancel();
        let mut failed = Vec::new();
        let stopping = async {
            while let Some(ended) = self.services.join_next_with_id().await {
                let (id, ended) = ended.unwrap_or_else(panicked);
                if let Err(e) = ended {
                    failed.push(Stopped {
                        part: self.names.get(&id).cloned().unwrap_or_default(),
                        why: format!("{e:#}"),
                    });
                }
            }
        };
        if tokio::time::timeout(grace, stopping).await.is_err() {
            self.services.abort_all();
        }
        self.servers_stop.cancel();
        while self.servers.join_next().await.is_some() {}
        failed
    }
}

/// The next part to end, of either set, by its task's id.
async fn next(services: &mut JoinSet<Ended>, servers: &mut JoinSet<Ended>) -> (Id, Ended) {
    let ended = tokio::select! {
        ended = next_of(services) => ended,
        ended = next_of(servers) => ended,
    };
    ended.unwrap_or_else(panicked)
}

/// The next task of `set` to end; never, while it is empty.
async fn next_of(set: &mut JoinSet<Ended>) -> Result<(Id, Ended), JoinError> {
    if set.is_empty() {
        std::future::pending::<()>().await;
    }
    set.join_next_with_id().await.expect("the set is not empty")
}

fn panicked(e: JoinError) -> (Id, Ended) {
    (e.id(), Err(anyhow::anyhow!("it panicked: {e}")))
}

/// The last lines of a log file, to say why a server stopped.
fn tail(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let last = &lines[lines.len().saturating_sub(LOG_TAIL)..];
    format!("; the end of {}:\n  {}", log.display(), last.join("\n  "))
}
