//! The behaviour of `phrony`, the operator CLI of the Phrony agent runtime, as a library.
//!
//! [`Cli`] is the clap command tree; [`Cli::run`] runs the chosen command and [`exit_code`]
//! maps its outcome to the process exit code (see [`exit`] for the table). The `phrony`
//! binary only parses its arguments and calls these two. Each subcommand lives in its own
//! module under `cmd`.

#![allow(
    clippy::disallowed_methods,
    reason = "the CLI binary's behaviour: it reads the process environment (PHRONY_*, NO_COLOR, secrets) for its commands"
)]

mod cmd;
pub mod exit;

pub use cmd::Cli;
pub use exit::code as exit_code;
