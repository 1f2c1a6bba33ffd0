//! Shadow decisions: what `mode: shadow` policies would have changed, recorded per call.
//!
//! A shadow outcome is one `policy.shadow` event in the policy's own hash-chained stream
//! `shadow:<namespace>/<name>` (one stream per shadow policy, across agents and versions), plus a
//! row of the `shadow_decisions` index (migration 0012) written in the same transaction. The index
//! answers [`crate::Ledger::shadow_decisions`] (one policy, since a time) without scanning the
//! log, and its primary key `(call_id, policy_ref)` makes the record idempotent: a call decided
//! again after a crash records its shadow outcome once. The table is not a projection the rebuild
//! replays: events are never removed, so it never goes stale.

use chrono::{DateTime, Utc};

use crate::db::{Conn, Tx, args};
use crate::error::{LedgerError, Result};
use crate::event_body::{EventBody, PolicyShadowed};
use crate::events::{EVENT_COLUMNS, append, lock_stream, stored_from_row};
use crate::model::Event;

/// The prefix of the shadow decision streams: `shadow:<namespace>/<name>`.
pub const SHADOW_STREAM_PREFIX: &str = "shadow:";

/// The runtime's own actor for policy outcomes (the one `tool.policy_denied` and approvals use).
const POLICY_ACTOR: &str = "policy";

/// The most rows one [`crate::Ledger::shadow_decisions`] read returns.
pub const MAX_SHADOW_DECISIONS: u32 = 1000;

/// The stream of one shadow policy's decisions.
#[must_use]
pub fn shadow_stream(namespace: &str, name: &str) -> String {
    format!("{SHADOW_STREAM_PREFIX}{namespace}/{name}")
}

/// Which shadow decisions to read: one policy (every version), recorded at or after `since`,
/// oldest first, at most `limit` (1 to [`MAX_SHADOW_DECISIONS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowDecisionFilter {
    /// The policy's namespace.
    pub namespace: String,
    /// The policy's name.
    pub name: String,
    /// Only decisions recorded at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// At most this many.
    pub limit: u32,
}

/// One recorded shadow decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowDecision {
    /// When it was recorded.
    pub recorded_at: DateTime<Utc>,
    /// Its event's position in the policy's stream.
    pub seq: u64,
    /// What the shadow policy would have changed.
    pub decision: PolicyShadowed,
}

/// `namespace/name` of a `namespace/name@version` policy ref.
fn policy_key(policy: &str) -> Result<(&str, &str)> {
    let unversioned = policy.split_once('@').map_or(policy, |(key, _)| key);
    match unversioned.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
            Ok((namespace, name))
        }
        _ => Err(LedgerError::invalid(format!(
            "shadow policy {policy:?} must be namespace/name@version"
        ))),
    }
}

/// Appends the `policy.shadow` event and its index row, unless this call's outcome for this
/// policy is recorded already (`None` then).
pub(crate) async fn record(tx: &mut Tx, shadowed: &PolicyShadowed) -> Result<Option<Event>> {
    let (namespace, name) = policy_key(&shadowed.policy)?;
    let stream = shadow_stream(namespace, name);
    let mut head = lock_stream(tx, &stream).await?;
    let recorded = tx
        .conn()
        .fetch_optional(
            "find shadow decision",
            "SELECT seq FROM shadow_decisions WHERE call_id = $1 AND policy_ref = $2",
            args![&shadowed.call_id, &shadowed.policy],
        )
        .await?;
    if recorded.is_some() {
        return Ok(None);
    }
    let mut new = EventBody::PolicyShadow(shadowed.clone()).into_new_event(POLICY_ACTOR)?;
    new.call_id = Some(shadowed.call_id.clone());
    let event = append(tx, &mut head, new).await?;
    let seq = i64::try_from(event.seq)
        .map_err(|_| LedgerError::corrupt(format!("stream {stream}: seq out of range")))?;
    tx.conn()
        .execute(
            "index shadow decision",
            "INSERT INTO shadow_decisions (call_id, policy_ref, policy_namespace, policy_name, \
             session_id, stream, seq, recorded_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            args![
                &shadowed.call_id,
                &shadowed.policy,
                namespace,
                name,
                &shadowed.session_id,
                &stream,
                seq,
                event.ts
            ],
        )
        .await?;
    Ok(Some(event))
}

/// The decisions `filter` selects, oldest first, read through the index.
pub(crate) async fn list(
    conn: &mut Conn<'_>,
    filter: &ShadowDecisionFilter,
) -> Result<Vec<ShadowDecision>> {
    let columns: Vec<String> = EVENT_COLUMNS
        .split(',')
        .map(|c| format!("e.{}", c.trim()))
        .collect();
    let sql = format!(
        "SELECT {} FROM shadow_decisions d JOIN events e ON e.stream = d.stream AND e.seq = d.seq \
         WHERE d.policy_namespace = $1 AND d.policy_name = $2 \
         AND d.recorded_at >= $3 \
         ORDER BY d.recorded_at, d.seq LIMIT $4",
        columns.join(", ")
    );
    let rows = conn
        .fetch_all(
            "read shadow decisions",
            &sql,
            args![
                &filter.namespace,
                &filter.name,
                filter.since.unwrap_or(DateTime::UNIX_EPOCH),
                i64::from(filter.limit)
            ],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let event = stored_from_row(row)?.into_event()?;
            match event.body()? {
                EventBody::PolicyShadow(decision) => Ok(ShadowDecision {
                    recorded_at: event.ts,
                    seq: event.seq,
                    decision,
                }),
                other => Err(LedgerError::corrupt(format!(
                    "stream {} seq {}: the shadow index points at a {} event",
                    event.stream,
                    event.seq,
                    other.event_type()
                ))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::policy_key;

    #[test]
    fn a_policy_ref_names_its_stream_key() {
        assert_eq!(
            policy_key("payments/no-gold@1.0.0").ok(),
            Some(("payments", "no-gold"))
        );
        assert_eq!(
            policy_key("payments/no-gold").ok(),
            Some(("payments", "no-gold"))
        );
        for bad in ["no-gold@1.0.0", "/x@1", "payments/@1", ""] {
            assert!(policy_key(bad).is_err(), "{bad}");
        }
    }
}
