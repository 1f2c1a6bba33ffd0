//! History lookups (migrations 0014 and 0016): what a history-aware decision reads before the
//! policies run, with 10,000 earlier calls in scope of each group, on SQLite (a temporary file)
//! and PostgreSQL (`PHRONY_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; skipped when unreachable).
//!
//! `cargo bench -p phrony-ledger --bench history`, per backend, each as `before` (the reads
//! before migration 0016: a window counted over its entries, and `max` and `last` read for every
//! query) and `after` (a window from its time buckets; `max`/`last` only for those aggregates),
//! in the same run over the same database:
//! - `unwindowed_sum`: `sum` from the group's counters;
//! - `window_24h_count`: a 24 h count whose 10,000 entries were decided in the last seconds;
//! - `window_24h_count_spread`: a 24 h count whose 10,000 entries are spread over the 24 h (the
//!   buckets read are at their most: 59 second, 59 minute, 23 hour and the day ones);
//! - `refund_policy`: the refund example's three queries (sum per order, last lookup total,
//!   24 h count per customer) in one round trip;
//! - `window_24h_max_spread`: a 24 h `max` over the spread entries, with 1,000 larger amounts
//!   decided in the hour before the window (not yet pruned): `before` walks the amount index
//!   from the top past them, `after` (migration 0018) reads the buckets' largest amounts.
//!
//! - `select_1_round_trip`: the floor, one pooled `SELECT 1` through sqlx on the same database
//!   (on PostgreSQL the loopback round trip every lookup pays).
//!
//! PostgreSQL's tables are analyzed after the fill, as autovacuum would have them a minute
//! later. The policy side (`crates/phrony-policy/benches/history.rs`) adds well under a
//! microsecond.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark setup: a panic aborts the benchmark"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Duration, Utc};
use criterion::{Criterion, criterion_group, criterion_main};
use phrony_ledger::{
    HistoryKey, HistoryRead, HistoryReservation, Ledger, LedgerClock, LedgerOptions,
};
use phrony_test_support::postgres::{CreateError, PgDatabase};

/// Earlier calls in scope of each group under `cargo bench`.
const EARLIER: i64 = 10_000;
/// Under `cargo test` (criterion's test mode: no `--bench` argument) each case runs once as a
/// test of its before/after agreement; a twentieth of the fill keeps that check (the fill of
/// 2 × 10,000 calls on both databases took over four minutes of an unoptimised CI build).
const EARLIER_WHEN_TESTED: i64 = 500;
const DAY_MICROS: i64 = 86_400_000_000;

const SUM_Q: &str = "refund_order|everyone|customer_id||sum|amount";
const COUNT_Q: &str = "refund_order|everyone|customer_id|86400|count|";
const LAST_Q: &str = "lookup_order|everyone|customer_id||last|result.total";
/// The same entries as `COUNT_Q`, reserved without a window: no buckets (as before 0016).
const COUNT_SCANNED_Q: &str = "refund_order|everyone|customer_id|86400|count|scanned";
const MAX_Q: &str = "refund_order|everyone|customer_id|86400|max|amount";
/// The same entries as `MAX_Q`, reserved without a window.
const MAX_SCANNED_Q: &str = "refund_order|everyone|customer_id|86400|max|scanned";

/// The calls in scope of each group in this run: [`EARLIER`] when benchmarking,
/// [`EARLIER_WHEN_TESTED`] when `cargo test` runs the benchmark once.
fn earlier() -> i64 {
    if std::env::args().any(|a| a == "--bench") {
        EARLIER
    } else {
        EARLIER_WHEN_TESTED
    }
}

fn key(query: &str, group: &str) -> HistoryKey {
    HistoryKey {
        query_key: query.to_owned(),
        scope_key: "*".to_owned(),
        group_key: group.to_owned(),
    }
}

fn reservation(query: &str, group: &str, amount: Option<f64>, window: bool) -> HistoryReservation {
    HistoryReservation {
        key: key(query, group),
        amount,
        result_path: None,
        expected_version: 0,
        window_secs: window.then_some(86_400),
    }
}

/// Reserves `reservations` for `call`, at the versions the groups are at.
async fn reserve(ledger: &Ledger, call: &str, mut reservations: Vec<HistoryReservation>) {
    let reads: Vec<HistoryRead> = reservations
        .iter()
        .map(|r| HistoryRead {
            key: r.key.clone(),
            since: None,
            max: false,
            last: false,
        })
        .collect();
    let counts = ledger.history_facts(call, &reads).await.unwrap();
    for (r, c) in reservations.iter_mut().zip(counts) {
        r.expected_version = c.version;
    }
    assert!(
        ledger
            .reserve_history("s", call, &reservations)
            .await
            .unwrap()
    );
}

/// `earlier` calls now on group `C-7` (sum, bucketed and scanned counts), `earlier` spread
/// over the last 24 h on group `C-8` (bucketed and scanned counts), and a tenth as many larger
/// amounts in the hour before that window.
async fn fill(ledger: &Ledger, now: &AtomicI64, start: DateTime<Utc>, earlier: i64) {
    let start = start.timestamp_micros();
    let outside = earlier / 10;
    // Larger amounts in the hour before the window (`max` only), 50 minutes' worth.
    for i in 0..outside {
        now.store(
            start - DAY_MICROS - 3_600_000_000 + i * (3_000_000_000 / outside),
            Ordering::SeqCst,
        );
        #[allow(clippy::cast_precision_loss, reason = "small amounts")]
        let amount = 1_000.0 + i as f64;
        reserve(
            ledger,
            &format!("outside-{i}"),
            vec![
                reservation(MAX_Q, "C-8", Some(amount), true),
                reservation(MAX_SCANNED_Q, "C-8", Some(amount), false),
            ],
        )
        .await;
    }
    // Spread over the 24 h minus the first and last minute or so.
    for i in 0..earlier {
        now.store(
            start - DAY_MICROS + 60_000_000 + i * (86_300_000_000 / earlier),
            Ordering::SeqCst,
        );
        #[allow(clippy::cast_precision_loss, reason = "small amounts")]
        reserve(
            ledger,
            &format!("spread-{i}"),
            vec![
                reservation(COUNT_Q, "C-8", None, true),
                reservation(COUNT_SCANNED_Q, "C-8", None, false),
                reservation(MAX_Q, "C-8", Some(10.0 + (i % 100) as f64), true),
                reservation(MAX_SCANNED_Q, "C-8", Some(10.0 + (i % 100) as f64), false),
            ],
        )
        .await;
    }
    for i in 0..earlier {
        now.store(start + i, Ordering::SeqCst);
        #[allow(clippy::cast_precision_loss, reason = "small amounts")]
        let amount = 10.0 + (i % 100) as f64;
        reserve(
            ledger,
            &format!("call-{i}"),
            vec![
                reservation(SUM_Q, "C-7", Some(amount), false),
                reservation(COUNT_Q, "C-7", None, true),
                reservation(COUNT_SCANNED_Q, "C-7", None, false),
            ],
        )
        .await;
    }
}

fn read(query: &str, group: &str, since: Option<DateTime<Utc>>, before: bool) -> HistoryRead {
    HistoryRead {
        key: key(query, group),
        since,
        max: before,
        last: before || query == LAST_Q,
    }
}

fn bench_backend(c: &mut Criterion, rt: &tokio::runtime::Runtime, backend: &str, url: &str) {
    let earlier = earlier();
    let start = Utc::now();
    let now = Arc::new(AtomicI64::new(start.timestamp_micros()));
    let clock_now = Arc::clone(&now);
    let ledger = rt.block_on(async {
        let ledger = Ledger::connect_with(
            url,
            LedgerOptions {
                clock: LedgerClock::new(move || {
                    DateTime::from_timestamp_micros(clock_now.load(Ordering::SeqCst))
                        .unwrap_or_default()
                }),
                ..LedgerOptions::default()
            },
        )
        .await
        .unwrap();
        ledger.migrate().await.unwrap();
        fill(&ledger, &now, start, earlier).await;
        // The planner's statistics as autovacuum leaves them a minute after such a fill (a
        // database measured right after a bulk fill has none, and PostgreSQL then chooses
        // among the indexes that start with the group arbitrarily; SQLite keeps no statistics
        // unless asked to).
        if backend == "postgres" {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            sqlx::query("ANALYZE").execute(&pool).await.unwrap();
            pool.close().await;
        }
        ledger
    });
    // The decisions are taken a second after the last call, 24 h windows back from then.
    let since = Some(start + Duration::seconds(1) - Duration::hours(24));
    let max_read = |query: &str| HistoryRead {
        max: true,
        last: false,
        ..read(query, "C-8", since, false)
    };
    let cases: [(&str, Vec<HistoryRead>, Vec<HistoryRead>); 5] = [
        (
            "unwindowed_sum",
            vec![read(SUM_Q, "C-7", None, true)],
            vec![read(SUM_Q, "C-7", None, false)],
        ),
        (
            "window_24h_count",
            vec![read(COUNT_SCANNED_Q, "C-7", since, true)],
            vec![read(COUNT_Q, "C-7", since, false)],
        ),
        (
            "window_24h_count_spread",
            vec![read(COUNT_SCANNED_Q, "C-8", since, true)],
            vec![read(COUNT_Q, "C-8", since, false)],
        ),
        (
            "refund_policy",
            vec![
                read(SUM_Q, "C-7", None, true),
                read(LAST_Q, "C-7", None, true),
                read(COUNT_SCANNED_Q, "C-7", since, true),
            ],
            vec![
                read(SUM_Q, "C-7", None, false),
                read(LAST_Q, "C-7", None, false),
                read(COUNT_Q, "C-7", since, false),
            ],
        ),
        (
            "window_24h_max_spread",
            vec![max_read(MAX_SCANNED_Q)],
            vec![max_read(MAX_Q)],
        ),
    ];
    let mut group = c.benchmark_group(format!("history_facts/{backend}"));
    // The same run's floor: one pooled round trip of a prepared `SELECT 1` through sqlx (on
    // PostgreSQL, the loopback network round trip every lookup pays).
    let floor = rt.block_on(async {
        match backend {
            "postgres" => Floor::Postgres(sqlx::PgPool::connect(url).await.unwrap()),
            _ => Floor::Sqlite(sqlx::SqlitePool::connect(url).await.unwrap()),
        }
    });
    group.bench_function("select_1_round_trip", |bench| {
        bench.iter(|| rt.block_on(floor.select_1()));
    });
    for (name, before, after) in &cases {
        // Both answer the same counts before anything is timed.
        let b = rt
            .block_on(ledger.history_facts("call-new", before))
            .unwrap();
        let a = rt
            .block_on(ledger.history_facts("call-new", after))
            .unwrap();
        for ((x, y), r) in b.iter().zip(&a).zip(after) {
            assert_eq!((x.count, x.sum, x.committed), (y.count, y.sum, y.committed));
            if r.max {
                assert_eq!(x.max, y.max, "{name}");
            }
        }
        assert!(
            b.iter().any(|x| x.count + 1 >= earlier.unsigned_abs()),
            "{name}: {b:?}"
        );
        group.bench_function(format!("{name}/before"), |bench| {
            bench.iter(|| {
                rt.block_on(ledger.history_facts("call-new", before))
                    .unwrap()
            });
        });
        group.bench_function(format!("{name}/after"), |bench| {
            bench.iter(|| {
                rt.block_on(ledger.history_facts("call-new", after))
                    .unwrap()
            });
        });
    }
    group.finish();
    rt.block_on(ledger.close());
}

/// A plain pool of the same database, for the round-trip floor.
enum Floor {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Floor {
    async fn select_1(&self) -> i32 {
        const SQL: &str = "SELECT 1";
        match self {
            Self::Sqlite(p) => sqlx::query_scalar(SQL).fetch_one(p).await.unwrap(),
            Self::Postgres(p) => sqlx::query_scalar(SQL).fetch_one(p).await.unwrap(),
        }
    }
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/history.db?mode=rwc", dir.path().display());
    bench_backend(c, &rt, "sqlite", &url);

    // Benchmarks skip PostgreSQL whenever it is unreachable.
    let db = match rt.block_on(PgDatabase::try_create("phrony_bench_history")) {
        Ok(db) => db,
        Err(error @ CreateError::Unreachable { .. }) => {
            eprintln!("{error}; skipping the postgres benchmarks");
            return;
        }
        Err(error) => panic!("{error}"),
    };
    bench_backend(c, &rt, "postgres", db.url());
    drop(db);
}

criterion_group!(history, benches);
criterion_main!(history);
