//! `cargo run --release -p countersign-bench -- [options]`; `--help` lists them.

use countersign_bench::config::{Command, Options, USAGE};
use std::process::ExitCode;

fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(Command::Run(options)) => *options,
        Ok(Command::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e:#}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if cfg!(debug_assertions) {
        eprintln!("warning: a debug build of the load generator; figures want --release");
    }
    // Two threads, named so that the load generator's CPU time is read apart from the fake
    // servers' (which have their own runtime).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(countersign_bench::load::THREADS)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = options.json.clone();
    // On SIGINT or SIGTERM the run is dropped, and with it every child process it started
    // (each is stopped as it drops): nothing is left running.
    let finished = runtime.block_on(async {
        tokio::select! {
            report = countersign_bench::run(options) => Some(report),
            () = signalled() => None,
        }
    });
    let report = match finished {
        Some(Ok(report)) => report,
        Some(Err(e)) => {
            eprintln!("the benchmark could not run: {e:#}");
            return ExitCode::FAILURE;
        }
        None => {
            eprintln!("stopped by a signal; the processes it started are stopped");
            return ExitCode::from(130);
        }
    };
    print!("{}", countersign_bench::report::table(&report));
    if let Some(path) = json {
        let written = serde_json::to_string_pretty(&report)
            .map_err(anyhow::Error::from)
            .and_then(|text| Ok(std::fs::write(&path, text + "\n")?));
        if let Err(e) = written {
            eprintln!("cannot write {}: {e:#}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Returns on SIGINT or SIGTERM (never, if they cannot be watched).
async fn signalled() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
}
