//! End-to-end cost of a governed session in memory: the tutorial's €100 refund (two model
//! completions with tool calls, policy evaluation, two dispatches to an in-process worker over
//! the real router, the final answer), and the same with a €400 refund decided by a human.
#![allow(clippy::unwrap_used, missing_docs, reason = "benchmark harness")]

#[path = "../tests/engine/common/mod.rs"]
mod common;

use common::{AgentOptions, Harness, Step, VoteTarget, approve, refund};
use criterion::{Criterion, criterion_group, criterion_main};
use phrony_ledger::SessionStatus;
use serde_json::json;

fn sessions(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let h = rt.block_on(Harness::memory(&AgentOptions::default(), vec![]));
    c.bench_function(
        "allowed refund session (3 completions, 2 dispatches)",
        |b| {
            b.iter(|| {
                rt.block_on(async {
                    h.script
                        .push(Step::call("lookup_order", json!({"order_id": "ORD-1"})));
                    h.script
                        .push(Step::call("issue_refund", refund("ORD-1", 100.0)));
                    h.script.push(Step::say("Refund issued."));
                    let s = h.start("Refund €100 for ORD-1.").await;
                    let done = h.engine.wait_for(&s.id, &[]).await.unwrap();
                    assert_eq!(
                        done.status,
                        SessionStatus::Completed,
                        "{:?} after {} sessions; router: {:#?}",
                        done.error,
                        h.script.requests().len() / 3,
                        h.router.snapshot()
                    );
                });
            });
        },
    );
    c.bench_function("approved refund session (approval round trip)", |b| {
        b.iter(|| {
            rt.block_on(async {
                h.script
                    .push(Step::call("issue_refund", refund("ORD-1", 400.0)));
                h.script.push(Step::say("Refund issued."));
                let s = h.start("Refund €400 for ORD-1.").await;
                h.engine
                    .wait_for(&s.id, &[SessionStatus::AwaitingApproval])
                    .await
                    .unwrap();
                let approval = h.pending_approval(&s.id).await;
                h.engine
                    .vote(VoteTarget::Approval(approval.id), approve("emad", "ok"))
                    .await
                    .unwrap();
                let done = h.engine.wait_for(&s.id, &[]).await.unwrap();
                assert_eq!(done.status, SessionStatus::Completed);
            });
        });
    });
}

criterion_group!(benches, sessions);
criterion_main!(benches);
