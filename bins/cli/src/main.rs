//! `phrony`: the operator CLI of the Phrony agent runtime.
//!
//! `main` only parses the arguments, runs the chosen command and maps its outcome to an exit
//! code; the behaviour is in the `phrony_cli` library (`src/lib.rs`).

fn main() -> std::process::ExitCode {
    phrony_cli::exit_code(phrony_cli::Cli::parse_args().run())
}
