//! Opening a gate with its key and store, as `mock-gate` does.
//!
//! With a state directory the gate keeps `signing-key.pem` (the token key, so the JWKS
//! survives restarts) and `gate.db` (the SQLite ledger holding the audit log and therefore all
//! state) there. Without one, the key is generated in memory and state is kept in memory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Settings;
use crate::engine::{Gate, SystemClock};
use crate::error::GateError;
use crate::keys::SigningKey;
use crate::ledger_store::LedgerStore;
use crate::store::{GateStore, MemoryStore};

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
