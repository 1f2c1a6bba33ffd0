//! Opening a gate with its key and store, as `mock-gate` does.
//!
//! With a state directory the gate keeps `signing-key.pem` (the token key, so the JWKS
//! survives restarts) and `gate.db` (the SQLite ledger holding the audit log and therefore all
//! state) there. Without one, the key is generated in memory and state is kept in memory.
//!
//! [`export_audit`] reads the audit log of a state directory directly (the gate may be
//! stopped), as `mock-gate audit export --config` does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Settings;
use crate::engine::{Gate, SystemClock};
use crate::error::GateError;
use crate::keys::SigningKey;
use crate::ledger_store::LedgerStore;
use crate::store::{AuditEvent, GateStore, MemoryStore, StoreError};

/// The token key file inside a state directory.
pub const SIGNING_KEY_FILE: &str = "signing-key.pem";
/// The SQLite database inside a state directory.
pub const DATABASE_FILE: &str = "gate.db";

/// The SQLite URL of the gate database in `state_dir`.
#[must_use]
pub fn database_url(state_dir: &Path) -> String {
    format!("sqlite://{}", state_dir.join(DATABASE_FILE).display())
}

/// Opens the store of `state_dir`, or an in-memory one.
///
/// # Errors
/// [`GateError::Store`] when the database cannot be opened.
pub async fn open_store(
    state_dir: Option<&Path>,
    org_id: &str,
) -> Result<Arc<dyn GateStore>, GateError> {
    Ok(match state_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| {
                crate::store::StoreError(format!("creating {}: {e}", dir.display()))
            })?;
            Arc::new(LedgerStore::open(&database_url(dir), org_id).await?)
        }
        None => Arc::new(MemoryStore::new()),
    })
}

/// Opens a gate for `settings` with the key and store of `state_dir` (the settings' own
/// `state_dir` when `None`), on the system clock.
///
/// # Errors
/// [`GateError`] when the key, store or IdP cannot be opened or the log does not replay.
pub async fn open(settings: Settings, state_dir: Option<PathBuf>) -> Result<Gate, GateError> {
    let dir = state_dir.or_else(|| settings.state_dir.clone());
    let key = match &dir {
        Some(dir) => SigningKey::load_or_create(&dir.join(SIGNING_KEY_FILE))?,
        None => SigningKey::generate()?,
    };
    let store = open_store(dir.as_deref(), &settings.org_id).await?;
    Gate::open(settings, key, store, Arc::new(SystemClock)).await
}

/// Why an audit export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The state directory's database cannot be opened.
    #[error(transparent)]
    Open(#[from] GateError),
    /// The store failed while verifying or reading the log.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The log's hash chain is broken.
    #[error("the audit log does not verify: {0}")]
    Tampered(String),
    /// An event could not be encoded.
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
}

/// The audit log as JSON Lines: one event per line, each ending with a newline (the body of
/// `GET /v1/admin/audit`).
///
/// # Errors
/// When an event cannot be encoded as JSON.
pub fn audit_jsonl(events: &[AuditEvent]) -> Result<String, serde_json::Error> {
    let mut text = String::new();
    for event in events {
        text.push_str(&serde_json::to_string(event)?);
        text.push('\n');
    }
    Ok(text)
}

/// The audit log of `state_dir` as JSON Lines, after checking its hash chain.
///
/// # Errors
/// [`ExportError`] when the store cannot be opened or read, or the chain is broken.
pub async fn export_audit(state_dir: &Path, org_id: &str) -> Result<String, ExportError> {
    let store = open_store(Some(state_dir), org_id).await?;
    if let Some(problem) = store.verify().await? {
        return Err(ExportError::Tampered(problem));
    }
    Ok(audit_jsonl(&store.load().await?)?)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{audit_jsonl, export_audit, open_store};
    use crate::store::NewAuditEvent;

    #[tokio::test]
    async fn an_export_is_the_verified_log_one_event_a_line() {
        let dir = tempfile::tempdir().expect("temporary directory");
        assert_eq!(
            export_audit(dir.path(), "org_test")
                .await
                .expect("empty log"),
            ""
        );
        let store = open_store(Some(dir.path()), "org_test")
            .await
            .expect("store");
        for (actor, n) in [("agent_a", 1), ("alice", 2)] {
            store
                .append(NewAuditEvent {
                    event_type: "gate.decision".into(),
                    actor: actor.into(),
                    payload: json!({"n": n}),
                })
                .await
                .expect("append");
        }
        drop(store);
        let text = export_audit(dir.path(), "org_test").await.expect("export");
        assert!(text.ends_with('\n'));
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["seq"], 1);
        assert_eq!(lines[0]["type"], "gate.decision");
        assert_eq!(lines[0]["actor"], "agent_a");
        assert_eq!(lines[1]["payload"], json!({"n": 2}));
        assert_eq!(lines[1]["prev_hash"], lines[0]["hash"]);
        let reopened = open_store(Some(dir.path()), "org_test")
            .await
            .expect("store");
        let events = reopened.load().await.expect("load");
        assert_eq!(audit_jsonl(&events).expect("encode"), text);
    }
}
