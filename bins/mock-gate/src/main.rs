//! `mock-gate`: a faithful local twin of the Regent Control Decision API.
//!
//! `main` only parses the arguments, runs the command on a Tokio runtime and maps its outcome
//! to an exit code; the commands and their behaviour are in the `mock_gate` library
//! (`src/lib.rs`).

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = mock_gate::Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mock-gate: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(mock_gate::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mock-gate: {e:#}");
            ExitCode::FAILURE
        }
    }
}
