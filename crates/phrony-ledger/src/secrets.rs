//! Storage of per-session secrets, as ciphertext only (`session_secrets`).
//!
//! The ledger never sees plaintext and never writes secrets to events. Callers seal values
//! with [`crate::SecretCipher`] (AES-256-GCM, associated data `session_id + "\0" + name`) and
//! store the [`SealedSecret`]s, either with [`crate::NewSession::secrets`] (one transaction with
//! the session) or with [`Ledger::store_session_secrets`] (e.g. copies for a delegated child).
//! Every terminal transition deletes the session's secrets in its transaction;
//! [`Ledger::purge_orphan_secrets`] removes any left behind (run it at start-up).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use crate::Ledger;
use crate::db::{Arg, Conn, Tx, args};
use crate::error::{LedgerError, Result};
use crate::events::lock_session;
use crate::rows;

/// Nonce length of AES-256-GCM.
pub const NONCE_LEN: usize = 12;

/// One encrypted secret as stored: the plaintext is never held by the ledger.
#[derive(Clone, PartialEq, Eq)]
pub struct SealedSecret {
    /// The secret's name (the key under `secrets:` in the manifest).
    pub name: String,
    /// Version of the key that sealed it (≥ 1).
    pub key_version: u32,
    /// The 12-byte nonce.
    pub nonce: Vec<u8>,
    /// Ciphertext with the GCM tag.
    pub ciphertext: Vec<u8>,
}

impl std::fmt::Debug for SealedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedSecret")
            .field("name", &self.name)
            .field("key_version", &self.key_version)
            .field("ciphertext_len", &self.ciphertext.len())
            .finish_non_exhaustive()
    }
}

/// Checks a batch: non-empty unique names, a 12-byte nonce, a key version, some ciphertext.
pub(crate) fn validate_batch(batch: &[SealedSecret]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for s in batch {
        if s.name.trim().is_empty() {
            return Err(LedgerError::invalid("secret names must not be empty"));
        }
        if !seen.insert(s.name.as_str()) {
            return Err(LedgerError::invalid(format!(
                "secret {:?} is given more than once",
                s.name
            )));
        }
        if s.key_version < 1 {
            return Err(LedgerError::invalid(format!(
                "secret {:?}: key_version must be at least 1",
                s.name
            )));
        }
        if s.nonce.len() != NONCE_LEN {
            return Err(LedgerError::invalid(format!(
                "secret {:?}: nonce must be {NONCE_LEN} bytes, got {}",
                s.name,
                s.nonce.len()
            )));
        }
        if s.ciphertext.is_empty() {
            return Err(LedgerError::invalid(format!(
                "secret {:?}: ciphertext is empty",
                s.name
            )));
        }
    }
    Ok(())
}

pub(crate) async fn insert(
    conn: &mut Conn<'_>,
    session_id: &str,
    batch: &[SealedSecret],
    at: DateTime<Utc>,
) -> Result<()> {
    for s in batch {
        conn.execute(
            "store session secret",
            "INSERT INTO session_secrets (session_id, name, key_version, nonce, ciphertext, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6)",
            vec![
                Arg::from(session_id),
                Arg::from(s.name.as_str()),
                Arg::from(i64::from(s.key_version)),
                Arg::Bytes(s.nonce.clone()),
                Arg::Bytes(s.ciphertext.clone()),
                Arg::from(at),
            ],
        )
        .await?;
    }
    Ok(())
}

pub(crate) async fn purge(conn: &mut Conn<'_>, session_id: &str) -> Result<u64> {
    conn.execute(
        "purge session secrets",
        "DELETE FROM session_secrets WHERE session_id = $1",
        args![session_id],
    )
    .await
}

async fn store(tx: &mut Tx, session_id: &str, batch: &[SealedSecret]) -> Result<()> {
    // The session's stream lock orders this against a concurrent terminal transition.
    let (_, session) = lock_session(tx, session_id).await?;
    if session.status.is_terminal() {
        return Err(LedgerError::precondition(format!(
            "session {session_id} is {} and cannot store secrets",
            session.status
        )));
    }
    for s in batch {
        let exists = tx
            .conn()
            .fetch_optional(
                "check session secret",
                "SELECT 1 AS one FROM session_secrets WHERE session_id = $1 AND name = $2",
                args![session_id, s.name.as_str()],
            )
            .await?
            .is_some();
        if exists {
            return Err(LedgerError::AlreadyExists {
                message: format!(
                    "session {session_id} already has a secret named {:?}",
                    s.name
                ),
            });
        }
    }
    let now = tx.now();
    insert(&mut tx.conn(), session_id, batch, now).await
}

impl Ledger {
    /// Stores sealed secrets for a running session (all or none).
    ///
    /// # Errors
    /// `NotFound` (session); `FailedPrecondition` (terminal session); `AlreadyExists` (a name
    /// is already stored); `InvalidArgument` (empty or duplicate name, bad nonce length, empty
    /// ciphertext, key version 0).
    pub async fn store_session_secrets(
        &self,
        session_id: &str,
        secrets: Vec<SealedSecret>,
    ) -> Result<()> {
        validate_batch(&secrets)?;
        write_tx!(self, |tx| store(&mut tx, session_id, &secrets))
    }

    /// A session's sealed secrets, by name. Empty once the session has ended.
    ///
    /// # Errors
    /// `NotFound`: `session X not found`.
    pub async fn load_session_secrets(&self, session_id: &str) -> Result<Vec<SealedSecret>> {
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        rows::require_session_head(&mut c, session_id).await?;
        c.fetch_all(
            "load session secrets",
            "SELECT name, key_version, nonce, ciphertext FROM session_secrets \
             WHERE session_id = $1 ORDER BY name",
            args![session_id],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(SealedSecret {
                name: r.text("name")?,
                key_version: u32::try_from(r.int("key_version")?).map_err(|_| {
                    LedgerError::corrupt("session_secrets.key_version out of range")
                })?,
                nonce: r.bytes("nonce")?,
                ciphertext: r.bytes("ciphertext")?,
            })
        })
        .collect()
    }

    /// Deletes the secrets of sessions that are terminal or gone (left behind by a crash or by
    /// an older build); returns how many were deleted. Run at daemon start.
    ///
    /// # Errors
    /// Database errors.
    pub async fn purge_orphan_secrets(&self) -> Result<u64> {
        write_tx!(self, |tx| async {
            tx.conn()
                .execute(
                    "purge orphan secrets",
                    "DELETE FROM session_secrets WHERE session_id NOT IN \
                     (SELECT id FROM sessions WHERE status NOT IN \
                      ('completed', 'failed', 'cancelled'))",
                    vec![],
                )
                .await
        })
    }
}
