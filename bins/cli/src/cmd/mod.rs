//! The command tree. Each subcommand is one module holding its clap arguments and its `run`.

mod agent_ref;
mod agents;
mod approvals;
mod attach;
mod audit;
mod bundles;
mod completions;
mod demo;
mod init;
mod manifest;
mod policies;
mod remote;
mod render;
mod run;
mod schema;
mod sessions;
mod status;
mod table;
mod tools;
mod webhooks;

use clap::{ArgAction, Parser, Subcommand, ValueEnum};

/// The version line printed by `phrony --version`.
const VERSION: &str = concat!("version ", env!("CARGO_PKG_VERSION"));

/// Exit codes, shown at the end of `phrony --help`.
const EXIT_CODES: &str = "\
Exit codes:
  0  success (warnings, if any, are printed on stderr)
  1  invalid input, validation failure or failed operation (`Error: …` on stderr)
  2  usage error: unknown command or flag, missing or malformed argument
  3  the connection to the runtime was lost after a change was sent: it may have been
     recorded (the error says how to check)
  4  access refused: no credential or a bad one (UNAUTHENTICATED), or the credential lacks
     the permission (PERMISSION_DENIED; the error names it)
  5  `policies replay`: a stored decision would flip under the candidate manifest";

/// Declare, validate and dry-run Phrony agents; operate the Phrony runtime.
#[derive(Debug, Parser)]
#[command(
    name = "phrony",
    version = VERSION,
    disable_version_flag = true,
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// Print the version.
    #[arg(short = 'v', long = "version", action = ArgAction::Version)]
    version: Option<bool>,

    #[command(flatten)]
    global: Global,

    #[command(subcommand)]
    command: Command,
}

/// Flags every command accepts.
#[derive(Debug, clap::Args)]
pub(crate) struct Global {
    /// Address of the Phrony runtime (host:port) for commands that talk to it.
    #[arg(
        long,
        global = true,
        env = "PHRONY_RUNTIME_ADDR",
        default_value = "127.0.0.1:7777",
        value_name = "HOST:PORT"
    )]
    pub(crate) runtime_addr: String,

    /// Whether `--runtime-addr` or `PHRONY_RUNTIME_ADDR` named the runtime (`phrony demo`
    /// embeds one otherwise); set by [`Cli::parse_args`].
    #[arg(skip)]
    pub(crate) runtime_addr_given: bool,

    /// API token sent as `authorization: Bearer <token>` on every call (runtimes in `required`
    /// auth mode need one; create it with `phrony-runtime tokens create`). With a token and no
    /// PHRONY_ACTOR, changes are recorded as the token's name.
    #[arg(
        long,
        global = true,
        env = "PHRONY_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(crate) token: Option<String>,
    /// CA certificate (PEM) that signed the runtime's TLS certificate: connect over TLS
    /// (the address may then be `https://host:port`).
    #[arg(long, global = true, env = "PHRONY_TLS_CA", value_name = "FILE")]
    pub(crate) tls_ca: Option<std::path::PathBuf>,

    /// Client certificate (PEM) for mutual TLS (with --tls-key; needs --tls-ca).
    #[arg(long, global = true, env = "PHRONY_TLS_CERT", value_name = "FILE")]
    pub(crate) tls_cert: Option<std::path::PathBuf>,

    /// Private key (PEM) of the client certificate in --tls-cert.
    #[arg(long, global = true, env = "PHRONY_TLS_KEY", value_name = "FILE")]
    pub(crate) tls_key: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The tutorial in one command, no API key or set-up: an embedded runtime, the refund
    /// agent on a scripted model, an in-process worker, three scenarios (dispatched, held for
    /// your approval, denied by policy) and the audit trail.
    Demo(demo::Args),
    /// Scaffold the refund-agent starter project (agent.yaml, tools/, policies/, worker.py).
    Init(init::Args),
    /// Show the runtime's address, version and health (exit 1 when unreachable or not serving).
    Status(status::Args),
    /// Validate agent manifests; publish, deploy, roll back and retire agent versions.
    #[command(subcommand)]
    Agents(agents::Command),
    /// Dry-run policies against a tool call; replay stored calls under a candidate manifest;
    /// report what shadow policies would have changed.
    #[command(subcommand)]
    Policies(policies::Command),
    /// Print the descriptor pins of Tool documents (the `descriptor_hash` workers advertise).
    #[command(subcommand)]
    Tools(tools::Command),
    /// Start a session of an agent's active deployment (prints `session <id> started`).
    Run(run::Args),
    /// List, inspect, cancel and complete sessions.
    #[command(subcommand)]
    Sessions(sessions::Command),
    /// List, show, approve and reject tool calls held for a human decision.
    #[command(subcommand)]
    Approvals(approvals::Command),
    /// Verify the runtime's event log (hash chains, sealed heads, projections) and export it.
    #[command(subcommand)]
    Audit(audit::Command),
    /// List webhook deliveries (pending, delivered, failed) and re-queue a failed one.
    #[command(subcommand)]
    Webhooks(webhooks::Command),
    /// Lock, validate, publish, deploy and run bundles of agents.
    #[command(subcommand)]
    Bundles(bundles::Command),
    /// Print the JSON Schema of the authoring format (Agent, Tool, Policy, Bundle) for editors.
    Schema(schema::Args),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
    /// Print the phrony(1) man page, or write every command's page into a directory.
    Man(completions::ManArgs),
}

/// How a command prints its result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON document on stdout, for scripts.
    Json,
}

impl Cli {
    /// Parses the process's arguments (exiting with clap's usage error on bad ones), noting
    /// whether the runtime's address was given (`--runtime-addr` or `PHRONY_RUNTIME_ADDR`)
    /// rather than defaulted.
    #[must_use]
    pub fn parse_args() -> Self {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let matches = Self::command().get_matches();
        let mut cli = Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.global.runtime_addr_given = addr_given(&matches);
        cli
    }

    /// Runs the chosen command.
    ///
    /// # Errors
    /// The command's failure; [`crate::exit_code`] turns it into the exit code.
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Demo(args) => demo::run(&args, &self.global),
            Command::Init(args) => init::run(&args),
            Command::Status(args) => status::run(&args, &self.global),
            Command::Agents(cmd) => cmd.run(&self.global),
            Command::Policies(cmd) => cmd.run(&self.global),
            Command::Tools(cmd) => cmd.run(),
            Command::Run(args) => run::run(&args, &self.global),
            Command::Sessions(cmd) => cmd.run(&self.global),
            Command::Approvals(cmd) => cmd.run(&self.global),
            Command::Audit(cmd) => cmd.run(&self.global),
            Command::Webhooks(cmd) => cmd.run(&self.global),
            Command::Bundles(cmd) => cmd.run(&self.global),
            Command::Schema(args) => schema::run(&args),
            Command::Completions(args) => completions::completions(&args),
            Command::Man(args) => completions::man(&args),
        }
    }
}

/// Whether `runtime_addr` came from the command line or the environment at any level of the
/// subcommand chain (a global flag may be given after the subcommand).
fn addr_given(matches: &clap::ArgMatches) -> bool {
    use clap::parser::ValueSource;
    let here = matches!(
        matches.value_source("runtime_addr"),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    );
    here || matches.subcommand().is_some_and(|(_, sub)| addr_given(sub))
}
