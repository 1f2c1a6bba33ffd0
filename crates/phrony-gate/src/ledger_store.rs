//! [`GateStore`] on the hash-chained event log of `phrony-ledger` (SQLite or PostgreSQL).
//!
//! The gate's events go to one stream per organisation, `gate-<org id>`; the ledger chains
//! them, refuses edits and deletions, and verifies the chain on open. No SQL lives here.

use async_trait::async_trait;
use phrony_ledger::{Ledger, NewEvent};

use crate::store::{AuditEvent, GateStore, NewAuditEvent, StoreError};

/// The page size used to read the log back.
const PAGE: u32 = 1000;

/// A gate store in a ledger database.
#[derive(Debug, Clone)]
pub struct LedgerStore {
    ledger: Ledger,
    stream: String,
}

impl LedgerStore {
    /// Connects to `url` (`sqlite://…` or `postgres://…`), migrates, and uses the stream of
    /// organisation `org_id`.
    ///
    /// # Errors
    /// [`StoreError`] when the database cannot be opened or migrated.
    pub async fn open(url: &str, org_id: &str) -> Result<Self, StoreError> {
        let ledger = Ledger::connect(url)
            .await
            .map_err(|e| StoreError(format!("opening {url}: {e}")))?;
        ledger
            .migrate()
            .await
            .map_err(|e| StoreError(format!("migrating {url}: {e}")))?;
        Ok(Self {
            ledger,
            stream: stream_name(org_id),
        })
    }

    /// The stream holding this organisation's gate events.
    #[must_use]
    pub fn stream(&self) -> &str {
        &self.stream
    }
}

/// `gate-<org>`, with characters the ledger reserves replaced.
fn stream_name(org_id: &str) -> String {
    let safe: String = org_id
        .chars()
        .map(|c| {
            if c == ':' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect();
    format!("gate-{safe}")
}

fn convert(event: phrony_ledger::Event) -> AuditEvent {
    AuditEvent {
        seq: event.seq,
        ts: event.ts,
        event_type: event.event_type,
        actor: event.actor,
        payload: event.payload,
        prev_hash: event.prev_hash,
        hash: event.hash,
    }
}

#[async_trait]
impl GateStore for LedgerStore {
    async fn append(&self, event: NewAuditEvent) -> Result<AuditEvent, StoreError> {
        self.ledger
            .append_session_event(
                &self.stream,
                NewEvent::new(event.event_type, event.actor, event.payload),
            )
            .await
            .map(convert)
            .map_err(|e| StoreError(e.to_string()))
    }

    async fn append_batch(
        &self,
        events: Vec<NewAuditEvent>,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let batch = events
            .into_iter()
            .map(|e| NewEvent::new(e.event_type, e.actor, e.payload))
            .collect();
        self.ledger
            .append_session_events(&self.stream, batch)
            .await
            .map(|stored| stored.into_iter().map(convert).collect())
            .map_err(|e| StoreError(e.to_string()))
    }

    async fn load(&self) -> Result<Vec<AuditEvent>, StoreError> {
        let mut out = Vec::new();
        loop {
            let after = out.last().map_or(0, |e: &AuditEvent| e.seq);
            let page = match self.ledger.list_events(&self.stream, after, PAGE).await {
                Ok(page) => page,
                Err(phrony_ledger::LedgerError::NotFound { .. }) if out.is_empty() => {
                    return Ok(out);
                }
                Err(e) => return Err(StoreError(e.to_string())),
            };
            let full = page.len() == PAGE as usize;
            out.extend(page.into_iter().map(convert));
            if !full {
                return Ok(out);
            }
        }
    }

    async fn verify(&self) -> Result<Option<String>, StoreError> {
        match self.ledger.verify_stream(&self.stream).await {
            Ok(report) => Ok(report.violation.map(|v| v.message)),
            Err(phrony_ledger::LedgerError::NotFound { .. }) => Ok(None),
            Err(e) => Err(StoreError(e.to_string())),
        }
    }
}
