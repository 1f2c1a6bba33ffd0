//! The policy side of a history-aware decision: the refund example's policies (cumulative sum
//! per order against the looked-up total, a 24 h count per customer) evaluated with facts that
//! summarise 10,000 earlier calls (the facts are aggregates: their size does not grow with the
//! calls). `cargo bench -p phrony-policy --bench history`; the ledger lookup is
//! `crates/phrony-ledger/benches/history.rs`.

use std::hint::black_box;

use criterion::Criterion;
use phrony_policy::{
    Aggregate, DecisionKind, HistoryFact, HistoryFacts, PolicyDef, PolicySet, Request, ToolCtx,
};
use serde_json::json;

fn main() {
    let defs: Vec<PolicyDef> = serde_json::from_value(json!([
        {"name": "refunds-within-order-total", "scope": "tool:payments.refund-order", "action": "deny",
         "conditions": {"history": {"calls": "refund_order", "same": ["order_id"], "aggregate": "sum", "of": "amount"},
                        "op": "gt",
                        "value_from": {"history": {"calls": "lookup_order", "same": ["order_id"], "aggregate": "last", "of": "result.total"}}}},
        {"name": "refunds-per-customer-per-day", "scope": "tool:payments.refund-order", "action": "deny",
         "conditions": {"history": {"calls": "refund_order", "in": "everyone", "same": ["customer_id"], "within": "24h", "aggregate": "count"},
                        "op": "gt", "value": 10_001}}
    ]))
    .expect("definitions");
    let set = PolicySet::compile(defs).expect("compiles");
    let mut facts = HistoryFacts::new(set.history_queries().len());
    for (i, q) in set.history_queries().iter().enumerate() {
        facts.set(
            i,
            match q.aggregate() {
                Aggregate::Last => HistoryFact {
                    committed: 1,
                    last: Some(2.0e6),
                    ..HistoryFact::default()
                },
                _ => HistoryFact {
                    count: 10_000,
                    sum: 595_000.0,
                    max: Some(109.0),
                    committed: 10_000,
                    last: None,
                },
            },
        );
    }
    let args = json!({"order_id": "ORD-1", "customer_id": "C-7", "amount": 40, "currency": "EUR"});
    let tool = ToolCtx {
        r#ref: "payments.refund-order",
        name: "refund_order",
        ..ToolCtx::default()
    };
    let request = Request::new(tool, &args).with_history(&facts);
    assert_eq!(set.evaluate(&request).kind(), DecisionKind::Allow);
    let mut c = Criterion::default().configure_from_args();
    c.bench_function("history/refund_policies_10000_earlier", |b| {
        b.iter(|| black_box(set.evaluate(black_box(&request))).kind());
    });
    c.final_summary();
}
