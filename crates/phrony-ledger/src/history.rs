//! The indexed state of history-aware policy conditions (migrations 0014, 0016 and 0018).
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
//! longest window), and reads the entries of the one partial second at its start: exact to the
//! microsecond, and its cost does not grow with the entries in scope. Each bucket also keeps
//! its largest amount (`top`, migration 0018), so a windowed `max` reads the same rows. All the
//! queries of one call are read in one statement ([`facts`]). Entries and buckets no window can
//! see any more are pruned in bounded batches ([`crate::Ledger::prune_history`], with the
//! unbucketed entries of windowed groups from before migration 0016); reserved entries never
//! are.
//!
//! Amounts are stored in micro-units (`round(x × 10⁶)`, |x| below 9·10¹²), so sums are exact.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::db::{Arg, Conn, Row, Tx, args};
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
    amount: Option<i64>,
    committed: i64,
    at: DateTime<Utc>,
    bucketed: bool,
}

/// The latest committed amount at or after `$since` (the time index from the latest: skips only
/// entries still reserved), without the call `$call`.
macro_rules! last_sql {
    ($since:literal, $call:literal) => {
        concat!(
            "SELECT amount FROM history_entries WHERE query_key = $1 AND scope_key = $2 \
             AND group_key = $3 AND at >= ",
            $since,
            " AND call_id <> ",
            $call,
            " AND state = 'committed' AND amount IS NOT NULL ORDER BY at DESC, call_id DESC \
             LIMIT 1"
        )
    };
}

/// The asking call's own entry in the group (`own_*`; `own_state` is `NULL` when it has none):
/// joined by the call id, the one index whose first column it is being the primary key
/// `(call_id, query_key)` — the query key compared as `e.query_key || ''` so that no index
/// leading with the query key can serve the join — and its scope and group compared here. With
/// the group's columns in the join, PostgreSQL read the own entry through
/// `history_entries_by_amount` and filtered the whole group by call id, on tables not yet
/// analyzed (a database just filled): 2–7 ms for 10,000 entries instead of 0.03 ms
/// (`conformance::*::history_reads_do_not_scan_the_group_for_the_calls_own_entry`). A call
/// has at most one entry per query (at most [`crate::MAX_HISTORY_READS`]); an edit may have
/// moved it to another group, which is then not this one.
macro_rules! own_columns {
    () => {
        "CASE WHEN e.scope_key = g.scope_key AND e.group_key = g.group_key THEN e.state END \
         AS own_state, e.amount AS own_amount, e.at AS own_at, e.visible_until AS own_until"
    };
}

/// An unwindowed read (7 placeholders): the group row, the call's own entry, and, only when
/// their flags (`$5`, `$6`) ask, the largest amount (the amount index from the top) and the
/// latest committed one. The same columns as [`WINDOWED_SQL`], so that one statement reads
/// every query of a call ([`batch_sql`]).
const UNWINDOWED_SQL: &str = concat!(
    "SELECT g.version, g.reserved_count, g.reserved_sum, g.committed_count, \
     g.committed_sum, g.bucketed_since, ",
    own_columns!(),
    ", CAST(NULL AS BIGINT) AS n, \
     CAST(NULL AS BIGINT) AS total, CAST(NULL AS BIGINT) AS done, \
     CASE WHEN $5 THEN (SELECT MAX(amount) FROM history_entries WHERE query_key = $1 \
     AND scope_key = $2 AND group_key = $3 AND call_id <> $4 AND amount IS NOT NULL) END AS top, \
     CASE WHEN $6 THEN (",
    last_sql!("$7", "$4"),
    ") END AS last FROM history_groups g \
     LEFT JOIN history_entries e ON e.call_id = $4 AND e.query_key || '' = g.query_key \
     WHERE g.query_key = $1 AND g.scope_key = $2 AND g.group_key = $3"
);

/// A windowed read (11 placeholders): the group row, the call's own entry, and the window
/// `[since, ∞)` from the buckets: whole second buckets from the first second boundary at or
/// after `since` (`s0`, `$5`) to the next minute boundary (`m0`, `$6`), whole minute buckets
/// from there to the next hour boundary (`h0`, `$7`), whole hour buckets to the next day
/// boundary (`d0`, `$8`), whole day buckets after it, and the entries of the partial second
/// `[since, s0)` (`$9`, `$10`): count, sum, committed count and largest amount (each bucket's
/// `top`, migration 0018); the latest committed amount only when `$11` asks. The bucket sums
/// are only valid when the group's buckets cover the window (`bucketed_since` ≤ `since`): the
/// caller reads the entries otherwise.
const WINDOWED_SQL: &str = concat!(
    "SELECT g.version, g.reserved_count, g.reserved_sum, g.committed_count, \
     g.committed_sum, g.bucketed_since, ",
    own_columns!(),
    ", w.n, w.total, w.done, w.top, \
     CASE WHEN $11 THEN (",
    last_sql!("$9", "$4"),
    ") END AS last FROM history_groups g \
     LEFT JOIN history_entries e ON e.call_id = $4 AND e.query_key || '' = g.query_key \
     CROSS JOIN (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) AS n, \
     CAST(COALESCE(SUM(total), 0) AS BIGINT) AS total, \
     CAST(COALESCE(SUM(done), 0) AS BIGINT) AS done, MAX(top) AS top FROM ( \
     SELECT n, total, done, top FROM history_buckets WHERE query_key = $1 AND scope_key = $2 \
     AND group_key = $3 AND width = 1 AND start >= $5 AND start < $6 \
     UNION ALL SELECT n, total, done, top FROM history_buckets WHERE query_key = $1 \
     AND scope_key = $2 AND group_key = $3 AND width = 60 AND start >= $6 AND start < $7 \
     UNION ALL SELECT n, total, done, top FROM history_buckets WHERE query_key = $1 \
     AND scope_key = $2 AND group_key = $3 AND width = 3600 AND start >= $7 AND start < $8 \
     UNION ALL SELECT n, total, done, top FROM history_buckets WHERE query_key = $1 \
     AND scope_key = $2 AND group_key = $3 AND width = 86400 AND start >= $8 \
     UNION ALL SELECT 1 AS n, COALESCE(amount, 0) AS total, \
     CASE WHEN state = 'committed' THEN 1 ELSE 0 END AS done, amount AS top \
     FROM history_entries WHERE query_key = $1 AND scope_key = $2 AND group_key = $3 \
     AND at >= $9 AND at < $10 AND call_id <> $4) AS u) AS w \
     WHERE g.query_key = $1 AND g.scope_key = $2 AND g.group_key = $3"
);

/// A window from its entries (a group whose buckets start after the window does).
const SCANNED_WINDOW_SQL: &str = "SELECT COUNT(*) AS n, \
    CAST(COALESCE(SUM(amount), 0) AS BIGINT) AS total, \
    CAST(COALESCE(SUM(CASE WHEN state = 'committed' THEN 1 ELSE 0 END), 0) AS BIGINT) AS done \
    FROM history_entries WHERE query_key = $1 AND scope_key = $2 \
    AND group_key = $3 AND at >= $4 AND call_id <> $5";

/// The largest amount at or after `since` from the entries (the amount index from the top:
/// the first entry inside the window answers).
const WALKED_MAX_SQL: &str = "SELECT MAX(amount) AS top FROM history_entries WHERE query_key = $1 \
    AND scope_key = $2 AND group_key = $3 AND at >= $4 AND call_id <> $5 \
    AND amount IS NOT NULL";

/// The bucket boundaries of a window starting at `since`: `s0`, `m0`, `h0`, `d0` (Unix
/// seconds), see [`WINDOWED_SQL`].
fn boundaries(since: DateTime<Utc>) -> [i64; 4] {
    let s0 = ceil_secs(since.timestamp_micros(), 1);
    let m0 = ceil_secs(s0 * 1_000_000, 60);
    let h0 = ceil_secs(m0 * 1_000_000, 3_600);
    let d0 = ceil_secs(h0 * 1_000_000, 86_400);
    [s0, m0, h0, d0]
}

fn own_entry(row: &Row) -> Result<Option<Own>> {
    Ok(match row.opt_text("own_state")? {
        Some(state) => Some(Own {
            amount: row.opt_int("own_amount")?,
            committed: i64::from(state == "committed"),
            at: row.ts("own_at")?,
            bucketed: row.opt_ts("own_until")?.is_some(),
        }),
        None => None,
    })
}

/// `sql` with its placeholders `$n` shifted by `by`.
fn shift_placeholders(sql: &str, by: usize, out: &mut String) {
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        match rest[..digits].parse::<usize>() {
            Ok(n) => out.push_str(&(n + by).to_string()),
            Err(_) => out.push_str(&rest[..digits]),
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
}

/// One statement reading every query of `reads` (one round trip; the same text for the same
/// kinds of reads, so each connection prepares it once): per read its unwindowed or windowed
/// `SELECT`, placeholders shifted past the earlier reads', tagged with the read's index `i`,
/// joined by `UNION ALL`. A read whose group has no row yet has no row.
fn batch_sql(reads: &[HistoryRead]) -> String {
    let mut sql = String::with_capacity(reads.len() * WINDOWED_SQL.len());
    let mut shift = 0;
    for (i, read) in reads.iter().enumerate() {
        if i > 0 {
            sql.push_str(" UNION ALL ");
        }
        let (one, placeholders) = match read.since {
            None => (UNWINDOWED_SQL, 7),
            Some(_) => (WINDOWED_SQL, 11),
        };
        let columns = one.strip_prefix("SELECT ").unwrap_or(one);
        sql.push_str("SELECT CAST(");
        sql.push_str(&i.to_string());
        sql.push_str(" AS BIGINT) AS i, ");
        shift_placeholders(columns, shift, &mut sql);
        shift += placeholders;
    }
    sql
}

/// The bind values of `read` for its `SELECT` in [`batch_sql`].
fn bind_read(call_id: &str, read: &HistoryRead, args: &mut Vec<Arg>) -> Result<()> {
    let k = &read.key;
    match read.since {
        None => args.extend(args![
            &k.query_key,
            &k.scope_key,
            &k.group_key,
            call_id,
            read.max,
            read.last,
            DateTime::UNIX_EPOCH
        ]),
        Some(since) => {
            let [s0, m0, h0, d0] = boundaries(since);
            args.extend(args![
                &k.query_key,
                &k.scope_key,
                &k.group_key,
                call_id,
                s0,
                m0,
                h0,
                d0,
                since,
                at_secs(s0)?,
                read.last
            ]);
        }
    }
    Ok(())
}

/// The bind values of every read of [`batch_sql`], in order.
fn bind_reads(call_id: &str, reads: &[HistoryRead]) -> Result<Vec<Arg>> {
    let mut binds = Vec::with_capacity(reads.len() * 11);
    for read in reads {
        bind_read(call_id, read, &mut binds)?;
    }
    Ok(binds)
}

/// The answer to `read` from its row of [`batch_sql`] (`None`: no group row yet); a second
/// statement only for a window its group's buckets do not cover (a group from before
/// migration 0016) or a `max` whose buckets hold the call's own amount (a call decided again).
async fn answer(
    conn: &mut Conn<'_>,
    call_id: &str,
    read: &HistoryRead,
    row: Option<&Row>,
) -> Result<HistoryCounts> {
    let k = &read.key;
    let Some(row) = row else {
        return Ok(HistoryCounts::default());
    };
    let own = own_entry(row)?;
    let mut max = if read.max { row.opt_int("top")? } else { None };
    let last = if read.last {
        row.opt_int("last")?
    } else {
        None
    };
    let (n, sum, committed) = match read.since {
        // Unwindowed count and sum come from the counters, minus the call's own entry.
        None => {
            let (own_n, own_sum, own_done) =
                own.map_or((0, 0, 0), |o| (1, o.amount.unwrap_or(0), o.committed));
            let reserved = row.int("reserved_count")?;
            let done = row.int("committed_count")?;
            (
                reserved + done - own_n,
                row.int("reserved_sum")? + row.int("committed_sum")? - own_sum,
                done - own_done,
            )
        }
        Some(since) if row.opt_ts("bucketed_since")?.is_some_and(|b| since >= b) => {
            let s0_at = at_secs(boundaries(since)[0])?;
            let (mut n, mut total, mut done) = (row.int("n")?, row.int("total")?, row.int("done")?);
            // The buckets hold the call's own entry when it is at or after `s0`.
            if let Some(own) = own.filter(|o| o.bucketed && o.at >= s0_at) {
                n -= 1;
                total -= own.amount.unwrap_or(0);
                done -= own.committed;
                if read.max && own.amount.is_some() {
                    max = walked_max(conn, k, call_id, since).await?;
                }
            }
            (n, total, done)
        }
        Some(since) => {
            if read.max {
                max = walked_max(conn, k, call_id, since).await?;
            }
            let row = conn
                .fetch_optional(
                    "read history window entries",
                    SCANNED_WINDOW_SQL,
                    args![&k.query_key, &k.scope_key, &k.group_key, since, call_id],
                )
                .await?
                .ok_or_else(|| LedgerError::corrupt("an aggregate returned no row"))?;
            (row.int("n")?, row.int("total")?, row.int("done")?)
        }
    };
    Ok(HistoryCounts {
        count: count(n),
        sum: from_micros(sum),
        max: max.map(from_micros),
        committed: count(committed),
        last: last.map(from_micros),
        version: row.int("version")?,
    })
}

/// The largest amount at or after `since` from the entries, without `call_id`'s.
async fn walked_max(
    conn: &mut Conn<'_>,
    k: &HistoryKey,
    call_id: &str,
    since: DateTime<Utc>,
) -> Result<Option<i64>> {
    let row = conn
        .fetch_optional(
            "read history max",
            WALKED_MAX_SQL,
            args![&k.query_key, &k.scope_key, &k.group_key, since, call_id],
        )
        .await?;
    match row {
        Some(r) => r.opt_int("top"),
        None => Ok(None),
    }
}

/// Reads the aggregates of `reads` for `call_id`, leaving its own entries out: one statement
/// for all of them ([`batch_sql`]).
pub(crate) async fn facts(
    conn: &mut Conn<'_>,
    call_id: &str,
    reads: &[HistoryRead],
) -> Result<Vec<HistoryCounts>> {
    if reads.is_empty() {
        return Ok(Vec::new());
    }
    let binds = bind_reads(call_id, reads)?;
    let rows = conn
        .fetch_all("read history facts", &batch_sql(reads), binds)
        .await?;
    let mut by_read: Vec<Option<Row>> = (0..reads.len()).map(|_| None).collect();
    for row in rows {
        let i = usize::try_from(row.int("i")?)
            .ok()
            .filter(|i| *i < reads.len())
            .ok_or_else(|| LedgerError::corrupt("a history read returned an unknown index"))?;
        by_read[i] = Some(row);
    }
    let mut out = Vec::with_capacity(reads.len());
    for (read, row) in reads.iter().zip(&by_read) {
        out.push(answer(conn, call_id, read, row.as_ref()).await?);
    }
    Ok(out)
}

/// The plan of the statement [`facts`] runs for `reads` (one line per plan node): executed
/// and timed on PostgreSQL (`EXPLAIN ANALYZE`: actual rows, rows removed by filters), the
/// query plan on SQLite. For tests that bound the rows a decision's lookup reads.
pub(crate) async fn explain(
    conn: &mut Conn<'_>,
    backend: crate::db::Backend,
    call_id: &str,
    reads: &[HistoryRead],
) -> Result<Vec<String>> {
    if reads.is_empty() {
        return Ok(Vec::new());
    }
    let binds = bind_reads(call_id, reads)?;
    let (prefix, column) = match backend {
        crate::db::Backend::Postgres => ("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) ", "QUERY PLAN"),
        crate::db::Backend::Sqlite => ("EXPLAIN QUERY PLAN ", "detail"),
    };
    let sql = format!("{prefix}{}", batch_sql(reads));
    conn.fetch_all("explain history facts", &sql, binds)
        .await?
        .iter()
        .map(|row| row.text(column))
        .collect()
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
                     n, total, done, visible_until, top) VALUES \
                     ($1, $2, $3, 1, $4, 1, $8, 0, $9, $13), \
                     ($1, $2, $3, 60, $5, 1, $8, 0, $10, $13), \
                     ($1, $2, $3, 3600, $6, 1, $8, 0, $11, $13), \
                     ($1, $2, $3, 86400, $7, 1, $8, 0, $12, $13) \
                     ON CONFLICT (query_key, scope_key, group_key, width, start) DO UPDATE \
                     SET n = history_buckets.n + 1, total = history_buckets.total + excluded.total, \
                     top = CASE WHEN history_buckets.top IS NULL OR excluded.top > history_buckets.top \
                     THEN excluded.top ELSE history_buckets.top END",
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
                        until(d, 86_400)?,
                        amount
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

/// Recomputes the largest amount (`top`) of the buckets holding an entry decided at `at`,
/// after its amount fell or it was released: the second bucket's from its entries, each wider
/// one's from the buckets one width narrower inside it (a bounded number of rows: the entries
/// of one second, then at most 60, 60 and 24 buckets). A narrower bucket already pruned is one
/// no window sees, and neither does any window see the wider bucket's part it covered.
async fn retop_buckets(
    conn: &mut Conn<'_>,
    key: (&str, &str, &str),
    at: DateTime<Utc>,
) -> Result<()> {
    let second = bucket_start(at, 1);
    conn.execute(
        "recompute history second top",
        "UPDATE history_buckets SET top = (SELECT MAX(amount) FROM history_entries \
         WHERE query_key = $1 AND scope_key = $2 AND group_key = $3 AND at >= $5 AND at < $6 \
         AND visible_until IS NOT NULL) WHERE query_key = $1 AND scope_key = $2 \
         AND group_key = $3 AND width = 1 AND start = $4",
        args![
            key.0,
            key.1,
            key.2,
            second,
            at_secs(second)?,
            at_secs(second + 1)?
        ],
    )
    .await?;
    for pair in BUCKET_WIDTHS.windows(2) {
        let (narrow, wide) = (pair[0], pair[1]);
        let start = bucket_start(at, wide);
        conn.execute(
            "recompute history bucket top",
            "UPDATE history_buckets SET top = (SELECT MAX(c.top) FROM history_buckets c \
             WHERE c.query_key = $1 AND c.scope_key = $2 AND c.group_key = $3 \
             AND c.width = $4 AND c.start >= $6 AND c.start < $7) \
             WHERE query_key = $1 AND scope_key = $2 AND group_key = $3 AND width = $5 \
             AND start = $6",
            args![key.0, key.1, key.2, narrow, wide, start, start + wide],
        )
        .await?;
    }
    Ok(())
}

/// Moves the buckets of one entry decided at `at` by (`dn`, `dtotal`, `ddone`), and raises
/// their largest amount to `raise`. A bucket already pruned (no window sees it) is left absent.
async fn move_buckets(
    conn: &mut Conn<'_>,
    key: (&str, &str, &str),
    at: DateTime<Utc>,
    (dn, dtotal, ddone): (i64, i64, i64),
    raise: Option<i64>,
) -> Result<()> {
    for width in BUCKET_WIDTHS {
        conn.execute(
            "settle history bucket",
            "UPDATE history_buckets SET n = n + $6, total = total + $7, done = done + $8, \
             top = CASE WHEN top IS NULL OR $9 > top THEN $9 ELSE top END \
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
                ddone,
                raise
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
                    move_buckets(conn, key, at, (0, delta, 1), amount).await?;
                    // A reserved amount the result lowered (or removed) may have been a top.
                    if reserved.is_some_and(|r| amount.is_none_or(|a| a < r)) {
                        retop_buckets(conn, key, at).await?;
                    }
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
                    move_buckets(conn, key, at, (-1, -reserved.unwrap_or(0), 0), None).await?;
                    if reserved.is_some() {
                        retop_buckets(conn, key, at).await?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// What one [`crate::Ledger::prune_history`] batch deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistoryPruned {
    /// Committed entries no window can see any more (with those written before migration
    /// 0016, see [`HistoryPruned::legacy_groups`]).
    pub entries: u64,
    /// Buckets no window can see any more.
    pub buckets: u64,
    /// Windowed groups from before migration 0016 whose unbucketed entries no window can see
    /// any more, and whose committed ones are now all deleted: from then on every window of
    /// theirs is answered from buckets (`bucketed_since` is the epoch).
    pub legacy_groups: u64,
    /// Windowed groups from before migration 0016 not reserved since (no `window_secs`), whose
    /// window this batch read from their query key and recorded, with `bucketed_since` just
    /// after their last entry: from then on their entries are pruned like those of
    /// [`HistoryPruned::legacy_groups`], once that window has passed.
    pub legacy_windows: u64,
}

impl HistoryPruned {
    /// Whether the batch did nothing: no batch after it would either, until time passes or
    /// calls settle.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Deletes at most `limit` committed entries (with those from before migration 0016,
/// [`prune_legacy`]) and `limit` buckets whose `visible_until` is more than
/// [`HISTORY_PRUNE_MARGIN_SECS`] ago. Reserved entries are never deleted: their outcome still moves their
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
    let legacy_windows = adopt_legacy_windows(tx, limit).await?;
    // The entries' budget left for those from before migration 0016.
    let left = limit - i64::try_from(entries).unwrap_or(limit);
    let (legacy_entries, legacy_groups) = if left > 0 {
        prune_legacy(tx, before, left).await?
    } else {
        (0, 0)
    };
    Ok(HistoryPruned {
        entries: entries + legacy_entries,
        buckets,
        legacy_groups,
        legacy_windows,
    })
}

/// The window of a history query from its key, `calls|in|same|within|aggregate|of` (the
/// policy crate's `HistoryQuery::key`): `None` for an unwindowed query and for any key not of
/// that shape (its entries are then kept).
pub(crate) fn window_of_key(query_key: &str) -> Option<i64> {
    let fields: Vec<&str> = query_key.split('|').collect();
    let [_, scope, _, within, aggregate, _] = fields.as_slice() else {
        return None;
    };
    let known_scope = matches!(*scope, "session" | "agent" | "everyone");
    let known_aggregate = matches!(*aggregate, "count" | "sum" | "max" | "last" | "exists");
    if !known_scope || !known_aggregate || !within.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    within.parse::<i64>().ok().filter(|w| *w > 0)
}

/// The distinct query keys of the history groups, one index probe each (a loose index scan:
/// their number is the number of distinct history queries, not of groups).
const DISTINCT_QUERY_KEYS_SQL: &str = "WITH RECURSIVE k(q) AS (\
     SELECT MIN(query_key) FROM history_groups \
     UNION ALL SELECT (SELECT MIN(query_key) FROM history_groups WHERE query_key > k.q) \
     FROM k WHERE k.q IS NOT NULL) \
     SELECT q FROM k WHERE q IS NOT NULL";

/// A windowed group from before migration 0016 that no reservation has touched since has no
/// `window_secs` and no `bucketed_since`, so [`prune_legacy`] does not know it is windowed and
/// its entries would stay forever. Its window is in its query key ([`window_of_key`]): record
/// it, with `bucketed_since` one microsecond after the group's last entry (every entry before
/// is unbucketed, none after it is), so that [`prune_legacy`] takes its committed entries once
/// that window has passed. At most `limit` groups. Returns how many were recorded.
async fn adopt_legacy_windows(tx: &mut Tx, limit: i64) -> Result<u64> {
    let keys = tx
        .conn()
        .fetch_all("list history query keys", DISTINCT_QUERY_KEYS_SQL, args![])
        .await?;
    let mut adopted = 0;
    for key in keys {
        let query_key = key.text("q")?;
        let Some(window) = window_of_key(&query_key) else {
            continue;
        };
        let budget = limit - i64::try_from(adopted).unwrap_or(i64::MAX);
        if budget <= 0 {
            break;
        }
        let groups = tx
            .conn()
            .fetch_all(
                "find history groups with no known window",
                "SELECT scope_key, group_key FROM history_groups WHERE query_key = $1 \
                 AND window_secs IS NULL AND bucketed_since IS NULL LIMIT $2",
                args![&query_key, budget],
            )
            .await?;
        for g in groups {
            let (scope_key, group_key) = (g.text("scope_key")?, g.text("group_key")?);
            let last = tx
                .conn()
                .fetch_optional(
                    "find the last history entry of a group",
                    "SELECT at FROM history_entries WHERE query_key = $1 AND scope_key = $2 \
                     AND group_key = $3 ORDER BY at DESC LIMIT 1",
                    args![&query_key, &scope_key, &group_key],
                )
                .await?;
            let since = match last {
                Some(row) => row.ts("at")? + chrono::Duration::microseconds(1),
                None => DateTime::UNIX_EPOCH,
            };
            // Only while still unknown: a reservation that got there first recorded both.
            adopted += tx
                .conn()
                .execute(
                    "record the window of a history group",
                    "UPDATE history_groups SET window_secs = $4, bucketed_since = $5 \
                     WHERE query_key = $1 AND scope_key = $2 AND group_key = $3 \
                     AND window_secs IS NULL AND bucketed_since IS NULL",
                    args![&query_key, &scope_key, &group_key, window, since],
                )
                .await?;
        }
    }
    Ok(adopted)
}

/// Entries written before migration 0016 have no `visible_until`. A windowed group from then
/// has `bucketed_since` after the epoch (its first bucketed reservation) and `window_secs`;
/// every entry decided before `bucketed_since` is such an entry, and once
/// `bucketed_since + window_secs` is more than the margin ago, no window sees any of them: its
/// committed ones are deleted (at most `limit` per batch, oldest groups first), and a group
/// with none left (reserved ones are kept until they commit) is marked as bucketed from the
/// epoch, so the next batches skip it. A windowed group from then that has not been reserved
/// since keeps its entries until it is (its window is only known from a reservation).
/// Returns (entries, groups) deleted and marked.
async fn prune_legacy(tx: &mut Tx, before: DateTime<Utc>, limit: i64) -> Result<(u64, u64)> {
    let groups = tx
        .conn()
        .fetch_all(
            "find history groups from before buckets",
            "SELECT query_key, scope_key, group_key, window_secs, bucketed_since \
             FROM history_groups WHERE window_secs IS NOT NULL AND bucketed_since > $1 \
             AND bucketed_since < $2 ORDER BY bucketed_since LIMIT $3",
            args![DateTime::UNIX_EPOCH, before, limit],
        )
        .await?;
    let (mut entries, mut marked) = (0, 0);
    for g in groups {
        let since = g.ts("bucketed_since")?;
        let window = g.int("window_secs")?;
        if plus_secs(since, window)? >= before {
            continue;
        }
        let budget = limit - i64::try_from(entries).unwrap_or(i64::MAX);
        if budget <= 0 {
            break;
        }
        let (q, s, k) = (
            g.text("query_key")?,
            g.text("scope_key")?,
            g.text("group_key")?,
        );
        let deleted = tx
            .conn()
            .execute(
                "prune history entries from before buckets",
                "DELETE FROM history_entries WHERE (call_id, query_key) IN (\
                 SELECT call_id, query_key FROM history_entries WHERE query_key = $1 \
                 AND scope_key = $2 AND group_key = $3 AND at < $4 AND state = 'committed' \
                 AND visible_until IS NULL ORDER BY at LIMIT $5)",
                args![&q, &s, &k, since, budget],
            )
            .await?;
        entries += deleted;
        if i64::try_from(deleted).unwrap_or(i64::MAX) >= budget {
            break;
        }
        // Marked only without one left: one still reserved is pruned once it commits.
        let left = tx
            .conn()
            .fetch_optional(
                "find history entries from before buckets",
                "SELECT call_id FROM history_entries WHERE query_key = $1 AND scope_key = $2 \
                 AND group_key = $3 AND at < $4 AND visible_until IS NULL LIMIT 1",
                args![&q, &s, &k, since],
            )
            .await?;
        if left.is_none() {
            tx.conn()
                .execute(
                    "mark history group bucketed",
                    "UPDATE history_groups SET bucketed_since = $4 WHERE query_key = $1 \
                     AND scope_key = $2 AND group_key = $3",
                    args![&q, &s, &k, DateTime::UNIX_EPOCH],
                )
                .await?;
            marked += 1;
        }
    }
    Ok((entries, marked))
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

#[cfg(test)]
mod tests {
    use super::window_of_key;

    #[test]
    fn the_window_is_read_from_query_keys_of_the_policy_crates_shape_only() {
        assert_eq!(
            window_of_key("issue_refund|everyone|customer_id|86400|count|"),
            Some(86_400)
        );
        assert_eq!(
            window_of_key("payments.issue-refund|session|a,b|60|sum|result.total"),
            Some(60)
        );
        for kept in [
            "issue_refund|everyone|customer_id||sum|amount",
            "issue_refund|everyone|customer_id|0|count|",
            "issue_refund|everyone|customer_id|-5|count|",
            "issue_refund|everyone|customer_id|1h|count|",
            "issue|refund|everyone|customer_id|60|count|",
            "issue_refund|somewhere|customer_id|60|count|",
            "issue_refund|everyone|customer_id|60|median|",
            "issue_refund|everyone|60|count",
            "",
        ] {
            assert_eq!(window_of_key(kept), None, "{kept}");
        }
    }
}
