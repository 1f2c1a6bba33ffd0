//! Tool workers: the descriptor pins published agent versions hold, and the `workers` audit
//! stream of refused registrations.
//!
//! Pins are not stored: they are computed from the stored snapshots by
//! `phrony_manifest::CompiledAgent::tool_pins`, the one implementation, so snapshots and their
//! content hashes stay what earlier builds wrote. A refusal appends one
//! `worker.descriptor_refused` event to [`WORKERS_STREAM`]; it changes no projection (nothing
//! was registered), so [`crate::Ledger::rebuild_projections`] has nothing to replay for it.

use std::collections::BTreeSet;

use phrony_manifest::CompiledAgent;

use crate::db::{Conn, Tx, args};
use crate::error::Result;
use crate::event_body::{EventBody, WorkerDescriptorRefused};
use crate::events::{append, lock_stream};
use crate::model::Event;

/// The audit stream of refused worker registrations.
pub const WORKERS_STREAM: &str = "workers";

/// The runtime's own actor for events about workers.
const WORKER_ACTOR: &str = "worker";

/// Whether `tool` appears verbatim in a stored snapshot's JSON: names made only of
/// characters canonical JSON never escapes can be pre-filtered with `LIKE` (whose `_` and
/// `%` only widen the match; every row is checked exactly afterwards).
fn prefilterable(tool: &str) -> bool {
    !tool.is_empty()
        && tool
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// The distinct pins that published or vendored, non-retired agent versions hold for
/// `tool@version`, sorted. A stored snapshot this build cannot read is skipped (logged).
pub(crate) async fn descriptor_pins(
    conn: &mut Conn<'_>,
    tool: &str,
    version: &str,
) -> Result<Vec<String>> {
    let rows = if prefilterable(tool) {
        conn.fetch_all(
            "read agent versions binding a tool",
            "SELECT id, snapshot FROM agent_versions \
             WHERE retired_at IS NULL AND snapshot LIKE $1",
            args![format!("%{tool}%")],
        )
        .await?
    } else {
        conn.fetch_all(
            "read agent versions",
            "SELECT id, snapshot FROM agent_versions WHERE retired_at IS NULL",
            vec![],
        )
        .await?
    };
    let mut pins = BTreeSet::new();
    for row in rows {
        let snapshot = row.text("snapshot")?;
        let agent = match CompiledAgent::from_snapshot_json(snapshot.as_bytes()) {
            Ok(agent) => agent,
            Err(e) => {
                // A version this build cannot read cannot run here either (the engine reads
                // the same snapshot): it holds no pin a worker could serve.
                let id = row.text("id").unwrap_or_default();
                tracing::warn!(agent_version_id = %id, error = %e, "stored snapshot unreadable; its tool pins are ignored");
                continue;
            }
        };
        pins.extend(
            agent
                .tool_pins()
                .into_iter()
                .filter(|p| p.tool == tool && p.version == version)
                .map(|p| p.pin),
        );
    }
    Ok(pins.into_iter().collect())
}

/// Appends a `worker.descriptor_refused` event to [`WORKERS_STREAM`].
pub(crate) async fn record_refusal(
    tx: &mut Tx,
    refusal: &WorkerDescriptorRefused,
) -> Result<Event> {
    let mut head = lock_stream(tx, WORKERS_STREAM).await?;
    append(
        tx,
        &mut head,
        EventBody::WorkerDescriptorRefused(refusal.clone()).into_new_event(WORKER_ACTOR)?,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::prefilterable;

    #[test]
    fn only_names_json_never_escapes_are_prefiltered() {
        assert!(prefilterable("payments.issue-refund"));
        assert!(prefilterable("a_b.c-1"));
        assert!(!prefilterable(""));
        assert!(!prefilterable("a<b"));
        assert!(!prefilterable("a\"b"));
        assert!(!prefilterable("naïve"));
    }
}
