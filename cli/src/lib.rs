//! countersign's command line: talks to a gateway's HTTP API with a key from the environment,
//! a flag or a config file, and prints tables (or the gateway's JSON with `--json`). Errors
//! print the gateway's own message and exit with a code that says what kind of failure it was
//! (see [`error::CliError`]).

mod args;
mod client;
mod commands;
mod config;
mod error;
mod render;
mod view;

use clap::Parser;
use std::process::ExitCode;

/// Parses the process's arguments, runs the command and gives its exit code.
pub fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime starts");
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("countersign: {error}");
            error.exit_code()
        }
    }
}
