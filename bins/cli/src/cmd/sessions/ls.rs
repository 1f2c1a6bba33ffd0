//! `phrony sessions ls [NS/NAME[@VERSION]]`: sessions, most recently updated first.

use phrony_client::{SessionFilter, SessionSummary, Starter};
use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, agent_ref, remote, render, run};

/// Arguments of `phrony sessions ls`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Only sessions of this agent (namespace/name), or of one version (namespace/name@version).
    agent: Option<String>,
    /// Only sessions in this status (e.g. running, awaiting_approval, completed).
    #[arg(long)]
    status: Option<String>,
    /// Only sessions whose metadata has this pair (repeatable: every pair must match).
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    metadata: Vec<String>,
    /// Also list delegated child sessions.
    #[arg(long)]
    include_children: bool,
    /// At most this many sessions, at most 1000 (default: every match, up to 10,000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    limit: Option<u32>,
    /// Continue a listing: the token printed after the previous page.
    #[arg(long, value_name = "TOKEN")]
    page_token: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `ID KIND TARGET STATUS UPDATED_AT RESUMABLE STARTED_BY` (the starter as people read
/// it: `emad`, `emad (unverified)`, `alice via approvals-ui`); when more sessions match, says how to
/// get them on stderr.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let target = args.agent.as_deref().map(agent_ref::parse).transpose()?;
    let status = match args.status.as_deref().map(str::trim) {
        Some("") => anyhow::bail!("--status must not be empty"),
        other => other.map(str::to_owned),
    };
    let filter = SessionFilter {
        version: target.as_ref().and_then(|t| t.version.clone()),
        agent: target.map(|t| t.agent),
        status,
        metadata: run::parse_metadata(&args.metadata)?,
        include_children: args.include_children,
        limit: args.limit,
        page_token: args.page_token.clone().filter(|t| !t.is_empty()),
    };
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let page = client
            .list_sessions(&filter)
            .await
            .map_err(remote::fails("sessions ls"))?;
        match args.output {
            Output::Json => render::json(&json!({
                "sessions": page.sessions.iter().map(summary_json).collect::<Vec<_>>(),
                "next_page_token": page.next_page_token,
            })),
            Output::Text => {
                let mut table = Table::new(&[
                    "ID",
                    "KIND",
                    "TARGET",
                    "STATUS",
                    "UPDATED_AT",
                    "RESUMABLE",
                    "STARTED_BY",
                ]);
                for s in &page.sessions {
                    table.row(vec![
                        s.id.clone(),
                        s.kind.clone(),
                        s.target()
                            .map_or_else(|| "-".to_owned(), ToString::to_string),
                        s.status.clone(),
                        render::time(s.updated_at),
                        if s.resumable() { "yes" } else { "no" }.to_owned(),
                        s.started_by
                            .as_ref()
                            .map_or_else(|| "-".to_owned(), ToString::to_string),
                    ]);
                }
                table.print()?;
                Ok(render::next_page_hint(
                    "sessions",
                    page.next_page_token.as_deref(),
                )?)
            }
        }
    })
}

fn summary_json(s: &SessionSummary) -> Value {
    json!({
        "id": s.id,
        "kind": s.kind,
        "target": s.target().map(ToString::to_string),
        "status": s.status,
        "resumable": s.resumable(),
        "agent": s.agent.as_ref().map(ToString::to_string),
        "agent_version_id": s.agent_version_id,
        "bundle": s.bundle.as_ref().map(ToString::to_string),
        "bundle_version_id": s.bundle_version_id,
        "mode": s.mode.map(|m| m.as_str()),
        "metadata": s.metadata,
        "started_by": started_by_json(s.started_by.as_ref()),
        "created_at": render::time(s.created_at),
        "updated_at": render::time(s.updated_at),
    })
}

/// The starter in `--output json`: `{"actor", "verification", "via", "display"}` (`null` when
/// the runtime reports none).
pub(super) fn started_by_json(s: Option<&Starter>) -> Value {
    s.map_or(Value::Null, |s| {
        json!({
            "actor": s.actor,
            "verification": s.verification,
            "via": s.via,
            "display": s.to_string(),
        })
    })
}
