//! The allow path must not touch the heap: a counting global allocator watches `evaluate`.
//!
//! This file holds a single test so no other test thread allocates while it measures.

use std::alloc::System;

use phrony_policy::{
    AgentCtx, DecisionKind, HistoryFact, HistoryFacts, PolicyDef, PolicySet, Request, SessionCtx,
    ToolCtx,
};
use serde_json::{Value, json};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn policies() -> PolicySet {
    let defs: Vec<PolicyDef> = serde_json::from_value(json!([
        {"namespace": "payments", "name": "refund-approval-boundary", "version": "1.0.0",
         "scope": "tool:payments.issue-refund", "action": "require_approval",
         "conditions": {"field": "amount", "op": "gt", "value": 250},
         "reason": "Refund amount above delegated limit.", "on_reject": "return_to_agent"},
        {"namespace": "payments", "name": "refund-hard-limit", "version": "1.0.0",
         "scope": "tool:payments.issue-refund", "action": "deny",
         "conditions": {"field": "amount", "op": "gt", "value": 5000},
         "reason": "Refund amount exceeds the absolute ceiling."},
        {"name": "every-operator", "scope": "agent", "action": "deny", "conditions": {"any": [
            {"field": "currency", "op": "eq", "value": "ÄUR"},
            {"field": "currency", "op": "neq", "value": "EUR"},
            {"field": "amount", "op": ">=", "value": "100000"},
            {"field": "amount", "op": "<", "value": -1},
            {"field": "amount", "op": "lte", "value": -5},
            {"field": "currency", "op": "in", "value": ["GBP", "JPY", 5]},
            {"field": "reason", "op": "not_in", "value": ["damaged", "late", "KUNDE SAGT: PAKET KAM BESCHÄDIGT AN"]},
            {"field": "reason", "op": "matches", "value": "(?i)fraud|chargeback"},
            {"field": "amount", "op": "matches", "value": "^9{6}$"},
            {"field": "approved_by", "op": "exists"},
            {"field": "reason", "op": "contains", "value": "ÜBERWEISUNG"},
            {"field": "amount", "op": "contains", "value": 7},
            {"field": "tags", "op": "contains", "value": "blocked"},
            {"field": "reason", "op": "starts_with", "value": "test"},
            {"field": "reason", "op": "ends_with", "value": "!!"},
            {"field": "items[any].price", "op": "gt", "value": 1000},
            {"field": "items[all].sku", "op": "starts_with", "value": "zz"},
            {"field": "items[0].sku", "op": "eq", "value": "forbidden"},
            {"not": {"field": "items[all].qty", "op": "gte", "value": 1}},
            {"field": "phrony.agent.ref", "op": "eq", "value": "evil/agent@6.6.6"},
            {"field": "phrony.agent.ref", "op": "matches", "value": "^evil/"},
            {"field": "phrony.tool.side_effect_class", "op": "eq", "value": "irreversible_action"},
            {"field": "phrony.session.metadata.channel", "op": "eq", "value": "fax"},
            {"field": "phrony.principal.role", "op": "in", "value": ["banned"]},
            {"field": "phrony.time.weekday", "op": "eq", "value": "sunday"},
            {"field": "phrony.time.hour", "op": "gt", "value": 22},
            {"field": "phrony.dispatch.trigger", "op": "eq", "value": "dispatch:no_handler"}
        ]}},
        {"name": "order-cap", "scope": "tool:payments.issue-refund", "action": "deny",
         "conditions": {"history": {"calls": "issue_refund", "same": ["order_id"], "aggregate": "sum", "of": "amount"},
                        "op": "gt",
                        "value_from": {"history": {"calls": "lookup_order", "same": ["order_id"], "aggregate": "last", "of": "result.total"}}}},
        {"name": "three-a-day", "scope": "tool:payments.issue-refund", "action": "deny",
         "conditions": {"history": {"in": "everyone", "same": ["order_id"], "within": "24h", "aggregate": "count"},
                        "op": "gt", "value": 3}},
        {"name": "looked-up", "scope": "tool:payments.issue-refund", "action": "deny",
         "conditions": {"history": {"calls": "lookup_order", "same": ["order_id"], "aggregate": "exists"},
                        "op": "eq", "value": false}},
        {"name": "currency-allow", "scope": "agent", "action": "allow", "allow": ["EUR", "USD"]},
        {"name": "sku-allow", "scope": "agent", "action": "allow", "allow": ["A-1", "B-2"],
         "allow_field": "items[all].sku"},
        {"name": "role-allow", "scope": "agent", "action": "allow", "allow": ["agent", "ops"],
         "allow_field": "phrony.principal.role"}
    ]))
    .expect("definitions");
    PolicySet::compile(defs).expect("compiles")
}

#[test]
fn evaluation_does_not_allocate() {
    let set = policies();
    let meta = json!({"channel": "email"});
    let claims = json!({"role": "ops"});
    let args: Vec<Value> = [json!(100), json!(250), json!("0.5")]
        .into_iter()
        .map(|amount| {
            json!({
                "order_id": "ORD-1", "amount": amount, "currency": "eur",
                "reason": "Kunde sagt: Paket kam beschädigt an", "tags": ["vip"],
                "items": [{"sku": "A-1", "price": 10, "qty": 1}, {"sku": "b-2", "price": 20, "qty": 2}]
            })
        })
        .collect();
    // Facts for every history query: one earlier refund of 100 for the order, a looked-up order
    // total of 20,000.
    let facts: &'static HistoryFacts = Box::leak(Box::new({
        let mut facts = HistoryFacts::new(set.history_queries().len());
        for (i, q) in set.history_queries().iter().enumerate() {
            let last = (q.calls() == "lookup_order").then_some(20_000.0);
            facts.set(
                i,
                HistoryFact {
                    count: 1,
                    sum: 100.0,
                    max: Some(100.0),
                    committed: 1,
                    last,
                },
            );
        }
        facts
    }));
    assert_eq!(set.history_queries().len(), 4);
    let request = |args: &'static Value| {
        Request::new(
            ToolCtx {
                r#ref: "payments.issue-refund",
                version: "1.0.0",
                side_effect_class: "non_idempotent_write",
                name: "issue_refund",
            },
            args,
        )
        .with_agent(AgentCtx {
            namespace: "support",
            name: "refund-agent",
            version: "1.0.0",
        })
        .with_session(SessionCtx {
            id: "sess-1",
            metadata: Some(Box::leak(Box::new(meta.clone()))),
        })
        .with_principal(Box::leak(Box::new(claims.clone())))
        .at(1_704_542_400)
        .with_history(facts)
    };
    let args: &'static [Value] = Box::leak(args.into_boxed_slice());
    let allow: Vec<Request<'static>> = args.iter().map(request).collect();
    let approval_args: &'static Value = Box::leak(Box::new({
        let mut a = args[0].clone();
        a["amount"] = json!(400);
        a
    }));
    let approval = request(approval_args);
    let deny_args: &'static Value = Box::leak(Box::new({
        let mut a = args[0].clone();
        a["amount"] = json!(14000);
        a
    }));
    let deny = request(deny_args);

    // Warm up: the regex engines build their per-thread caches on first use.
    for r in allow.iter().chain([&approval, &deny]) {
        set.evaluate(r);
    }

    let mut kinds = Vec::with_capacity(8);
    let region = Region::new(GLOBAL);
    for _ in 0..100 {
        for r in &allow {
            kinds.push(set.evaluate(r).kind());
        }
        kinds.push(set.evaluate(&approval).kind());
        kinds.push(set.evaluate(&deny).kind());
        kinds.clear();
    }
    let stats = region.change();
    assert_eq!(
        (stats.allocations, stats.reallocations),
        (0, 0),
        "evaluate allocated: {stats:?}"
    );

    // The measured calls decided what they should.
    let got: Vec<DecisionKind> = allow
        .iter()
        .chain([&approval, &deny])
        .map(|r| set.evaluate(r).kind())
        .collect();
    assert_eq!(
        got,
        [
            DecisionKind::Allow,
            DecisionKind::Allow,
            DecisionKind::Allow,
            DecisionKind::RequireApproval,
            DecisionKind::Deny
        ]
    );
}
