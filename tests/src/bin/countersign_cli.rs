//! The `countersign` command line as a process of this package, so the end-to-end tests can
//! run it as a person would (`CARGO_BIN_EXE_countersign_cli`).

fn main() -> std::process::ExitCode {
    countersign_cli::main()
}
