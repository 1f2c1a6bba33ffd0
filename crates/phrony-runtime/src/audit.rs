//! The audit key file, the daemon's start-up audit check with its recovery override, and the
//! offline `phrony-runtime audit verify`.
//!
//! The audit key MACs every stream head of the event log (see `phrony_ledger::AuditKey`). It
//! lives in a file outside the database (`RUNTIME_AUDIT_KEY_FILE`, default `audit.key` next
//! to the SQLite file or in the data directory), created owner-only (0600) on first start in
//! the same format as the secrets key file (64 hex digits). Back it up separately from the
//! database: an attacker who can read it can forge sealed heads.

use std::path::Path;

use anyhow::Context as _;
use phrony_ledger::{AgentRef, AuditKey, AuditScope, AuditStart, Ledger};

use crate::config::AuditVerifyArgs;
use crate::serve_config::{KeyFileOutcome, SecretsKey};

/// Reads the audit key at `path`, creating it (0600) when `create` and it does not exist.
///
/// # Errors
/// A missing file when `!create`, an unreadable or malformed file, or a failure to create it.
pub(crate) fn load_key(path: &Path, create: bool) -> anyhow::Result<(AuditKey, KeyFileOutcome)> {
    if !create && !path.exists() {
        anyhow::bail!(
            "audit key file {} not found: set RUNTIME_AUDIT_KEY_FILE to the key the daemon uses",
            path.display()
        );
    }
    let (key, outcome) = SecretsKey::load_or_create_named(path, "audit key file")
        .with_context(|| format!("cannot set up the audit key {}", path.display()))?;
    let key = AuditKey::from_bytes(*key.as_bytes());
    match outcome {
        KeyFileOutcome::Created => tracing::info!(
            key_id = %key.key_id(),
            "generated a new audit key in {} (owner-only); keep it, and a copy away from the \
             database: it seals the event log",
            path.display()
        ),
        KeyFileOutcome::Loaded => {
            tracing::info!(key_id = %key.key_id(), "audit key: {}", path.display());
        }
    }
    Ok((key, outcome))
}

/// The start-up check: triggers and sealed heads (no re-fold). A failing log is refused with
/// one line naming the stream, unless `allow` (the override), which is logged, recorded as an
/// event and re-seals the heads.
///
/// # Errors
/// The refusal, or a database error.
pub(crate) async fn check_at_start(
    ledger: &Ledger,
    outcome: KeyFileOutcome,
    allow: bool,
    actor: &str,
) -> anyhow::Result<()> {
    let started = ledger
        .start_audit(outcome == KeyFileOutcome::Created)
        .await
        .context("cannot check the event log's audit heads")?;
    match started {
        AuditStart::Verified { streams } => {
            tracing::info!(
                streams,
                "event log: sealed heads and append-only triggers verified"
            );
        }
        AuditStart::Sealed { streams, events } => tracing::info!(
            streams,
            events,
            "event log: verified and sealed with the audit key (recorded in the audit stream)"
        ),
        AuditStart::Failed(problem) if allow => {
            tracing::warn!(
                problem = %problem,
                "serving an event log that FAILED its audit check, because \
                 --allow-unverified-log / RUNTIME_ALLOW_UNVERIFIED_LOG is set; the override is \
                 recorded in the audit stream and the heads are re-sealed"
            );
            ledger
                .allow_unverified_log(&problem, actor)
                .await
                .context("cannot record the unverified-log override")?;
        }
        AuditStart::Failed(problem) => anyhow::bail!(
            "the event log failed its audit check: {problem}; refusing to serve it (inspect it \
             with `phrony-runtime audit verify`; to serve it anyway, start once with \
             --allow-unverified-log or RUNTIME_ALLOW_UNVERIFIED_LOG=1)"
        ),
    }
    Ok(())
}

/// The scope named by `audit verify`'s flags.
pub(crate) fn scope(args: &AuditVerifyArgs) -> anyhow::Result<AuditScope> {
    if let Some(session) = args
        .session
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        return Ok(AuditScope::Session(session.to_owned()));
    }
    if let Some(agent) = args
        .agent
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let Some((namespace, name)) = agent.split_once('/') else {
            anyhow::bail!("--agent {agent:?} must be NS/NAME");
        };
        return Ok(AuditScope::Agent(AgentRef::new(namespace, name)));
    }
    Ok(AuditScope::All)
}

/// Runs the full verification and prints its one-line result.
///
/// # Errors
/// The first problem (so that the command exits 1), or a database error.
pub(crate) async fn verify(ledger: &Ledger, args: &AuditVerifyArgs) -> anyhow::Result<()> {
    let scope = scope(args)?;
    let report = ledger
        .verify_audit(scope)
        .await
        .context("cannot verify the event log")?;
    match report.problem {
        None => {
            println!(
                "verified {} events in {} streams",
                report.events, report.streams
            );
            Ok(())
        }
        Some(problem) => anyhow::bail!("audit verification failed: {problem}"),
    }
}
