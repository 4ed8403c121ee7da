//! `countersign`: the command line. Everything is in the library, so the tests can run it as
//! a process of their own package.

fn main() -> std::process::ExitCode {
    countersign_cli::main()
}
