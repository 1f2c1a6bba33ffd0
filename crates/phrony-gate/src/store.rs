//! Durable state behind a small trait: the gate's audit log *is* its state.
//!
//! Every decision, replay, approval action and completion is appended as one event; the
//! engine's projections (idempotency records, holds and counters, approvals, velocity and
//! duplicate windows) are rebuilt by replaying the log on start and updated by applying each
//! event after it is durably appended. A state change and its audit event are therefore one
//! write. Implementations hash-chain the events.

use std::sync::Mutex;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::{Value, json};

use crate::canonical::{canonical_json, sha256_hex};

/// The previous hash of the first event.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// An event to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAuditEvent {
    /// Dotted type: `gate.decision`, `gate.decision_replayed`, `gate.approval_decided`,
    /// `gate.completed`, `gate.console_login`.
    pub event_type: String,
    /// Who caused it (an agent id or an approver).
    pub actor: String,
    /// The event body.
    pub payload: Value,
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEvent {
    /// Position in the log, gap-free from 1.
    pub seq: u64,
    /// When it was appended.
    pub ts: DateTime<Utc>,
    /// Dotted type.
    #[serde(rename = "type")]
    pub event_type: String,
    /// Who caused it.
    pub actor: String,
    /// The event body.
    pub payload: Value,
    /// The previous event's hash.
    pub prev_hash: String,
    /// This event's hash.
    pub hash: String,
}

/// A store failure.
#[derive(Debug, Clone, thiserror::Error)]
#[error("gate store: {0}")]
pub struct StoreError(pub String);

/// Where the gate's events live.
#[async_trait]
pub trait GateStore: Send + Sync + std::fmt::Debug {
    /// Appends one event durably and returns it as stored.
    async fn append(&self, event: NewAuditEvent) -> Result<AuditEvent, StoreError>;
    /// Appends `events` durably, in order, as one write (one transaction, one fsync), and
    /// returns them as stored: all of them, or on error none. The gate's log writer
    /// ([`crate::engine`]) commits its queued events through this.
    async fn append_batch(&self, events: Vec<NewAuditEvent>)
    -> Result<Vec<AuditEvent>, StoreError>;
    /// Every event, in order.
    async fn load(&self) -> Result<Vec<AuditEvent>, StoreError>;
    /// Recomputes the hash chain; `Ok(None)` when intact, `Ok(Some(message))` naming the first
    /// broken event otherwise.
    async fn verify(&self) -> Result<Option<String>, StoreError>;
}

/// An in-memory store (flags mode without `--state-dir`, and tests). Its chain hash is
/// SHA-256 over the canonical JSON of
/// `["phrony.gate.v1", seq, type, ts, actor, payload, prev_hash]`.
#[derive(Debug, Default)]
pub struct MemoryStore {
    events: Mutex<Vec<AuditEvent>>,
}

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

fn chain_hash(
    seq: u64,
    event_type: &str,
    ts: &DateTime<Utc>,
    actor: &str,
    payload: &Value,
    prev: &str,
) -> String {
    let input = json!([
        "phrony.gate.v1",
        seq,
        event_type,
        ts.to_rfc3339_opts(SecondsFormat::Micros, true),
        actor,
        payload,
        prev
    ]);
    sha256_hex(canonical_json(&input).as_bytes())
}

fn push(events: &mut Vec<AuditEvent>, event: NewAuditEvent) -> AuditEvent {
    let seq = events.len() as u64 + 1;
    let prev_hash = events
        .last()
        .map_or_else(|| GENESIS_HASH.to_owned(), |e| e.hash.clone());
    let ts = Utc::now();
    let hash = chain_hash(
        seq,
        &event.event_type,
        &ts,
        &event.actor,
        &event.payload,
        &prev_hash,
    );
    let stored = AuditEvent {
        seq,
        ts,
        event_type: event.event_type,
        actor: event.actor,
        payload: event.payload,
        prev_hash,
        hash,
    };
    events.push(stored.clone());
    stored
}

#[async_trait]
impl GateStore for MemoryStore {
    async fn append(&self, event: NewAuditEvent) -> Result<AuditEvent, StoreError> {
        let mut events = self
            .events
            .lock()
            .map_err(|_| StoreError("memory store poisoned".into()))?;
        Ok(push(&mut events, event))
    }

    async fn append_batch(&self, batch: Vec<NewAuditEvent>) -> Result<Vec<AuditEvent>, StoreError> {
        let mut events = self
            .events
            .lock()
            .map_err(|_| StoreError("memory store poisoned".into()))?;
        Ok(batch
            .into_iter()
            .map(|event| push(&mut events, event))
            .collect())
    }

    async fn load(&self) -> Result<Vec<AuditEvent>, StoreError> {
        self.events
            .lock()
            .map(|e| e.clone())
            .map_err(|_| StoreError("memory store poisoned".into()))
    }

    async fn verify(&self) -> Result<Option<String>, StoreError> {
        let events = self.load().await?;
        let mut prev = GENESIS_HASH.to_owned();
        for e in &events {
            let want = chain_hash(e.seq, &e.event_type, &e.ts, &e.actor, &e.payload, &prev);
            if e.prev_hash != prev || e.hash != want {
                return Ok(Some(format!("event {} does not chain", e.seq)));
            }
            prev = e.hash.clone();
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_store_chains_events() {
        let store = MemoryStore::new();
        for i in 0..3 {
            store
                .append(NewAuditEvent {
                    event_type: "gate.decision".into(),
                    actor: "a".into(),
                    payload: json!({"i": i}),
                })
                .await
                .unwrap();
        }
        let events = store.load().await.unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].prev_hash, GENESIS_HASH);
        assert_eq!(events[1].prev_hash, events[0].hash);
        assert_eq!(store.verify().await.unwrap(), None);
        store.events.lock().unwrap()[1].payload = json!({"i": 99});
        assert_eq!(
            store.verify().await.unwrap().as_deref(),
            Some("event 2 does not chain")
        );
    }
}
