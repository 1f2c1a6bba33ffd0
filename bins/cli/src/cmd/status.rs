//! `phrony status`: which runtime the CLI talks to, its version and its health.
//!
//! Exits 1 when the runtime cannot be reached or is not serving, so scripts can wait on it.

use anyhow::anyhow;
use phrony_client::{ClientError, Health};
use serde_json::json;

use crate::cmd::remote::{self, CLI_VERSION};
use crate::cmd::table::Table;
use crate::cmd::{Global, Output, render};

/// Arguments of `phrony status`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// What `status` found.
struct Report {
    runtime_version: Option<String>,
    schema_version: Option<String>,
    /// `None` when the runtime could not be reached.
    health: Option<Health>,
}

/// Prints the status table (or JSON), then fails if the runtime is unreachable or not serving.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    remote::block_on(async {
        let (report, failure) = probe(global).await?;
        print(&report, &global.runtime_addr, args.output)?;
        failure.map_or(Ok(()), Err)
    })
}

/// Asks the runtime what `status` shows; the error, if any, is what `status` fails with after
/// printing the report.
async fn probe(global: &Global) -> anyhow::Result<(Report, Option<anyhow::Error>)> {
    let client = match remote::open(global).await {
        Ok(client) => client,
        Err(error) => {
            let report = Report {
                runtime_version: None,
                schema_version: None,
                health: None,
            };
            let error = remote::diagnosed(global, error, |e| remote::failure("status", e)).await;
            return Ok((report, Some(error)));
        }
    };
    let (version, version_error) = match client.get_version().await {
        Ok(version) => {
            remote::warn_if_skewed(&version.version, client.addr())?;
            (Some(version), None)
        }
        Err(error @ ClientError::Rpc { .. }) => {
            (None, Some(remote::version_failure(client.addr(), error)))
        }
        Err(error) => {
            let addr = client.addr().to_owned();
            let error = remote::diagnosed(global, error, |e| remote::version_failure(&addr, e));
            (None, Some(error.await))
        }
    };
    let health = match client.health().await {
        Ok(health) => health,
        Err(ClientError::Rpc { .. }) => Health::Unknown,
        Err(other) => {
            // When the connection failed already, the version's error says why.
            return Err(version_error.unwrap_or_else(|| remote::failure("health", other)));
        }
    };
    let not_serving = (health == Health::NotServing).then(|| {
        anyhow!(
            "the runtime at {} is not serving (its database does not answer; see the runtime log)",
            client.addr()
        )
    });
    let report = Report {
        runtime_version: version.as_ref().map(|v| v.version.clone()),
        schema_version: version.and_then(|v| v.schema_version),
        health: Some(health),
    };
    Ok((report, version_error.or(not_serving)))
}

fn print(report: &Report, addr: &str, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => render::json(&json!({
            "cli_version": CLI_VERSION,
            "runtime_address": addr,
            "runtime_version": report.runtime_version,
            "schema_version": report.schema_version,
            "health": match report.health {
                None => "unreachable",
                Some(Health::Serving) => "serving",
                Some(Health::NotServing) => "not_serving",
                Some(Health::Unknown) => "unknown",
            },
        })),
        Output::Text => {
            let dash = || "-".to_owned();
            let mut table = Table::headless(2);
            let rows = [
                ("CLI Version", CLI_VERSION.to_owned()),
                ("Runtime Address", addr.to_owned()),
                (
                    "Runtime Version",
                    report.runtime_version.clone().unwrap_or_else(dash),
                ),
                (
                    "Schema Version",
                    report.schema_version.clone().unwrap_or_else(dash),
                ),
                (
                    "Health",
                    match report.health {
                        Some(Health::Serving) => "● SERVING",
                        Some(Health::NotServing) => "○ NOT SERVING",
                        Some(Health::Unknown) | None => "? UNKNOWN",
                    }
                    .to_owned(),
                ),
            ];
            for (key, value) in rows {
                table.row(vec![key.to_owned(), value]);
            }
            table.print()?;
            Ok(())
        }
    }
}
