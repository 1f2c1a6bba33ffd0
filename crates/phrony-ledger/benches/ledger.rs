//! Ledger write and verification costs.
//!
//! `cargo bench -p phrony-ledger` measures, on SQLite (a temporary file, `synchronous=FULL`)
//! and on PostgreSQL (`PHRONY_TEST_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/postgres`,
//! skipped with a notice when unreachable):
//! - `append_session_event`: one durable append (lock head, hash, insert, commit);
//! - `verify_stream_1000`: recomputing a 1000-event chain.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark setup: a panic aborts the benchmark"
)]

use criterion::{Criterion, criterion_group, criterion_main};
use phrony_ledger::{Ledger, NewEvent};
use serde_json::json;
use sqlx::Executor;

fn event(i: u64) -> NewEvent {
    NewEvent::new(
        "tool.completed",
        "worker",
        json!({"call_id": format!("call-{i}"), "result": {"refund_id": "r-1", "amount": 100}}),
    )
}

fn bench_backend(c: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str, ledger: &Ledger) {
    rt.block_on(async {
        ledger.migrate().await.unwrap();
        for i in 0..1000 {
            ledger
                .append_session_event("run_verify", event(i))
                .await
                .unwrap();
        }
    });
    let mut group = c.benchmark_group(name);
    let mut i = 0;
    group.bench_function("append_session_event", |b| {
        b.iter(|| {
            i += 1;
            rt.block_on(ledger.append_session_event("run_append", event(i)))
                .unwrap()
        });
    });
    group.bench_function("verify_stream_1000", |b| {
        b.iter(|| {
            let report = rt.block_on(ledger.verify_stream("run_verify")).unwrap();
            assert!(report.is_intact());
        });
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let sqlite = rt.block_on(Ledger::connect(&url)).unwrap();
    bench_backend(c, &rt, "sqlite", &sqlite);

    let admin_url = std::env::var("PHRONY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let Ok(admin) = rt.block_on(sqlx::PgPool::connect(&admin_url)) else {
        eprintln!("PostgreSQL at {admin_url} unreachable; skipping the postgres benchmarks");
        return;
    };
    let name = format!("phrony_bench_{}", uuid::Uuid::new_v4().simple());
    rt.block_on(admin.execute(format!("CREATE DATABASE \"{name}\"").as_str()))
        .unwrap();
    let base = admin_url
        .rsplit_once('/')
        .map_or(admin_url.as_str(), |(b, _)| b);
    let pg = rt
        .block_on(Ledger::connect(&format!("{base}/{name}")))
        .unwrap();
    bench_backend(c, &rt, "postgres", &pg);
    rt.block_on(pg.close());
    rt.block_on(admin.execute(format!("DROP DATABASE \"{name}\" WITH (FORCE)").as_str()))
        .unwrap();
}

criterion_group!(ledger, benches);
criterion_main!(ledger);
