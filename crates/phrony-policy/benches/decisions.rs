//! Decisions per second: the refund tutorial's two policies, and a generated set of 1,000.
//!
//! `cargo bench -p phrony-policy --bench decisions` (criterion reports `elem/s` = decisions/s).
//! Times are the benchmark thread's CPU time unless `PHRONY_BENCH_CLOCK=wall`
//! (`support/cpu_time.rs`).
//!
//! Figures of issue #14 (2 vCPU VM shared with other builds, load ≈ 2–3; "before" = scope index
//! only, "after" = path slots, equality keys, gates and regex filters; same session, two
//! alternating runs each; README "Benchmarks"):
//!
//! | benchmark | before | after |
//! |---|---|---|
//! | `refund/amount/100` | 47.0 / 47.5 ns | 50.3 / 50.8 ns |
//! | `refund/amount/400` | 47.8 / 48.2 ns | 50.5 / 50.6 ns |
//! | `refund/amount/14000` | 53.5 / 54.6 ns | 56.6 / 56.1 ns |
//! | `generated_1000/scoped` (target ≤ 5 µs) | 13.6 / 13.6 µs | 4.30 / 4.29 µs |
//! | `generated_1000/all_in_scope` | 55.2 / 55.4 µs | 20.7 / 20.1 µs |
//! | `compile/generated_1000` | 14.5 / 13.8 ms | 22.9 / 22.5 ms |

use std::hint::black_box;

use criterion::measurement::Measurement;
use criterion::{BenchmarkId, Criterion, Throughput};
use phrony_policy::{DecisionKind, PolicyDef, PolicySet, Request, ToolCtx};
use serde_json::{Value, json};

/// 1,000 policies mixing every decision type, scopes and condition shapes. None matches the
/// benchmark's calls, so every decision scans every policy in scope (the slowest allow).
fn generated_defs(all_in_scope: bool) -> Vec<PolicyDef> {
    (0..1000)
        .map(|i| {
            let scope = if all_in_scope || i % 4 == 0 {
                "agent".to_owned()
            } else {
                format!("tool:svc.tool-{}", i % 50)
            };
            let conditions = match i % 6 {
                0 => json!({"field": "amount", "op": "gt", "value": 10_000 + i}),
                1 => json!({"all": [
                    {"field": "currency", "op": "in", "value": ["GBP", "JPY", "CHF"]},
                    {"field": "amount", "op": "gte", "value": 5_000 + i}
                ]}),
                2 => json!({"field": "customer.tier", "op": "eq", "value": format!("tier-{i}")}),
                3 => json!({"field": "items[any].sku", "op": "starts_with", "value": format!("X{i}-")}),
                4 => json!({"any": [
                    {"field": "memo", "op": "matches", "value": format!("(?i)forbidden-{i}\\b")},
                    {"field": "phrony.principal.role", "op": "eq", "value": format!("banned-{i}")}
                ]}),
                _ => json!({"not": {"field": "customer.id", "op": "exists", "value": true}}),
            };
            let mut def = json!({
                "namespace": "gen", "name": format!("policy-{i:04}"), "version": "1.0.0",
                "scope": scope, "conditions": conditions,
                "reason": format!("generated policy {i}")
            });
            match i % 5 {
                0 => def["action"] = json!("deny"),
                1 | 2 => def["action"] = json!("require_approval"),
                3 => def["action"] = json!("escalate"),
                _ => {
                    def["action"] = json!("allow");
                    def["allow"] = json!(["EUR", "USD"]);
                    def["allow_field"] = json!("currency");
                }
            }
            serde_json::from_value(def).expect("generated policy")
        })
        .collect()
}

#[path = "support/cpu_time.rs"]
mod cpu_time;
#[path = "support/refund.rs"]
mod refund;

fn bench<M: Measurement>(c: &mut Criterion<M>) {
    let refund = refund::policies();
    let mut group = c.benchmark_group("refund");
    group.throughput(Throughput::Elements(1));
    for (amount, want) in [
        (100, DecisionKind::Allow),
        (400, DecisionKind::RequireApproval),
        (14000, DecisionKind::Deny),
    ] {
        let args = json!({"order_id": "ORD-1", "amount": amount, "reason": "damaged"});
        let req = Request::new(ToolCtx::new("payments.issue-refund"), &args);
        assert_eq!(refund.evaluate(&req).kind(), want);
        group.bench_with_input(BenchmarkId::new("amount", amount), &req, |b, req| {
            b.iter(|| black_box(refund.evaluate(black_box(req))).kind())
        });
    }
    group.finish();

    let args: Value = json!({
        "amount": 100, "currency": "EUR", "memo": "customer asked politely",
        "customer": {"id": "C-1", "tier": "gold"},
        "items": [{"sku": "A-1"}, {"sku": "B-2"}, {"sku": "C-3"}]
    });
    let claims = json!({"role": "agent"});
    let req = Request::new(ToolCtx::new("svc.tool-7"), &args).with_principal(&claims);
    let mut group = c.benchmark_group("generated_1000");
    group.throughput(Throughput::Elements(1));
    for (label, all_in_scope) in [("scoped", false), ("all_in_scope", true)] {
        let set = PolicySet::compile(generated_defs(all_in_scope)).expect("generated compile");
        assert_eq!(set.len(), 1000);
        assert_eq!(set.evaluate(&req).kind(), DecisionKind::Allow);
        group.bench_function(label, |b| {
            b.iter(|| black_box(set.evaluate(black_box(&req))).kind())
        });
    }
    group.finish();

    let mut group = c.benchmark_group("compile");
    group.throughput(Throughput::Elements(1000));
    group.bench_function("generated_1000", |b| {
        b.iter_batched(
            || generated_defs(false),
            |defs| PolicySet::compile(defs).expect("compile"),
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn main() {
    cpu_time::run(bench, bench);
}
