//! The indexed state of history-aware policy conditions (migration 0014).
//!
//! The policy crate asks aggregates of earlier calls ("the sum of `amount` of this session's
//! `issue_refund` calls with the same `order_id`"); the engine answers them from here, never by
//! scanning the log. Per (query key, scope key, group key) a `history_groups` row keeps the
//! reserved and committed counts and sums and a version; per (call, query) a `history_entries`
//! row keeps the call's amount, state and decision time (for windows, `max` and `last`).
//!
//! Life of an entry:
//! - **reserved** by [`crate::Ledger::reserve_history`] when a decision lets the call go on
//!   (allowed, or an approval opened): written only if every group's version is still the one the
//!   decision read ([`HistoryCounts::version`]), else nothing is written and the caller decides
//!   again (optimistic concurrency: two deciders can never both pass a cap only one fits). A
//!   reservation is idempotent per (call, query): a call decided again after a restart keeps its
//!   entry, and [`crate::Ledger::history_facts`] never counts the call's own entries.
//! - **committed** with the call's `tool.completed` (succeeded) event, in its transaction; an
//!   `of: result.<path>` amount is read from the result then.
//! - **released** (deleted) with `tool.completed` (failed), `tool.policy_denied` or
//!   `tool.cancelled`, in that event's transaction. `tool.indeterminate` leaves it reserved: an
//!   unknown outcome is counted until an operator resolves it.
//!
//! Amounts are stored in micro-units (`round(x × 10⁶)`, |x| below 9·10¹²), so sums are exact.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::db::{Conn, Tx, args};
use crate::error::{LedgerError, Result};

/// The most history reads (or reservations) one call may ask in one round trip.
pub const MAX_HISTORY_READS: usize = 64;

/// Which group of which query: the identity of a `history_groups` row.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HistoryKey {
    /// The policy crate's query key.
    pub query_key: String,
    /// Session id, `namespace/name` of the agent, or `*` (everyone).
    pub scope_key: String,
    /// The values of the query's `same` arguments (`""` without `same`).
    pub group_key: String,
}

/// One aggregate to read for a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRead {
    /// The group.
    pub key: HistoryKey,
    /// Only entries decided at or after this time (the window's start), exact to the
    /// microsecond; `None`: all time.
    pub since: Option<DateTime<Utc>>,
}

/// The answer to one [`HistoryRead`], without the asking call's own entries.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HistoryCounts {
    /// Entries reserved or committed.
    pub count: u64,
    /// Sum of their amounts.
    pub sum: f64,
    /// Largest amount.
    pub max: Option<f64>,
    /// Entries committed.
    pub committed: u64,
    /// Amount of the latest committed entry that has one.
    pub last: Option<f64>,
    /// The group's version when read (0: no row yet).
    pub version: i64,
}

/// One entry a decision reserves.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryReservation {
    /// The group.
    pub key: HistoryKey,
    /// The call's amount (an argument), if the query has one.
    pub amount: Option<f64>,
    /// The path into the call's result whose number becomes the amount when it succeeds.
    pub result_path: Option<String>,
    /// The group version the decision read; the reservation is refused if it changed.
    pub expected_version: i64,
}

const MICROS: f64 = 1_000_000.0;
const MAX_AMOUNT: f64 = 9.0e12;

/// An amount in micro-units; `None` for non-finite or too large values.
pub(crate) fn to_micros(x: f64) -> Option<i64> {
    if !x.is_finite() || x.abs() >= MAX_AMOUNT {
        return None;
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "bounded above by 9e18, within i64"
    )]
    Some((x * MICROS).round() as i64)
}

#[allow(clippy::cast_precision_loss, reason = "amounts below 9e18 micro-units")]
fn from_micros(m: i64) -> f64 {
    m as f64 / MICROS
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Reads the aggregates of `reads` for `call_id`, leaving its own entries out.
pub(crate) async fn facts(
    conn: &mut Conn<'_>,
    call_id: &str,
    reads: &[HistoryRead],
) -> Result<Vec<HistoryCounts>> {
    let mut out = Vec::with_capacity(reads.len());
    for read in reads {
        let k = &read.key;
        let row = conn
            .fetch_optional(
                "read history group",
                "SELECT version, reserved_count, reserved_sum, committed_count, committed_sum \
                 FROM history_groups WHERE query_key = $1 AND scope_key = $2 AND group_key = $3",
                args![&k.query_key, &k.scope_key, &k.group_key],
            )
            .await?;
        let Some(row) = row else {
            out.push(HistoryCounts::default());
            continue;
        };
        let mut counts = HistoryCounts {
            version: row.int("version")?,
            ..HistoryCounts::default()
        };
        let (n, sum, committed) = match read.since {
            // Unwindowed count and sum come from the counters, minus the call's own entry.
            None => {
                let own = conn
                    .fetch_optional(
                        "read own history entry",
                        "SELECT amount, state FROM history_entries \
                         WHERE call_id = $1 AND query_key = $2 AND scope_key = $3 AND group_key = $4",
                        args![call_id, &k.query_key, &k.scope_key, &k.group_key],
                    )
                    .await?;
                let (own_n, own_sum, own_done) = match own {
                    Some(r) => (
                        1,
                        r.opt_int("amount")?.unwrap_or(0),
                        i64::from(r.text("state")? == "committed"),
                    ),
                    None => (0, 0, 0),
                };
                let reserved = row.int("reserved_count")?;
                let done = row.int("committed_count")?;
                (
                    reserved + done - own_n,
                    row.int("reserved_sum")? + row.int("committed_sum")? - own_sum,
                    done - own_done,
                )
            }
            // A window: exact over the time index, from its start.
            Some(since) => {
                let r = conn
                    .fetch_optional(
                        "read history window",
                        "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(amount), 0) AS BIGINT) AS total, \
                         CAST(COALESCE(SUM(CASE WHEN state = 'committed' THEN 1 ELSE 0 END), 0) AS BIGINT) AS done \
                         FROM history_entries WHERE query_key = $1 AND scope_key = $2 \
                         AND group_key = $3 AND at >= $4 AND call_id <> $5",
                        args![&k.query_key, &k.scope_key, &k.group_key, since, call_id],
                    )
                    .await?
                    .ok_or_else(|| LedgerError::corrupt("an aggregate returned no row"))?;
                (r.int("n")?, r.int("total")?, r.int("done")?)
            }
        };
        counts.count = count(n);
        counts.sum = from_micros(sum);
        counts.committed = count(committed);
        let since = read.since.unwrap_or(DateTime::UNIX_EPOCH);
        let max = conn
            .fetch_optional(
                "read history max",
                "SELECT MAX(amount) AS top FROM history_entries WHERE query_key = $1 \
                 AND scope_key = $2 AND group_key = $3 AND at >= $4 AND call_id <> $5 \
                 AND amount IS NOT NULL",
                args![&k.query_key, &k.scope_key, &k.group_key, since, call_id],
            )
            .await?;
        counts.max = match max {
            Some(r) => r.opt_int("top")?.map(from_micros),
            None => None,
        };
        let last = conn
            .fetch_optional(
                "read history last",
                "SELECT amount FROM history_entries WHERE query_key = $1 AND scope_key = $2 \
                 AND group_key = $3 AND at >= $4 AND call_id <> $5 AND state = 'committed' \
                 AND amount IS NOT NULL ORDER BY at DESC, call_id DESC LIMIT 1",
                args![&k.query_key, &k.scope_key, &k.group_key, since, call_id],
            )
            .await?;
        counts.last = match last {
            Some(r) => r.opt_int("amount")?.map(from_micros),
            None => None,
        };
        out.push(counts);
    }
    Ok(out)
}

/// Writes the reservations of `call_id` if every group is still at its expected version;
/// `false` (nothing reserved) when one changed. Entries the call already holds are kept as they
/// are (idempotent per call and query).
pub(crate) async fn reserve(
    tx: &mut Tx,
    session_id: &str,
    call_id: &str,
    reservations: &[HistoryReservation],
) -> Result<bool> {
    let at = tx.now();
    let mut fresh = Vec::with_capacity(reservations.len());
    for r in reservations {
        let amount = match r.amount {
            None => None,
            Some(x) => Some(to_micros(x).ok_or_else(|| {
                LedgerError::invalid(format!(
                    "history amount {x} of call {call_id} is not a finite number below 9e12"
                ))
            })?),
        };
        let held = tx
            .conn()
            .fetch_optional(
                "find history reservation",
                "SELECT state FROM history_entries WHERE call_id = $1 AND query_key = $2",
                args![call_id, &r.key.query_key],
            )
            .await?;
        if held.is_none() {
            fresh.push((r, amount));
        }
    }
    // Every version first: a stale one refuses the whole reservation before any entry is
    // written (a bumped version without an entry only makes other deciders read again).
    for (r, _) in &fresh {
        let k = &r.key;
        tx.conn()
            .execute(
                "create history group",
                "INSERT INTO history_groups (query_key, scope_key, group_key) \
                 VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                args![&k.query_key, &k.scope_key, &k.group_key],
            )
            .await?;
        let bumped = tx
            .conn()
            .execute(
                "claim history group",
                "UPDATE history_groups SET version = version + 1 WHERE query_key = $1 \
                 AND scope_key = $2 AND group_key = $3 AND version = $4",
                args![&k.query_key, &k.scope_key, &k.group_key, r.expected_version],
            )
            .await?;
        if bumped != 1 {
            return Ok(false);
        }
    }
    for (r, amount) in fresh {
        let k = &r.key;
        tx.conn()
            .execute(
                "reserve history entry",
                "INSERT INTO history_entries (call_id, query_key, scope_key, group_key, \
                 session_id, amount, result_path, state, at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'reserved', $8)",
                args![
                    call_id,
                    &k.query_key,
                    &k.scope_key,
                    &k.group_key,
                    session_id,
                    amount,
                    r.result_path.clone(),
                    at
                ],
            )
            .await?;
        tx.conn()
            .execute(
                "count history reservation",
                "UPDATE history_groups SET reserved_count = reserved_count + 1, \
                 reserved_sum = reserved_sum + $4 WHERE query_key = $1 AND scope_key = $2 \
                 AND group_key = $3",
                args![
                    &k.query_key,
                    &k.scope_key,
                    &k.group_key,
                    amount.unwrap_or(0)
                ],
            )
            .await?;
    }
    Ok(true)
}

fn result_number(result: Option<&Value>, path: &str) -> Option<f64> {
    let mut v = result?;
    for seg in path.split('.') {
        v = match v {
            Value::Object(m) => m.get(seg)?,
            Value::Array(items) => items.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
}

/// Settles the reserved entries of `call_id` with its outcome: `Some(result)` for a success
/// (commit, amounts from the result where the query reads it), `None` for a failure, denial or
/// cancellation (release). Entries already settled are left alone, so applying an outcome event
/// again changes nothing.
pub(crate) async fn settle(
    conn: &mut Conn<'_>,
    call_id: &str,
    success: Option<Option<&Value>>,
) -> Result<()> {
    let rows = conn
        .fetch_all(
            "read history reservations",
            "SELECT query_key, scope_key, group_key, amount, result_path FROM history_entries \
             WHERE call_id = $1 AND state = 'reserved'",
            args![call_id],
        )
        .await?;
    for row in rows {
        let (query_key, scope_key, group_key) = (
            row.text("query_key")?,
            row.text("scope_key")?,
            row.text("group_key")?,
        );
        let reserved = row.opt_int("amount")?;
        match success {
            Some(result) => {
                let amount = match row.opt_text("result_path")? {
                    Some(path) => result_number(result, &path).and_then(to_micros),
                    None => reserved,
                };
                conn.execute(
                    "commit history entry",
                    "UPDATE history_entries SET state = 'committed', amount = $3 \
                     WHERE call_id = $1 AND query_key = $2",
                    args![call_id, &query_key, amount],
                )
                .await?;
                conn.execute(
                    "count history commit",
                    "UPDATE history_groups SET version = version + 1, \
                     reserved_count = reserved_count - 1, reserved_sum = reserved_sum - $4, \
                     committed_count = committed_count + 1, committed_sum = committed_sum + $5 \
                     WHERE query_key = $1 AND scope_key = $2 AND group_key = $3",
                    args![
                        &query_key,
                        &scope_key,
                        &group_key,
                        reserved.unwrap_or(0),
                        amount.unwrap_or(0)
                    ],
                )
                .await?;
            }
            None => {
                conn.execute(
                    "release history entry",
                    "DELETE FROM history_entries WHERE call_id = $1 AND query_key = $2",
                    args![call_id, &query_key],
                )
                .await?;
                conn.execute(
                    "count history release",
                    "UPDATE history_groups SET version = version + 1, \
                     reserved_count = reserved_count - 1, reserved_sum = reserved_sum - $4 \
                     WHERE query_key = $1 AND scope_key = $2 AND group_key = $3",
                    args![&query_key, &scope_key, &group_key, reserved.unwrap_or(0)],
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// Validates the reads (or reservations) of one call.
pub(crate) fn check_keys<'k>(
    call_id: &str,
    keys: impl ExactSizeIterator<Item = &'k HistoryKey>,
) -> Result<()> {
    if call_id.trim().is_empty() {
        return Err(LedgerError::invalid("call_id is required"));
    }
    if keys.len() > MAX_HISTORY_READS {
        return Err(LedgerError::invalid(format!(
            "at most {MAX_HISTORY_READS} history queries per call, not {}",
            keys.len()
        )));
    }
    for k in keys {
        if k.query_key.is_empty() || k.scope_key.is_empty() {
            return Err(LedgerError::invalid(
                "a history key needs a query key and a scope key",
            ));
        }
    }
    Ok(())
}
