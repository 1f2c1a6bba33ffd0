//! History-aware conditions: compilation, diagnostics and evaluation against given facts.

use phrony_policy::{
    Aggregate, DecisionKind, HistoryFact, HistoryFacts, HistoryScope, PolicyDef, PolicySet,
    Request, ToolCtx, parse_window,
};
use serde_json::{Value, json};

fn set(defs: Value) -> PolicySet {
    let defs: Vec<PolicyDef> = serde_json::from_value(defs).expect("definitions");
    PolicySet::compile(defs).expect("compiles")
}

fn refund_set() -> PolicySet {
    set(json!([
        {"name": "order-total-cap", "scope": "tool:payments.issue-refund", "action": "deny",
         "reason": "cumulative refunds exceed the order total",
         "conditions": {
            "history": {"calls": "issue_refund", "same": ["order_id"], "aggregate": "sum", "of": "amount"},
            "op": "gt",
            "value_from": {"history": {"calls": "lookup_order", "same": ["order_id"], "aggregate": "last", "of": "result.total"}}}},
        {"name": "three-per-customer-per-day", "scope": "tool:payments.issue-refund", "action": "deny",
         "conditions": {
            "history": {"in": "everyone", "same": ["customer_id"], "within": "24h", "aggregate": "count"},
            "op": "gt", "value": 3}}
    ]))
}

fn tool() -> ToolCtx<'static> {
    ToolCtx {
        r#ref: "payments.issue-refund",
        version: "1.0.0",
        side_effect_class: "non_idempotent_write",
        name: "issue_refund",
    }
}

fn facts_for(
    set: &PolicySet,
    f: impl Fn(&phrony_policy::HistoryQuery) -> Option<HistoryFact>,
) -> HistoryFacts {
    let mut facts = HistoryFacts::new(set.history_queries().len());
    for (i, q) in set.history_queries().iter().enumerate() {
        if let Some(fact) = f(q) {
            facts.set(i, fact);
        }
    }
    facts
}

#[test]
fn queries_are_listed_once_with_stable_keys_and_parameters() {
    let set = refund_set();
    let qs = set.history_queries();
    assert_eq!(qs.len(), 3);
    assert_eq!(qs[0].key(), "issue_refund|session|order_id||sum|amount");
    assert_eq!(
        qs[1].key(),
        "lookup_order|session|order_id||last|result.total"
    );
    assert_eq!(qs[1].result_path().as_deref(), Some("total"));
    // `calls` defaults to the policy's own tool.
    assert_eq!(qs[2].calls(), "payments.issue-refund");
    assert_eq!(qs[2].scope(), HistoryScope::Everyone);
    assert_eq!(qs[2].within_secs(), Some(86_400));
    assert_eq!(qs[2].aggregate(), Aggregate::Count);
    // The window in seconds is the key's fourth field: the ledger's pruner reads it there for
    // groups from before migration 0016 (`phrony-ledger`'s `window_of_key`).
    assert_eq!(
        qs[2].key(),
        "payments.issue-refund|everyone|customer_id|86400|count|"
    );
    assert!(qs[0].matches_tool(&tool()) && qs[2].matches_tool(&tool()));
    assert!(!qs[1].matches_tool(&tool()));
    let args = json!({"order_id": "O-1", "customer_id": 7, "amount": "40.5"});
    assert_eq!(qs[0].group_key(&args).as_deref(), Some("\"O-1\""));
    assert_eq!(qs[2].group_key(&args).as_deref(), Some("7"));
    assert_eq!(
        qs[2].group_key(&json!({"customer_id": 7.0})).as_deref(),
        Some("7")
    );
    assert_eq!(qs[0].group_key(&json!({"amount": 1})), None);
    assert_eq!(qs[0].amount(&args), Some(40.5));
    assert_eq!(qs[2].amount(&args), None);
}

#[test]
fn cumulative_refunds_are_capped_by_the_looked_up_total() {
    let set = refund_set();
    let decide = |earlier_sum: f64, total: Option<f64>, amount: f64| {
        let facts = facts_for(&set, |q| {
            Some(match q.aggregate() {
                Aggregate::Sum => HistoryFact {
                    count: 1,
                    sum: earlier_sum,
                    ..HistoryFact::default()
                },
                Aggregate::Last => HistoryFact {
                    committed: u64::from(total.is_some()),
                    last: total,
                    ..HistoryFact::default()
                },
                _ => HistoryFact::default(),
            })
        });
        let args = json!({"order_id": "O-1", "customer_id": "c", "amount": amount});
        set.evaluate(&Request::new(tool(), &args).with_history(&facts))
            .kind()
    };
    assert_eq!(decide(0.0, Some(100.0), 100.0), DecisionKind::Allow);
    assert_eq!(decide(60.0, Some(100.0), 40.0), DecisionKind::Allow);
    assert_eq!(decide(60.0, Some(100.0), 40.01), DecisionKind::Deny);
    // No lookup happened: the comparison value is missing, the deny holds (fail-closed).
    assert_eq!(decide(0.0, None, 1.0), DecisionKind::Deny);
}

#[test]
fn the_fourth_refund_in_a_window_is_denied_and_missing_facts_fail_closed() {
    let set = refund_set();
    let decide = |count: u64| {
        let facts = facts_for(&set, |q| {
            Some(match q.aggregate() {
                Aggregate::Count => HistoryFact {
                    count,
                    ..HistoryFact::default()
                },
                Aggregate::Last => HistoryFact {
                    committed: 1,
                    last: Some(1e9),
                    ..HistoryFact::default()
                },
                _ => HistoryFact::default(),
            })
        });
        let args = json!({"order_id": "O-1", "customer_id": "c", "amount": 1});
        set.evaluate(&Request::new(tool(), &args).with_history(&facts))
            .kind()
    };
    assert_eq!(decide(0), DecisionKind::Allow);
    assert_eq!(decide(2), DecisionKind::Allow);
    assert_eq!(decide(3), DecisionKind::Deny);
    let args = json!({"order_id": "O-1", "customer_id": "c", "amount": 1});
    // No facts at all: every history leaf holds, so the deny policies deny.
    assert_eq!(
        set.evaluate(&Request::new(tool(), &args)).kind(),
        DecisionKind::Deny
    );
    // A fact missing for one query only.
    let partial = facts_for(&set, |q| {
        (q.aggregate() != Aggregate::Count).then(HistoryFact::default)
    });
    assert_eq!(
        set.evaluate(&Request::new(tool(), &args).with_history(&partial))
            .kind(),
        DecisionKind::Deny
    );
}

#[test]
fn a_payout_needs_an_earlier_verification() {
    let set = set(json!([
        {"name": "verified-payee", "scope": "tool:payouts.send", "action": "deny",
         "conditions": {"history": {"calls": "verify_payee", "same": ["payee"], "aggregate": "exists"},
                        "op": "eq", "value": false}}
    ]));
    let tool = ToolCtx {
        r#ref: "payouts.send",
        name: "send_payout",
        ..ToolCtx::default()
    };
    let args = json!({"payee": "DE01", "amount": 10});
    let with = |committed: u64| {
        let facts = facts_for(&set, |_| {
            Some(HistoryFact {
                committed,
                count: committed,
                ..HistoryFact::default()
            })
        });
        set.evaluate(&Request::new(tool, &args).with_history(&facts))
            .kind()
    };
    assert_eq!(with(0), DecisionKind::Deny);
    assert_eq!(with(1), DecisionKind::Allow);
    // A reserved (in-flight) verification is not one that happened.
    let reserved = facts_for(&set, |_| {
        Some(HistoryFact {
            count: 1,
            committed: 0,
            ..HistoryFact::default()
        })
    });
    assert_eq!(
        set.evaluate(&Request::new(tool, &args).with_history(&reserved))
            .kind(),
        DecisionKind::Deny
    );
    // A history leaf makes the policy depend on the call: it never hides the tool.
    assert!(set.hidden_tool(&Request::new(tool, &json!({}))).is_none());
}

#[test]
fn every_mistake_is_reported_at_once_with_its_path() {
    let defs: Vec<PolicyDef> = serde_json::from_value(json!([
        {"name": "bad", "scope": "agent", "action": "deny", "conditions": {"all": [
            {"history": {"aggregate": "median", "in": "galaxy", "within": "3 weeks", "colour": 1}, "op": "gt", "value": 1},
            {"history": {"calls": "x", "aggregate": "sum"}, "op": "gt", "value": 1},
            {"history": {"calls": "x", "aggregate": "count", "of": "amount"}, "op": "matches", "value": "a"},
            {"history": {"calls": "x", "aggregate": "exists"}, "op": "eq", "value": 3},
            {"history": {"calls": "x", "aggregate": "count", "within": "400d", "same": [""]}, "op": "gt"},
            {"history": {"calls": "x", "aggregate": "last", "of": "result.total", "include_current": true}, "op": "gt", "value": 1, "value_from": {}}
        ]}}
    ]))
    .expect("definitions");
    let errors = PolicySet::compile(defs).expect_err("invalid");
    let lines: Vec<String> = errors
        .errors()
        .iter()
        .map(|e| format!("{}: {}", e.path, e.kind))
        .collect();
    let expected = [
        "conditions.all[0].history.colour: unknown key `colour` in a history query; expected calls, in, same, within, aggregate, of or include_current",
        "conditions.all[0].history.calls: `calls` is required in a policy that is not scoped to one tool",
        "conditions.all[0].history.in: unknown history scope `galaxy`; expected session, agent or everyone",
        "conditions.all[0].history.within: `within: 3 weeks` must start with a whole number above 0",
        "conditions.all[0].history.aggregate: unknown aggregate `median`; expected count, sum, max, last or exists",
        "conditions.all[1].history.of: `aggregate: sum` needs `of`: the argument path (or `result.<path>`) to aggregate",
        "conditions.all[2].history.of: `aggregate: count` takes no `of`",
        "conditions.all[2].op: a history condition compares with eq, neq, gt, gte, lt or lte, not `matches`",
        "conditions.all[3].value: `aggregate: exists` compares with eq or neq against true or false, found 3",
        "conditions.all[4].history.same[0]: `same[0]` must be an argument path such as `customer_id` or `order.id`, found \"\"",
        "conditions.all[4].history.within: `within: 400d` is longer than the maximum of 366d",
        "conditions.all[4].value: a history condition needs `value` (a number, or true/false for exists) or `value_from: {history: …}`",
        "conditions.all[5].history.include_current: `include_current` applies only to count, sum and max",
        "conditions.all[5].value_from: give `value` or `value_from`, not both",
    ];
    assert_eq!(lines, expected, "{lines:#?}");
}

#[test]
fn windows_parse_exactly() {
    assert_eq!(parse_window("90s"), Ok(90));
    assert_eq!(parse_window("15m"), Ok(900));
    assert_eq!(parse_window(" 24h "), Ok(86_400));
    assert_eq!(parse_window("366d"), Ok(366 * 86_400));
    for bad in [
        "",
        "h",
        "0h",
        "-1h",
        "1.5h",
        "24",
        "1w",
        "367d",
        "99999999999999999999d",
    ] {
        assert!(parse_window(bad).is_err(), "{bad}");
    }
}

#[test]
fn too_many_distinct_queries_are_refused() {
    let leaves: Vec<Value> = (0..=phrony_policy::MAX_HISTORY_QUERIES)
        .map(|i| json!({"history": {"calls": format!("t{i}"), "aggregate": "count"}, "op": "gt", "value": 1}))
        .collect();
    let defs: Vec<PolicyDef> = serde_json::from_value(json!([
        {"name": "many", "scope": "agent", "action": "deny", "conditions": {"any": leaves}}
    ]))
    .expect("definitions");
    let errors = PolicySet::compile(defs).expect_err("too many");
    assert!(
        errors
            .to_string()
            .contains("more than 64 distinct history queries"),
        "{errors}"
    );
}

#[test]
fn shadow_and_enforced_sets_index_facts_alike() {
    let set = set(json!([
        {"name": "cap", "scope": "tool:payments.issue-refund", "action": "deny",
         "conditions": {"history": {"aggregate": "count"}, "op": "gt", "value": 5}},
        {"name": "tight", "scope": "tool:payments.issue-refund", "action": "deny", "mode": "shadow",
         "conditions": {"history": {"aggregate": "count"}, "op": "gt", "value": 2}}
    ]));
    assert_eq!(set.history_queries().len(), 1);
    let facts = facts_for(&set, |_| {
        Some(HistoryFact {
            count: 3,
            ..HistoryFact::default()
        })
    });
    let args = json!({});
    let req = Request::new(tool(), &args).with_history(&facts);
    assert_eq!(set.evaluate(&req).kind(), DecisionKind::Allow);
    let shadow = set
        .shadow(&req, DecisionKind::Allow)
        .expect("the shadow cap would deny");
    assert_eq!(shadow.shadow.kind(), DecisionKind::Deny);
}
