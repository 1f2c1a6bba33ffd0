//! Ledger write and verification costs.
//!
//! `cargo bench -p phrony-ledger` measures, on SQLite (a temporary file, `synchronous=FULL`)
//! and on PostgreSQL (`PHRONY_TEST_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/postgres`,
//! skipped with a notice when unreachable):
//! - `append_session_event`: one durable append (lock head, hash, insert, commit);
//! - `verify_stream_1000`: recomputing a 1000-event chain;
//! - `tool_call_round_trip`: one allowed tool call through the ledger as the router drives it
//!   (record, queue, dispatch, result: four durable transactions);
//! - `approval_open_and_decide`: record a call, open an approval (call and session move with
//!   it), one approve vote deciding it, the session back to `awaiting_tool` (four
//!   transactions).
//! - `sessions_leased_elsewhere_1000/page`: start-up recovery's question for a page of 1,000
//!   sessions (half leased by another replica), one statement (`= ANY` / chunked `IN`);
//!   `…/per_session`: the same answer read one primary-key read per session, as before.
//! - `<backend>/create_session_with_live/<N>`: one bounded session create
//!   (`create_session_within`, which reads the agent's live-session count in its transaction
//!   and compares it with `RUNTIME_MAX_SESSIONS_PER_AGENT`) while N = 0, 10,000 and 100,000
//!   sessions of the same agent are live (issue #14: 100,000 parked). Each measured create is
//!   followed by an unmeasured cancel of the new session, so every create sees exactly N. The
//!   fill (concurrent unbounded creates) is timed and printed on stderr.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark setup: a panic aborts the benchmark"
)]

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use phrony_ledger::{
    AgentRef, AgentVersion, AgentVersionRef, Dispatch, Ledger, LedgerError, NewAgentVersion,
    NewApproval, NewEvent, NewSession, NewToolCall, OnModify, OnReject, Session, SessionMode,
    SessionStatus, StatusChange, ToolOutcome, ToolResult, Vote, VoteDecision, new_session_id,
};
use phrony_test_support::postgres::{CreateError, PgDatabase};
use serde_json::json;

fn event(i: u64) -> NewEvent {
    NewEvent::new(
        "message.assistant",
        "agent",
        json!({"call_id": format!("call-{i}"), "result": {"refund_id": "r-1", "amount": 100}}),
    )
}

/// Call `index` of the benchmark's session: a refund.
fn refund_call(session: &str, index: u32) -> NewToolCall {
    NewToolCall {
        session_id: session.to_owned(),
        turn: 1,
        iteration: 0,
        index,
        tool: "payments.issue-refund".into(),
        version: "1.0.0".into(),
        wire_name: None,
        args: json!({"order_id": "ORD-1", "amount": 100}),
        side_effect_class: None,
        delegation: None,
    }
}

/// Publishes `bench/<name>` 1.0.0 (content hash `hash`), deploys it and returns the version.
async fn deployed_version(ledger: &Ledger, name: &str, hash: &str) -> AgentVersion {
    let agent = AgentRef::new("bench", name);
    ledger
        .publish_agent_version(NewAgentVersion {
            namespace: "bench".into(),
            name: name.into(),
            version: "1.0.0".into(),
            owner: String::new(),
            labels: Default::default(),
            snapshot_json: "{}".into(),
            content_hash: hash.into(),
            actor: "bench".into(),
        })
        .await
        .unwrap();
    ledger
        .deploy(
            &agent,
            "1.0.0",
            &phrony_ledger::Attribution::unverified("bench"),
        )
        .await
        .unwrap();
    ledger.get_agent_version(&agent, "1.0.0").await.unwrap()
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
    let session = rt.block_on(async {
        let v = deployed_version(ledger, "agent", "h").await;
        let s = ledger.create_session(live_session(&v)).await.unwrap();
        ledger
            .set_session_status(&s.id, StatusChange::to(SessionStatus::AwaitingTool))
            .await
            .unwrap();
        s.id
    });
    let call = |index: u32| refund_call(&session, index);
    let mut index = 0;
    group.bench_function("tool_call_round_trip", |b| {
        b.iter(|| {
            index += 1;
            rt.block_on(async {
                let c = ledger.record_tool_call(call(index)).await.unwrap();
                ledger.queue_tool_call(&c.call_id).await.unwrap();
                let dispatch = Dispatch {
                    worker_id: "w".into(),
                    ..Dispatch::default()
                };
                ledger
                    .dispatch_tool_call(&c.call_id, dispatch)
                    .await
                    .unwrap();
                let result = ToolResult {
                    worker_id: Some("w".into()),
                    outcome: ToolOutcome::Success(json!({"ok": true})),
                    usage: None,
                };
                ledger.record_tool_result(&c.call_id, result).await.unwrap()
            })
        });
    });
    group.bench_function("approval_open_and_decide", |b| {
        b.iter(|| {
            index += 1;
            rt.block_on(async {
                let c = ledger.record_tool_call(call(index)).await.unwrap();
                let approval = ledger
                    .open_approval(NewApproval {
                        allow_self_approval: false,
                        id: uuid::Uuid::new_v4(),
                        session_id: session.clone(),
                        call_id: c.call_id.clone(),
                        policy_ref: Some("bench/p@1.0.0".into()),
                        reason: "bench".into(),
                        route: String::new(),
                        authority_ref: String::new(),
                        approvals_required: 1,
                        comprehension_required: false,
                        on_reject: OnReject::ReturnToAgent,
                        on_modify: OnModify::Unchecked,
                        timeout: None,
                        policy_runtime: Default::default(),
                        actor: "policy".into(),
                        kind: phrony_ledger::ApprovalKind::Policy,
                    })
                    .await
                    .unwrap();
                let vote = Vote {
                    routes: Vec::new(),
                    actor: "alice".into(),
                    decision: VoteDecision::Approve,
                    comment: String::new(),
                    comprehension_acknowledged: false,
                    edited_args: None,
                    resolution: None,
                    result: None,
                };
                ledger.cast_vote(approval.id, vote).await.unwrap();
                ledger
                    .set_session_status(&session, StatusChange::to(SessionStatus::AwaitingTool))
                    .await
                    .unwrap()
            })
        });
    });
    bench_leased_elsewhere(&mut group, rt, ledger);
    group.finish();
}

/// `sessions_leased_elsewhere_1000/page` and `…/per_session` (see the module doc).
fn bench_leased_elsewhere(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    ledger: &Ledger,
) {
    let page: Vec<String> = (0..1000).map(|n| format!("run_page_{n}")).collect();
    let other = ledger.clone().with_replica_id("bench-other").unwrap();
    rt.block_on(async {
        for (n, id) in page.iter().enumerate() {
            ledger.append_session_event(id, event(0)).await.unwrap();
            if n % 2 == 0 {
                other
                    .acquire_session_lease(id, std::time::Duration::from_secs(3600))
                    .await
                    .unwrap();
            }
        }
    });
    group.bench_function("sessions_leased_elsewhere_1000/page", |b| {
        b.iter(|| {
            let found = rt
                .block_on(ledger.sessions_leased_elsewhere(&page))
                .unwrap();
            assert_eq!(found.len(), 500);
        });
    });
    group.bench_function("sessions_leased_elsewhere_1000/per_session", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut found = 0;
                for id in &page {
                    let lease = ledger.session_lease(id).await.unwrap();
                    if lease.is_some_and(|l| l.owner.as_deref() == Some("bench-other")) {
                        found += 1;
                    }
                }
                assert_eq!(found, 500);
            });
        });
    });
}

/// The live-session counts `create_session_with_live` measures at, in increasing order (the
/// fill only adds sessions).
const LIVE_SESSIONS: [u64; 3] = [0, 10_000, 100_000];

/// Under `cargo test` (no `--bench` argument) criterion runs each case once as a smoke test:
/// the set-up is checked with small fills, not 100,000 sessions (minutes on PostgreSQL in CI).
const LIVE_SESSIONS_SMOKE: [u64; 2] = [0, 1_000];

fn live_session_counts() -> &'static [u64] {
    if std::env::args().any(|a| a == "--bench") {
        &LIVE_SESSIONS
    } else {
        &LIVE_SESSIONS_SMOKE
    }
}

/// How many unbounded creates the fill keeps in flight (SQLite's group commit takes up to 64
/// writes per commit).
const FILL_IN_FLIGHT: usize = 64;

/// A new task session of version `v` (the bench's sessions carry no input, limits or secrets).
fn live_session(v: &AgentVersion) -> NewSession {
    NewSession {
        id: new_session_id(),
        agent_version_id: v.id,
        agent: AgentVersionRef::new(&v.agent.namespace, &v.agent.name, &v.version),
        input: json!({}),
        metadata: Default::default(),
        mode: SessionMode::Task,
        parent_session_id: None,
        limits: None,
        bundle_version_id: None,
        secrets: Vec::new(),
        actor: "bench".into(),
    }
}

/// Creates `n` more live sessions of `v`'s agent, `FILL_IN_FLIGHT` at a time.
async fn fill_live_sessions(ledger: &Ledger, v: &AgentVersion, n: u64) {
    let mut in_flight: tokio::task::JoinSet<Result<Session, LedgerError>> =
        tokio::task::JoinSet::new();
    for _ in 0..n {
        if in_flight.len() >= FILL_IN_FLIGHT {
            in_flight.join_next().await.unwrap().unwrap().unwrap();
        }
        let ledger = ledger.clone();
        let new = live_session(v);
        in_flight.spawn(async move { ledger.create_session(new).await });
    }
    while let Some(created) = in_flight.join_next().await {
        created.unwrap().unwrap();
    }
}

/// `<backend>/create_session_with_live/<N>` (see the module doc).
fn bench_live_sessions(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    ledger: &Ledger,
) {
    let agent = AgentRef::new("bench", "live");
    let v = rt.block_on(deployed_version(ledger, "live", "h-live"));
    // Far above every count measured: the check runs and passes.
    let bound = 1_000_000;
    let mut group = c.benchmark_group(format!("{name}/create_session_with_live"));
    group.sample_size(30);
    let mut live = 0;
    for &target in live_session_counts() {
        let started = Instant::now();
        rt.block_on(fill_live_sessions(ledger, &v, target - live));
        live = target;
        assert_eq!(
            rt.block_on(ledger.live_sessions_of_agent(&agent)).unwrap(),
            live
        );
        eprintln!(
            "{name}: {live} live sessions of {agent} (filled in {:.1} s)",
            started.elapsed().as_secs_f64()
        );
        group.bench_function(BenchmarkId::from_parameter(target), |b| {
            b.iter_custom(|iters| {
                let mut measured = Duration::ZERO;
                for _ in 0..iters {
                    let new = live_session(&v);
                    let start = Instant::now();
                    let session = rt
                        .block_on(ledger.create_session_within(new, bound))
                        .unwrap();
                    measured += start.elapsed();
                    rt.block_on(ledger.set_session_status(&session.id, StatusChange::cancelled()))
                        .unwrap();
                }
                measured
            });
        });
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let sqlite = rt.block_on(Ledger::connect(&url)).unwrap();
    bench_backend(c, &rt, "sqlite", &sqlite);
    bench_live_sessions(c, &rt, "sqlite", &sqlite);

    // Benchmarks skip PostgreSQL whenever it is unreachable (no PHRONY_TEST_SKIP_POSTGRES).
    let db = match rt.block_on(PgDatabase::try_create("phrony_bench")) {
        Ok(db) => db,
        Err(error @ CreateError::Unreachable { .. }) => {
            eprintln!("{error}; skipping the postgres benchmarks");
            return;
        }
        Err(error) => panic!("{error}"),
    };
    let pg = rt.block_on(Ledger::connect(db.url())).unwrap();
    bench_backend(c, &rt, "postgres", &pg);
    bench_live_sessions(c, &rt, "postgres", &pg);
    rt.block_on(pg.close());
    drop(db);
}

criterion_group!(ledger, benches);
criterion_main!(ledger);
