//! History lookups (migration 0014): what a history-aware decision reads before the policies
//! run, with 10,000 earlier calls in scope of the group.
//!
//! `cargo bench -p phrony-ledger --bench history` on SQLite (a temporary file):
//! - `history_facts/unwindowed_sum`: one read of `sum` (counters) plus `max` and `last` over
//!   the amount and time indexes;
//! - `history_facts/window_24h_count`: the same group read through a 24 h window (an exact
//!   range over the time index: its cost grows with the entries inside the window);
//! - `history_facts/refund_policy`: the refund example's three queries (sum per order,
//!   last lookup total, 24 h count per customer) in one round trip.
//!
//! The policy side (`crates/phrony-policy/benches/history.rs`) adds well under a microsecond.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark setup: a panic aborts the benchmark"
)]

use chrono::{Duration, Utc};
use criterion::{Criterion, criterion_group, criterion_main};
use phrony_ledger::{HistoryKey, HistoryRead, HistoryReservation, Ledger};

const EARLIER: usize = 10_000;

fn key(query: &str, group: &str) -> HistoryKey {
    HistoryKey {
        query_key: query.to_owned(),
        scope_key: "*".to_owned(),
        group_key: group.to_owned(),
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
    let sum_q = "refund_order|everyone|customer_id||sum|amount";
    let count_q = "refund_order|everyone|customer_id|86400|count|";
    let last_q = "lookup_order|everyone|customer_id||last|result.total";
    let ledger = rt.block_on(async {
        let ledger = Ledger::connect(&url).await.unwrap();
        ledger.migrate().await.unwrap();
        let mut versions = [0_i64; 2];
        for i in 0..EARLIER {
            let call = format!("call-{i}");
            let reservations = [
                HistoryReservation {
                    key: key(sum_q, "C-7"),
                    amount: Some(10.0 + (i % 100) as f64),
                    result_path: None,
                    expected_version: versions[0],
                },
                HistoryReservation {
                    key: key(count_q, "C-7"),
                    amount: None,
                    result_path: None,
                    expected_version: versions[1],
                },
            ];
            assert!(
                ledger
                    .reserve_history("s", &call, &reservations)
                    .await
                    .unwrap()
            );
            versions = [versions[0] + 1, versions[1] + 1];
        }
        ledger
    });
    let mut group = c.benchmark_group("history_facts");
    let unwindowed = [HistoryRead {
        key: key(sum_q, "C-7"),
        since: None,
    }];
    group.bench_function("unwindowed_sum", |b| {
        b.iter(|| {
            rt.block_on(ledger.history_facts("call-new", &unwindowed))
                .unwrap()
        });
    });
    let window = [HistoryRead {
        key: key(count_q, "C-7"),
        since: Some(Utc::now() - Duration::hours(24)),
    }];
    let counted = rt
        .block_on(ledger.history_facts("call-new", &window))
        .unwrap();
    assert_eq!(counted[0].count, EARLIER as u64);
    group.bench_function("window_24h_count", |b| {
        b.iter(|| {
            rt.block_on(ledger.history_facts("call-new", &window))
                .unwrap()
        });
    });
    let policy = [
        unwindowed[0].clone(),
        HistoryRead {
            key: key(last_q, "C-7"),
            since: None,
        },
        window[0].clone(),
    ];
    group.bench_function("refund_policy", |b| {
        b.iter(|| {
            rt.block_on(ledger.history_facts("call-new", &policy))
                .unwrap()
        });
    });
    group.finish();
}

criterion_group!(history, benches);
criterion_main!(history);
