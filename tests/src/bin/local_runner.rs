//! The local runner (`cargo run -p countersign-local`) built from its own source as a program
//! of this package, so tests can start it as a person does and stop it, or kill its child
//! servers (`CARGO_BIN_EXE_local_runner`).

#[path = "../../../local/src/main.rs"]
mod runner;

fn main() -> std::process::ExitCode {
    runner::main()
}
