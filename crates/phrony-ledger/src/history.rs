//! The indexed state of history-aware policy conditions (migrations 0014 and 0016).
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
//! Windows (`within`) are answered from time buckets (migration 0016): per group and per width
//! (second, minute, hour, day, aligned on the epoch) a `history_buckets` row counts the entries
//! decided in it, moved in the same transactions as the entries. A window `[since, ∞)` sums at
//! most 59 second, 59 minute and 23 hour buckets and the day buckets after them (367 for the
//! longest window), and reads the entries of the one partial second at its start: exact to the microsecond, and its cost does not grow with the
//! entries in scope. Entries and buckets no window can see any more are pruned in bounded
//! batches ([`crate::Ledger::prune_history`]); reserved entries never are.
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
    /// microsecond; `None`: all time. A group reserved with a window answers from its time
    /// buckets; without, from its entries.
    pub since: Option<DateTime<Utc>>,
    /// Also read the largest amount ([`HistoryCounts::max`]; a `max` aggregate).
    pub max: bool,
    /// Also read the latest committed amount ([`HistoryCounts::last`]; a `last` aggregate).
    pub last: bool,
}

/// The answer to one [`HistoryRead`], without the asking call's own entries.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HistoryCounts {
    /// Entries reserved or committed.
    pub count: u64,
    /// Sum of their amounts.
    pub sum: f64,
    /// Largest amount (read only when [`HistoryRead::max`] asks).
    pub max: Option<f64>,
    /// Entries committed.
    pub committed: u64,
    /// Amount of the latest committed entry that has one (read only when
    /// [`HistoryRead::last`] asks).
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
    /// The query's window in seconds (`within`), if it has one: the entry is counted in the
    /// group's time buckets, and it and they are pruned once no window can see them.
    pub window_secs: Option<u64>,
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

/// The bucket widths of a windowed group, in seconds: second, minute, hour, day (aligned on the
/// epoch).
pub(crate) const BUCKET_WIDTHS: [i64; 4] = [1, 60, 3_600, 86_400];

/// How long after a row's `visible_until` it is kept before [`prune`] may delete it: a margin
/// for deciders whose clocks run behind the ledger's.
pub const HISTORY_PRUNE_MARGIN_SECS: i64 = 3_600;

/// The start (Unix seconds) of the bucket of `width` seconds holding `at`.
fn bucket_start(at: DateTime<Utc>, width: i64) -> i64 {
    at.timestamp().div_euclid(width) * width
}

/// The first multiple of `width` seconds at or after `t` (Unix microseconds), in seconds.
fn ceil_secs(t_micros: i64, width: i64) -> i64 {
    let w = width * 1_000_000;
    t_micros.div_euclid(w) * width
        + if t_micros.rem_euclid(w) == 0 {
            0
        } else {
            width
        }
}

fn at_secs(secs: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp(secs, 0)
        .ok_or_else(|| LedgerError::invalid(format!("history time {secs}s is out of range")))
}

/// `at` plus `secs`, or an `InvalidArgument` naming the window.
fn plus_secs(at: DateTime<Utc>, secs: i64) -> Result<DateTime<Utc>> {
    chrono::Duration::try_seconds(secs)
        .and_then(|d| at.checked_add_signed(d))
        .ok_or_else(|| LedgerError::invalid(format!("history window of {secs}s is out of range")))
}

/// The asking call's own entry in a group, read with the group row.
#[derive(Debug, Clone, Copy)]
struct Own {
    amount: i64,
    committed: i64,
    at: DateTime<Utc>,
    bucketed: bool,
}

const GROUP_SQL: &str = "SELECT g.version, g.reserved_count, g.reserved_sum, g.committed_count, \
    g.committed_sum, g.bucketed_since, e.state AS own_state, e.amount AS own_amount, \
    e.at AS own_at, e.visible_until AS own_until FROM history_groups g \
    LEFT JOIN history_entries e ON e.call_id = $4 AND e.query_key = g.query_key \
    AND e.scope_key = g.scope_key AND e.group_key = g.group_key \
    WHERE g.query_key = $1 AND g.scope_key = $2 AND g.group_key = $3";

/// A window from the buckets: whole second buckets from the first second boundary at or after
/// `since` (`s0`) to the next minute boundary (`m0`), whole minute buckets from there to the
/// next hour boundary (`h0`), whole hour buckets to the next day boundary (`d0`), whole day
/// buckets after it, and the entries of the partial second `[since, s0)` (exact).
const BUCKETED_WINDOW_SQL: &str = "SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) AS n, \
    CAST(COALESCE(SUM(total), 0) AS BIGINT) AS total, \
    CAST(COALESCE(SUM(done), 0) AS BIGINT) AS done FROM ( \
    SELECT n, total, done FROM history_buckets WHERE query_key = $1 AND scope_key = $2 \
    AND group_key = $3 AND width = 1 AND start >= $4 AND start < $5 \
    UNION ALL SELECT n, total, done FROM history_buckets WHERE query_key = $1 \
    AND scope_key = $2 AND group_key = $3 AND width = 60 AND start >= $5 AND start < $6 \
    UNION ALL SELECT n, total, done FROM history_buckets WHERE query_key = $1 \
    AND scope_key = $2 AND group_key = $3 AND width = 3600 AND start >= $6 AND start < $7 \
    UNION ALL SELECT n, total, done FROM history_buckets WHERE query_key = $1 \
    AND scope_key = $2 AND group_key = $3 AND width = 86400 AND start >= $7 \
    UNION ALL SELECT 1 AS n, COALESCE(amount, 0) AS total, \
    CASE WHEN state = 'committed' THEN 1 ELSE 0 END AS done FROM history_entries \
    WHERE query_key = $1 AND scope_key = $2 AND group_key = $3 AND at >= $8 AND at < $9 \
    AND call_id <> $10) AS w";

/// A window from its entries (a group whose buckets start after the window does).
const SCANNED_WINDOW_SQL: &str = "SELECT COUNT(*) AS n, \
    CAST(COALESCE(SUM(amount), 0) AS BIGINT) AS total, \
    CAST(COALESCE(SUM(CASE WHEN state = 'committed' THEN 1 ELSE 0 END), 0) AS BIGINT) AS done \
    FROM history_entries WHERE query_key = $1 AND scope_key = $2 \
    AND group_key = $3 AND at >= $4 AND call_id <> $5";

/// (count, sum in micro-units, committed) of the window `[since, ∞)` of group `k`, without
/// `call_id`'s own entry.
async fn window(
    conn: &mut Conn<'_>,
    k: &HistoryKey,
    call_id: &str,
    since: DateTime<Utc>,
    bucketed_since: Option<DateTime<Utc>>,
    own: Option<Own>,
) -> Result<(i64, i64, i64)> {
    if bucketed_since.is_some_and(|b| since >= b) {
        let s0 = ceil_secs(since.timestamp_micros(), 1);
        let m0 = ceil_secs(s0 * 1_000_000, 60);
        let h0 = ceil_secs(m0 * 1_000_000, 3_600);
        let d0 = ceil_secs(h0 * 1_000_000, 86_400);
        let s0_at = at_secs(s0)?;
        let row = conn
            .fetch_optional(
                "read history window buckets",
                BUCKETED_WINDOW_SQL,
                args![
                    &k.query_key,
                    &k.scope_key,
                    &k.group_key,
                    s0,
                    m0,
                    h0,
                    d0,
                    since,
                    s0_at,
                    call_id
                ],
            )
            .await?
            .ok_or_else(|| LedgerError::corrupt("an aggregate returned no row"))?;
        let (mut n, mut total, mut done) = (row.int("n")?, row.int("total")?, row.int("done")?);
        // The buckets hold the call's own entry when it is at or after `s0`.
        if let Some(own) = own.filter(|o| o.bucketed && o.at >= s0_at) {
            n -= 1;
            total -= own.amount;
            done -= own.committed;
        }
        return Ok((n, total, done));
    }
    let row = conn
        .fetch_optional(
            "read history window",
            SCANNED_WINDOW_SQL,
            args![&k.query_key, &k.scope_key, &k.group_key, since, call_id],
        )
        .await?
        .ok_or_else(|| LedgerError::corrupt("an aggregate returned no row"))?;
    Ok((row.int("n")?, row.int("total")?, row.int("done")?))
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
                GROUP_SQL,
                args![&k.query_key, &k.scope_key, &k.group_key, call_id],
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
        let own = match row.opt_text("own_state")? {
            Some(state) => Some(Own {
                amount: row.opt_int("own_amount")?.unwrap_or(0),
                committed: i64::from(state == "committed"),
                at: row.ts("own_at")?,
                bucketed: row.opt_ts("own_until")?.is_some(),
            }),
            None => None,
        };
        let (n, sum, committed) = match read.since {
            // Unwindowed count and sum come from the counters, minus the call's own entry.
            None => {
                let (own_n, own_sum, own_done) =
                    own.map_or((0, 0, 0), |o| (1, o.amount, o.committed));
                let reserved = row.int("reserved_count")?;
                let done = row.int("committed_count")?;
                (
                    reserved + done - own_n,
                    row.int("reserved_sum")? + row.int("committed_sum")? - own_sum,
                    done - own_done,
                )
            }
            Some(since) => {
                let bucketed_since = row.opt_ts("bucketed_since")?;
                window(conn, k, call_id, since, bucketed_since, own).await?
            }
        };
        counts.count = count(n);
        counts.sum = from_micros(sum);
        counts.committed = count(committed);
        let since = read.since.unwrap_or(DateTime::UNIX_EPOCH);
        if read.max {
            // The amount index from the top: the first entry inside the window answers (older
            // ones are pruned once no window can see them).
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
        }
        if read.last {
            // The time index from the latest: skips only entries still reserved.
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
        }
        out.push(counts);
    }
    Ok(out)
}

/// One reservation, its amount and window validated.
struct Fresh<'r> {
    r: &'r HistoryReservation,
    amount: Option<i64>,
    window: Option<i64>,
}

fn validate<'r>(call_id: &str, r: &'r HistoryReservation) -> Result<Fresh<'r>> {
    let amount = match r.amount {
        None => None,
        Some(x) => Some(to_micros(x).ok_or_else(|| {
            LedgerError::invalid(format!(
                "history amount {x} of call {call_id} is not a finite number below 9e12"
            ))
        })?),
    };
    let window = match r.window_secs {
        None => None,
        Some(w) => Some(i64::try_from(w).ok().filter(|w| *w > 0).ok_or_else(|| {
            LedgerError::invalid(format!("history window of {w}s is out of range"))
        })?),
    };
    Ok(Fresh { r, amount, window })
}

/// Bumps the version of every group of `fresh` if it is still the one its decision read;
/// `false` at the first that changed (a bumped version without an entry only makes other
/// deciders read again).
async fn claim(tx: &mut Tx, fresh: &[Fresh<'_>], at: DateTime<Utc>) -> Result<bool> {
    for f in fresh {
        let k = &f.r.key;
        // A windowed group created now has buckets from the start; one created before
        // migration 0016 has them from this reservation on.
        let (created_since, since_now) = match f.window {
            Some(_) => (Some(DateTime::UNIX_EPOCH), Some(at)),
            None => (None, None),
        };
        tx.conn()
            .execute(
                "create history group",
                "INSERT INTO history_groups (query_key, scope_key, group_key, window_secs, \
                 bucketed_since) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (query_key, scope_key, group_key) DO UPDATE \
                 SET window_secs = excluded.window_secs, \
                 bucketed_since = CASE WHEN excluded.window_secs IS NULL THEN NULL \
                 ELSE COALESCE(history_groups.bucketed_since, $6) END",
                args![
                    &k.query_key,
                    &k.scope_key,
                    &k.group_key,
                    f.window,
                    created_since,
                    since_now
                ],
            )
            .await?;
        let bumped = tx
            .conn()
            .execute(
                "claim history group",
                "UPDATE history_groups SET version = version + 1 WHERE query_key = $1 \
                 AND scope_key = $2 AND group_key = $3 AND version = $4",
                args![
                    &k.query_key,
                    &k.scope_key,
                    &k.group_key,
                    f.r.expected_version
                ],
            )
            .await?;
        if bumped != 1 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Writes the entries of `fresh` for `call_id`, with their groups' counters and buckets.
async fn insert(
    tx: &mut Tx,
    session_id: &str,
    call_id: &str,
    fresh: &[Fresh<'_>],
    at: DateTime<Utc>,
) -> Result<()> {
    for f in fresh {
        let (k, amount) = (&f.r.key, f.amount);
        let visible_until = match f.window {
            Some(w) => Some(plus_secs(at, w)?),
            None => None,
        };
        tx.conn()
            .execute(
                "reserve history entry",
                "INSERT INTO history_entries (call_id, query_key, scope_key, group_key, \
                 session_id, amount, result_path, state, at, visible_until) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'reserved', $8, $9)",
                args![
                    call_id,
                    &k.query_key,
                    &k.scope_key,
                    &k.group_key,
                    session_id,
                    amount,
                    f.r.result_path.clone(),
                    at,
                    visible_until
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
        if let Some(w) = f.window {
            let [sec, m, h, d] = BUCKET_WIDTHS.map(|width| bucket_start(at, width));
            let until = |start: i64, width: i64| plus_secs(at_secs(start)?, width + w);
            tx.conn()
                .execute(
                    "count history buckets",
                    "INSERT INTO history_buckets (query_key, scope_key, group_key, width, start, \
                     n, total, done, visible_until) VALUES \
                     ($1, $2, $3, 1, $4, 1, $8, 0, $9), ($1, $2, $3, 60, $5, 1, $8, 0, $10), \
                     ($1, $2, $3, 3600, $6, 1, $8, 0, $11), ($1, $2, $3, 86400, $7, 1, $8, 0, $12) \
                     ON CONFLICT (query_key, scope_key, group_key, width, start) DO UPDATE \
                     SET n = history_buckets.n + 1, total = history_buckets.total + excluded.total",
                    args![
                        &k.query_key,
                        &k.scope_key,
                        &k.group_key,
                        sec,
                        m,
                        h,
                        d,
                        amount.unwrap_or(0),
                        until(sec, 1)?,
                        until(m, 60)?,
                        until(h, 3_600)?,
                        until(d, 86_400)?
                    ],
                )
                .await?;
        }
    }
    Ok(())
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
        let f = validate(call_id, r)?;
        let held = tx
            .conn()
            .fetch_optional(
                "find history reservation",
                "SELECT state FROM history_entries WHERE call_id = $1 AND query_key = $2",
                args![call_id, &r.key.query_key],
            )
            .await?;
        if held.is_none() {
            fresh.push(f);
        }
    }
    if !claim(tx, &fresh, at).await? {
        return Ok(false);
    }
    insert(tx, session_id, call_id, &fresh, at).await?;
    Ok(true)
}

/// Moves the reservations of `call_id` to `reservations` (arguments an approver edited): if
/// every group is still at its expected version, releases whatever the call holds reserved
/// and writes the new entries, in one transaction; `false` (nothing changed) when a group
/// changed since the decision read it.
pub(crate) async fn replace(
    tx: &mut Tx,
    session_id: &str,
    call_id: &str,
    reservations: &[HistoryReservation],
) -> Result<bool> {
    let at = tx.now();
    let fresh = reservations
        .iter()
        .map(|r| validate(call_id, r))
        .collect::<Result<Vec<_>>>()?;
    if !claim(tx, &fresh, at).await? {
        return Ok(false);
    }
    settle(&mut tx.conn(), call_id, None).await?;
    insert(tx, session_id, call_id, &fresh, at).await?;
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

/// Moves the buckets of one entry decided at `at` by (`dn`, `dtotal`, `ddone`). A bucket
/// already pruned (no window sees it) is left absent.
async fn move_buckets(
    conn: &mut Conn<'_>,
    key: (&str, &str, &str),
    at: DateTime<Utc>,
    (dn, dtotal, ddone): (i64, i64, i64),
) -> Result<()> {
    for width in BUCKET_WIDTHS {
        conn.execute(
            "settle history bucket",
            "UPDATE history_buckets SET n = n + $6, total = total + $7, done = done + $8 \
             WHERE query_key = $1 AND scope_key = $2 AND group_key = $3 AND width = $4 \
             AND start = $5",
            args![
                key.0,
                key.1,
                key.2,
                width,
                bucket_start(at, width),
                dn,
                dtotal,
                ddone
            ],
        )
        .await?;
    }
    Ok(())
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
            "SELECT query_key, scope_key, group_key, amount, result_path, at, visible_until \
             FROM history_entries WHERE call_id = $1 AND state = 'reserved'",
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
        // Entries written with a window are counted in its buckets.
        let bucketed = match row.opt_ts("visible_until")? {
            Some(_) => Some(row.ts("at")?),
            None => None,
        };
        let key = (query_key.as_str(), scope_key.as_str(), group_key.as_str());
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
                if let Some(at) = bucketed {
                    let delta = amount.unwrap_or(0) - reserved.unwrap_or(0);
                    move_buckets(conn, key, at, (0, delta, 1)).await?;
                }
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
                if let Some(at) = bucketed {
                    move_buckets(conn, key, at, (-1, -reserved.unwrap_or(0), 0)).await?;
                }
            }
        }
    }
    Ok(())
}

/// What one [`crate::Ledger::prune_history`] batch deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistoryPruned {
    /// Committed entries no window can see any more.
    pub entries: u64,
    /// Buckets no window can see any more.
    pub buckets: u64,
}

/// Deletes at most `limit` committed entries and `limit` buckets whose `visible_until` is
/// more than [`HISTORY_PRUNE_MARGIN_SECS`] ago. Reserved entries are never deleted: their outcome still moves their
/// group's counters (their buckets, once invisible, may go: a settle finds none to move).
pub(crate) async fn prune(tx: &mut Tx, limit: i64) -> Result<HistoryPruned> {
    let before = plus_secs(tx.now(), -HISTORY_PRUNE_MARGIN_SECS)?;
    let entries = tx
        .conn()
        .execute(
            "prune history entries",
            "DELETE FROM history_entries WHERE (call_id, query_key) IN (\
             SELECT call_id, query_key FROM history_entries WHERE visible_until < $1 \
             AND state = 'committed' ORDER BY visible_until LIMIT $2)",
            args![before, limit],
        )
        .await?;
    let buckets = tx
        .conn()
        .execute(
            "prune history buckets",
            "DELETE FROM history_buckets WHERE (query_key, scope_key, group_key, width, start) \
             IN (SELECT query_key, scope_key, group_key, width, start FROM history_buckets \
             WHERE visible_until < $1 ORDER BY visible_until LIMIT $2)",
            args![before, limit],
        )
        .await?;
    Ok(HistoryPruned { entries, buckets })
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
