//! `phrony`: the operator CLI of the Phrony agent runtime.
//!
//! `main` only parses the arguments, runs the chosen command and maps its outcome to an exit code
//! (see [`exit`]); each subcommand lives in its own module under [`cmd`].

mod cmd;
mod exit;

use clap::Parser as _;

fn main() -> std::process::ExitCode {
    let cli = cmd::Cli::parse();
    exit::code(cli.run())
}
