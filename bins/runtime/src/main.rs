//! `phrony-runtime`: the Phrony runtime daemon.
//!
//! `phrony-runtime [serve]` migrates the database and serves the gRPC API until SIGINT or
//! SIGTERM; `phrony-runtime migrate` only migrates; `phrony-runtime tokens create|list|revoke`
//! manages API tokens on the same database; `phrony-runtime audit verify` verifies the event log
//! offline (chains, sealed heads, triggers, projections). Configuration comes from flags or the
//! environment (`RUNTIME_GRPC_ADDR`, `RUNTIME_DATABASE_URL`, `RUNTIME_LOG_FORMAT`,
//! `RUNTIME_LOG`/`RUST_LOG`, `RUNTIME_SECRETS_ENCRYPTION_KEY`, `RUNTIME_AUTH`,
//! `RUNTIME_AUDIT_KEY_FILE`, `RUNTIME_ALLOW_UNVERIFIED_LOG`, `PHRONY_ACTOR`, and for tool
//! workers `RUNTIME_DISPATCH_QUEUE_WAIT`, `RUNTIME_TOOL_EXEC_TIMEOUT`, `RUNTIME_WORKER_LEASE_TTL`,
//! `RUNTIME_TOOL_ALLOWLIST`, `RUNTIME_REQUIRE_DESCRIPTOR_PINS`, and for TLS and OIDC `RUNTIME_TLS_CERT`, `RUNTIME_TLS_KEY`,
//! `RUNTIME_TLS_CLIENT_CA`, `RUNTIME_TLS_CLIENT_ROLES`, `RUNTIME_OIDC_ISSUER`,
//! `RUNTIME_OIDC_AUDIENCE`, `RUNTIME_OIDC_JWKS`, `RUNTIME_OIDC_ROLES_CLAIM`,
//! `RUNTIME_OIDC_JWKS_REFRESH`), and for trace export the standard `OTEL_EXPORTER_OTLP_*`,
//! `OTEL_SERVICE_NAME`, `OTEL_TRACES_EXPORTER` and `OTEL_SDK_DISABLED`; see `--help`. The behaviour lives in the `phrony-runtime` library.
//! Failures print one line naming the problem and exit 1.

use std::process::ExitCode;

/// jemalloc returns freed memory to the system (background threads purge dirty pages after
/// their decay time); see `BENCHMARKS.md` for the RSS after a burst of sessions ends. Built
/// unprefixed, it also serves C `malloc`, so SQLite's page caches are returned as well
/// (`Cargo.toml` says why).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use clap::Parser as _;
use phrony_runtime::{AuditCommand, Cli, Command, Env, LogFormat, daemon, logging};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.settings.log_format == LogFormat::Json;
    let telemetry = match logging::init(&cli.settings) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("phrony-runtime: error: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let env = Env::from_process();
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => daemon::serve(&cli.settings, &env),
        Command::Migrate => daemon::migrate(&cli.settings, &env),
        Command::Tokens(tokens) => daemon::tokens(&cli.settings, &env, &tokens),
        Command::Audit {
            command: AuditCommand::Verify(args),
        } => daemon::audit_verify(&cli.settings, &env, &args),
    };
    // The last spans, within a bounded wait (a collector that is down delays the exit by at
    // most `telemetry::FLUSH_TIMEOUT`).
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            if json {
                tracing::error!(error = format!("{error:#}"), "phrony-runtime failed");
            } else {
                eprintln!("phrony-runtime: error: {error:#}");
            }
            ExitCode::FAILURE
        }
    }
}
