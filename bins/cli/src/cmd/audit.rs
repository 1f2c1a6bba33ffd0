//! `phrony audit …`: verify the runtime's event log and export it for a SIEM.

use std::io::{self, Write as _};

use phrony_client::{AuditScope, ExportedEvent};
use serde_json::{Value, json};

use crate::cmd::{Global, remote};

/// Subcommands of `phrony audit`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Verify the hash chains, the sealed stream heads, the append-only triggers and the
    /// projections re-folded from the events. Prints `verified N events in M streams`, or
    /// names the first bad event and exits 1.
    Verify(VerifyArgs),
    /// Write the events as JSONL on stdout (one object a line, hashes included).
    Export(ExportArgs),
}

/// What `phrony audit verify` covers (default: everything).
#[derive(Debug, clap::Args)]
#[group(multiple = false)]
pub(crate) struct VerifyArgs {
    /// Only this session.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Only this agent's lifecycle stream.
    #[arg(long, value_name = "NS/NAME")]
    agent: Option<String>,
    /// Every stream and projection (the default).
    #[arg(long)]
    all: bool,
}

/// Arguments of `phrony audit export`.
#[derive(Debug, clap::Args)]
pub(crate) struct ExportArgs {
    /// Only events at or after this RFC 3339 time, e.g. 2026-12-01T00:00:00Z.
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Only this session's events.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self, global: &Global) -> anyhow::Result<()> {
        match self {
            Self::Verify(args) => verify(&args, global),
            Self::Export(args) => export(&args, global),
        }
    }
}

fn nonempty(value: Option<&String>) -> Option<&str> {
    value.map(|s| s.trim()).filter(|s| !s.is_empty())
}

fn verify(args: &VerifyArgs, global: &Global) -> anyhow::Result<()> {
    let scope = match (
        nonempty(args.session.as_ref()),
        nonempty(args.agent.as_ref()),
    ) {
        (Some(session), _) => AuditScope::Session(session.to_owned()),
        (None, Some(agent)) => {
            if !agent.contains('/') {
                anyhow::bail!("--agent {agent:?} must be NS/NAME");
            }
            AuditScope::Agent(agent.to_owned())
        }
        (None, None) => AuditScope::All,
    };
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let report = client
            .verify_audit(&scope)
            .await
            .map_err(remote::fails("audit verify"))?;
        match report.problem {
            None => {
                writeln!(
                    io::stdout().lock(),
                    "verified {} events in {} streams",
                    report.events,
                    report.streams
                )?;
                Ok(())
            }
            Some(problem) => anyhow::bail!("audit verification failed: {}", problem.message),
        }
    })
}

fn export(args: &ExportArgs, global: &Global) -> anyhow::Result<()> {
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let mut events = client
            .export_audit(
                nonempty(args.since.as_ref()),
                nonempty(args.session.as_ref()),
            )
            .await
            .map_err(remote::fails("audit export"))?;
        let stdout = io::stdout();
        let mut out = io::BufWriter::new(stdout.lock());
        while let Some(event) = events.next().await.map_err(remote::fails("audit export"))? {
            writeln!(out, "{}", event_json(&event))?;
        }
        out.flush()?;
        Ok(())
    })
}

/// One JSONL line: the stored fields, the payload as JSON, both hashes, and the actor's
/// attribution when the event records one (it is then part of the hashed input).
fn event_json(e: &ExportedEvent) -> Value {
    let payload: Value = serde_json::from_str(&e.payload_json)
        .unwrap_or_else(|_| Value::String(e.payload_json.clone()));
    let mut line = json!({
        "stream": e.stream,
        "seq": e.seq,
        "type": e.event_type,
        "ts": e.ts,
        "actor": e.actor,
        "call_id": e.call_id,
        "turn": e.turn,
        "payload": payload,
        "prev_hash": e.prev_hash,
        "hash": e.hash,
    });
    if let Some(verification) = &e.actor_verification {
        line["actor_verification"] = json!(verification);
        line["actor_via"] = json!(e.actor_via);
    }
    line
}
