//! Behaviour tests of the public API, table-driven where possible.

#![allow(
    clippy::too_many_lines,
    reason = "a test scenario reads top to bottom as one story; splitting it would hide its steps"
)]

use serde_json::{Value, json};

use crate::{
    Action, AgentCtx, CompileErrors, DecisionKind, Effect, OnModify, OnReject, PolicyDef, PolicyId,
    PolicySet, Request, SessionCtx, TimeoutDefault, ToolCtx, Trigger,
};

const TOOL: &str = "payments.issue-refund";

fn defs(v: Value) -> Vec<PolicyDef> {
    serde_json::from_value(v).expect("policy definitions deserialize")
}

fn compile(v: Value) -> PolicySet {
    match PolicySet::compile(defs(v)) {
        Ok(set) => set,
        Err(e) => panic!("{e}"),
    }
}

fn compile_err(v: Value) -> CompileErrors {
    match PolicySet::compile(defs(v)) {
        Ok(set) => panic!("expected errors, compiled {} policies", set.len()),
        Err(e) => e,
    }
}

/// Whether `conditions` hold for `args`, via a deny policy in scope `agent`.
fn holds_with(conditions: &Value, req: &Request<'_>) -> bool {
    let set = compile(
        json!([{"name": "p", "scope": "agent", "action": "deny", "conditions": conditions}]),
    );
    set.evaluate(req).kind() == DecisionKind::Deny
}

fn holds(conditions: Value, args: Value) -> bool {
    holds_with(&conditions, &Request::new(ToolCtx::new(TOOL), &args))
}

fn leaf(field: &str, op: &str, value: Value) -> Value {
    json!({"field": field, "op": op, "value": value})
}

#[test]
fn operators_and_aliases() {
    let args = json!({
        "amount": 400, "text_amount": " 400 ", "currency": "EUR", "flag": true, "none": null,
        "memo": "Customer says the parcel was DAMAGED", "tags": ["vip", "Repeat", 7],
        "path": "/etc/passwd", "obj": {"k": "secret"}, "version": "1.0.0"
    });
    let cases: Vec<(&str, &str, Value, bool)> = vec![
        ("amount", "eq", json!(400), true),
        ("amount", "==", json!("400"), true),
        ("amount", "eq", json!(400.0), true),
        ("text_amount", "eq", json!(400), true),
        ("amount", "eq", json!(401), false),
        ("currency", "eq", json!("eur"), true),
        ("currency", "eq", json!(" EUR "), true),
        ("currency", "eq", json!("usd"), false),
        ("flag", "eq", json!(true), true),
        ("flag", "eq", json!("TRUE"), true),
        ("none", "eq", json!(null), true),
        ("currency", "eq", json!(null), false),
        ("obj", "eq", json!("secret"), false),
        ("amount", "neq", json!(400), false),
        ("amount", "!=", json!(300), true),
        ("currency", "neq", json!("Eur"), false),
        ("amount", "gt", json!(250), true),
        ("amount", ">", json!(400), false),
        ("amount", "gte", json!(400), true),
        ("amount", ">=", json!("401"), false),
        ("amount", "lt", json!(500), true),
        ("amount", "<", json!(400), false),
        ("amount", "lte", json!(400), true),
        ("amount", "<=", json!(399.5), false),
        ("text_amount", "gt", json!(250), true),
        ("currency", "gt", json!(0), false),
        ("currency", "lt", json!(0), false),
        ("flag", "gt", json!(0), false),
        ("currency", "in", json!(["USD", "eur"]), true),
        ("amount", "in", json!([100, "400"]), true),
        ("currency", "in", json!(["USD", "CAD"]), false),
        ("currency", "not_in", json!(["USD", "CAD"]), true),
        ("currency", "not_in", json!(["usd", "EUR"]), false),
        ("memo", "matches", json!("DAMAGED"), true),
        ("memo", "matches", json!("damaged"), false),
        ("memo", "matches", json!("(?i)damaged"), true),
        ("memo", "matches", json!("^parcel"), false),
        ("amount", "matches", json!("^4\\d\\d$"), true),
        ("flag", "matches", json!("^true$"), true),
        ("obj", "matches", json!("secret"), true),
        ("tags", "matches", json!("\"vip\""), true),
        ("amount", "exists", json!(true), true),
        ("none", "exists", json!(true), true),
        ("amount", "exists", json!(false), false),
        ("memo", "contains", json!("parcel was damaged"), true),
        ("memo", "contains", json!("refund"), false),
        ("tags", "contains", json!("repeat"), true),
        ("tags", "contains", json!(7), true),
        ("tags", "contains", json!("rep"), false),
        ("obj", "contains", json!("k"), false),
        ("amount", "contains", json!(0), true),
        ("path", "starts_with", json!("/ETC/"), true),
        ("path", "starts_with", json!("/usr"), false),
        ("path", "ends_with", json!("PASSWD"), true),
        ("path", "ends_with", json!("shadow"), false),
        ("version", "starts_with", json!("1."), true),
        ("tags", "starts_with", json!("vip"), false),
    ];
    for (field, op, value, want) in cases {
        assert_eq!(
            holds(leaf(field, op, value.clone()), args.clone()),
            want,
            "{field} {op} {value}"
        );
    }
    // `op` defaults to `eq`; `exists` defaults to `true`.
    assert!(holds(
        json!({"field": "currency", "value": "EUR"}),
        args.clone()
    ));
    assert!(holds(
        json!({"field": "amount", "op": "exists"}),
        args.clone()
    ));
    assert!(!holds(json!({"field": "nope", "op": "exists"}), args));
}

#[test]
fn missing_paths_are_false_for_every_operator_but_exists_false() {
    let ops: Vec<(&str, Value)> = vec![
        ("eq", json!(1)),
        ("neq", json!(1)),
        ("gt", json!(1)),
        ("gte", json!(1)),
        ("lt", json!(1)),
        ("lte", json!(1)),
        ("in", json!([1])),
        ("not_in", json!([1])),
        ("matches", json!(".*")),
        ("exists", json!(true)),
        ("contains", json!("x")),
        ("starts_with", json!("x")),
        ("ends_with", json!("x")),
    ];
    let args = json!({"customer": "flat string", "items": []});
    for field in [
        "missing",
        "customer.tier",
        "items[0]",
        "customer[any]",
        "missing[all]",
    ] {
        for (op, value) in &ops {
            let cond = leaf(field, op, value.clone());
            assert!(!holds(cond.clone(), args.clone()), "{field} {op}");
            assert!(
                holds(json!({"not": cond}), args.clone()),
                "not {field} {op}"
            );
        }
        assert!(
            holds(leaf(field, "exists", json!(false)), args.clone()),
            "{field} exists false"
        );
    }
}

#[test]
fn tree_nodes() {
    let args = json!({"amount": 400, "currency": "EUR"});
    let big = leaf("amount", "gt", json!(250));
    let usd = leaf("currency", "eq", json!("USD"));
    let cases = vec![
        (json!({"all": [big.clone(), usd.clone()]}), false),
        (json!({"all": [big.clone(), {"not": usd.clone()}]}), true),
        (json!({"all": []}), true),
        (json!({"any": [usd.clone(), big.clone()]}), true),
        (json!({"any": [usd.clone()]}), false),
        (json!({"not": {"not": big.clone()}}), true),
        (
            json!({"any": [{"all": [usd.clone(), big.clone()]}, {"not": usd}]}),
            true,
        ),
    ];
    for (cond, want) in cases {
        assert_eq!(holds(cond.clone(), args.clone()), want, "{cond}");
    }
    // Absent, null and `{}` conditions match every call in scope.
    for conditions in [Value::Null, json!({})] {
        let set = compile(
            json!([{"name": "p", "scope": "agent", "action": "deny", "conditions": conditions}]),
        );
        assert_eq!(
            set.evaluate(&Request::new(ToolCtx::new(TOOL), &args))
                .kind(),
            DecisionKind::Deny
        );
    }
}

#[test]
fn array_paths() {
    let args = json!({
        "items": [{"sku": "A-1", "price": 10}, {"sku": "B-2", "price": 900}],
        "empty": [],
        "orders": [{"lines": [{"qty": 1}, {"qty": 50}]}, {"lines": [{"qty": 2}]}],
        "matrix": [[1, 2], [3, 4]]
    });
    let cases = vec![
        (leaf("items[0].sku", "eq", json!("a-1")), true),
        (leaf("items[1].price", "gt", json!(500)), true),
        (leaf("items[2].price", "exists", json!(false)), true),
        (leaf("items[any].price", "gt", json!(500)), true),
        (leaf("items[any].price", "gt", json!(1000)), false),
        (leaf("items[all].price", "gt", json!(5)), true),
        (leaf("items[all].price", "gt", json!(500)), false),
        (leaf("items[all].sku", "starts_with", json!("a")), false),
        (leaf("items[any].sku", "starts_with", json!("b")), true),
        (leaf("items[all].missing", "exists", json!(false)), true),
        (leaf("items[any].missing", "eq", json!(1)), false),
        (leaf("empty[any]", "exists", json!(true)), false),
        (leaf("empty[all]", "exists", json!(true)), false),
        (leaf("empty[all].x", "exists", json!(false)), false),
        (leaf("orders[any].lines[any].qty", "gte", json!(50)), true),
        (leaf("orders[all].lines[any].qty", "gte", json!(2)), true),
        (leaf("orders[all].lines[all].qty", "lt", json!(10)), false),
        (leaf("matrix[1][0]", "eq", json!(3)), true),
        (leaf("matrix[any][any]", "eq", json!(4)), true),
        (leaf("items.0.sku", "exists", json!(true)), false),
    ];
    for (cond, want) in cases {
        assert_eq!(holds(cond.clone(), args.clone()), want, "{cond}");
    }
    // Guard written as "deny unless every line is in stock": an empty list is denied.
    let guard = json!({"not": {"field": "lines[all].in_stock", "op": "eq", "value": true}});
    assert!(holds(guard.clone(), json!({"lines": []})));
    assert!(holds(guard.clone(), json!({})));
    assert!(holds(
        guard.clone(),
        json!({"lines": [{"in_stock": true}, {"in_stock": false}]})
    ));
    assert!(!holds(guard, json!({"lines": [{"in_stock": true}]})));
}

#[test]
fn context_fields_in_conditions() {
    let args = json!({"amount": 10});
    let meta = json!({"channel": "email"});
    let claims = json!({"role": "Ops", "groups": ["finance", "eu"]});
    let full = Request::new(
        ToolCtx {
            r#ref: TOOL,
            version: "1.2.0",
            side_effect_class: "non_idempotent_write",
            name: "issue_refund",
        },
        &args,
    )
    .with_agent(AgentCtx {
        namespace: "support",
        name: "refund-agent",
        version: "2.0.0",
    })
    .with_session(SessionCtx {
        id: "sess-42",
        metadata: Some(&meta),
    })
    .with_principal(&claims)
    .at(1_704_542_400); // 2024-01-06T12:00:00Z, Saturday
    let bare = Request::new(ToolCtx::new(TOOL), &args);
    let cases = vec![
        (leaf("phrony.tool.ref", "eq", json!(TOOL)), true, true),
        (
            leaf("phrony.tool.version", "starts_with", json!("1.")),
            true,
            false,
        ),
        (
            leaf(
                "phrony.tool.side_effect_class",
                "in",
                json!(["non_idempotent_write", "irreversible_action"]),
            ),
            true,
            false,
        ),
        (
            leaf("phrony.tool.name", "eq", json!("issue_refund")),
            true,
            false,
        ),
        (
            leaf(
                "phrony.agent.ref",
                "eq",
                json!("support/refund-agent@2.0.0"),
            ),
            true,
            false,
        ),
        (
            leaf("phrony.agent.ref", "matches", json!("^support/")),
            true,
            false,
        ),
        (
            leaf("phrony.agent.namespace", "eq", json!("SUPPORT")),
            true,
            false,
        ),
        (
            leaf("phrony.agent.version", "eq", json!("2.0.0")),
            true,
            false,
        ),
        (
            leaf("phrony.session.id", "eq", json!("sess-42")),
            true,
            false,
        ),
        (
            leaf("phrony.session.metadata.channel", "eq", json!("email")),
            true,
            false,
        ),
        (
            leaf("phrony.principal.role", "eq", json!("ops")),
            true,
            false,
        ),
        (
            leaf("phrony.principal.groups", "contains", json!("finance")),
            true,
            false,
        ),
        (
            leaf("phrony.principal.groups[any]", "eq", json!("eu")),
            true,
            false,
        ),
        (
            leaf("phrony.principal", "exists", json!(false)),
            false,
            true,
        ),
        (
            leaf("phrony.time.unix", "gte", json!(1_704_542_400)),
            true,
            false,
        ),
        (leaf("phrony.time.hour", "eq", json!(12)), true, false),
        (
            leaf("phrony.time.weekday", "in", json!(["saturday", "sunday"])),
            true,
            false,
        ),
        (
            leaf("phrony.time.weekday", "neq", json!("monday")),
            true,
            false,
        ),
        (leaf("phrony.agent.name", "neq", json!("x")), true, false),
    ];
    for (cond, want_full, want_bare) in cases {
        assert_eq!(holds_with(&cond, &full), want_full, "full: {cond}");
        assert_eq!(holds_with(&cond, &bare), want_bare, "bare: {cond}");
    }
}

fn req(args: &Value) -> Request<'_> {
    Request::new(ToolCtx::new(TOOL), args)
}

fn refund_set() -> PolicySet {
    compile(json!([
        {
            "namespace": "payments", "name": "refund-approval-boundary", "version": "1.0.0",
            "scope": "tool:payments.issue-refund", "action": "require_approval",
            "conditions": {"field": "amount", "op": "gt", "value": 250},
            "approvals_required": 1, "reason": "Refund amount above delegated limit.",
            "on_reject": "return_to_agent"
        },
        {
            "namespace": "payments", "name": "refund-hard-limit", "version": "1.0.0",
            "scope": "tool:payments.issue-refund", "action": "deny",
            "conditions": {"field": "amount", "op": "gt", "value": 5000},
            "reason": "Refund amount exceeds the absolute ceiling for agent-initiated refunds."
        }
    ]))
}

#[test]
fn refund_tutorial() {
    let set = refund_set();
    let cases = [
        (100, DecisionKind::Allow, None),
        (250, DecisionKind::Allow, None),
        (
            400,
            DecisionKind::RequireApproval,
            Some("payments/refund-approval-boundary@1.0.0"),
        ),
        (
            5000,
            DecisionKind::RequireApproval,
            Some("payments/refund-approval-boundary@1.0.0"),
        ),
        (
            14000,
            DecisionKind::Deny,
            Some("payments/refund-hard-limit@1.0.0"),
        ),
    ];
    for (amount, kind, policy) in cases {
        let args = json!({"order_id": "ORD-1", "amount": amount});
        let d = set.evaluate(&req(&args));
        assert_eq!(d.kind(), kind, "{amount}");
        assert_eq!(
            d.policy().map(|p| p.id().to_string()).as_deref(),
            policy,
            "{amount}"
        );
    }
    let args = json!({"amount": 14000});
    assert_eq!(
        set.evaluate(&req(&args)).reason(),
        Some("Refund amount exceeds the absolute ceiling for agent-initiated refunds.")
    );
    // Other tools are out of scope.
    let other = Request::new(ToolCtx::new("orders.lookup-order"), &args);
    assert!(set.evaluate(&other).is_allow());
}

#[test]
fn precedence_is_independent_of_order() {
    let approve =
        json!({"name": "approve", "scope": "agent", "action": "require_approval", "reason": "r"});
    let deny = json!({"name": "deny", "scope": "agent", "action": "block"});
    let allow = json!({"name": "allow", "scope": "agent", "action": "allow"});
    let args = json!({});
    for order in [
        json!([approve, deny, allow]),
        json!([deny, approve, allow]),
        json!([allow, approve, deny]),
    ] {
        let set = compile(order);
        let d = set.evaluate(&req(&args));
        assert_eq!(d.kind(), DecisionKind::Deny);
        assert_eq!(d.policy().map(|p| p.name()), Some("deny"));
        // No reason: the default message names the policy.
        assert_eq!(d.reason(), Some("tool call blocked by policy deny"));
    }
    let set = compile(json!([allow, approve]));
    assert_eq!(
        set.evaluate(&req(&args)).kind(),
        DecisionKind::RequireApproval
    );
    let set = compile(json!([allow]));
    assert!(set.evaluate(&req(&args)).is_allow());
    assert!(PolicySet::default().evaluate(&req(&args)).is_allow());

    // Several denials: the first in order supplies the message.
    let set = compile(json!([
        {"name": "d1", "scope": "agent", "action": "deny", "reason": "first"},
        {"name": "d2", "scope": "agent", "action": "deny", "reason": "second"}
    ]));
    assert_eq!(set.evaluate(&req(&args)).reason(), Some("first"));
}

#[test]
fn approval_candidate_selection() {
    let args = json!({});
    let route = |role: &str| json!({"phrony.com/approver_role": role});
    let cases = vec![
        // The first candidate wins when it has a reason and a route.
        (
            json!([
                {"name": "a", "scope": "agent", "action": "require_approval", "reason": "ra", "runtime": route("ops")},
                {"name": "b", "scope": "agent", "action": "escalate", "reason": "rb", "runtime": route("fin")}
            ]),
            "a",
        ),
        // A later one with a reason replaces one without.
        (
            json!([
                {"name": "a", "scope": "agent", "action": "require_approval", "runtime": route("ops")},
                {"name": "b", "scope": "agent", "action": "require_approval", "reason": "rb", "runtime": route("fin")}
            ]),
            "b",
        ),
        // A later one with a route replaces one without.
        (
            json!([
                {"name": "a", "scope": "agent", "action": "require_approval", "reason": "ra"},
                {"name": "b", "scope": "agent", "action": "escalate", "runtime": {"approver_role": "fin"}}
            ]),
            "b",
        ),
        // Replacement chains: c brings a route b lacks.
        (
            json!([
                {"name": "a", "scope": "agent", "action": "require_approval"},
                {"name": "b", "scope": "agent", "action": "require_approval", "reason": "rb"},
                {"name": "c", "scope": "agent", "action": "require_approval", "runtime": route("x")}
            ]),
            "c",
        ),
        // Neither brings anything new: the first stays.
        (
            json!([
                {"name": "a", "scope": "agent", "action": "require_approval"},
                {"name": "b", "scope": "agent", "action": "require_approval"}
            ]),
            "a",
        ),
        // The stricter quorum wins, even over a reason and a route.
        (
            json!([
                {"name": "a", "scope": "agent", "action": "require_approval", "reason": "ra", "runtime": route("ops")},
                {"name": "b", "scope": "agent", "action": "require_approval", "approvals_required": 3}
            ]),
            "b",
        ),
        // A weaker quorum never replaces a stricter one.
        (
            json!([
                {"name": "a", "scope": "agent", "action": "require_approval", "approvals_required": 2},
                {"name": "b", "scope": "agent", "action": "require_approval", "reason": "rb", "runtime": route("fin")}
            ]),
            "a",
        ),
    ];
    for (policies, want) in cases {
        let set = compile(policies.clone());
        let d = set.evaluate(&req(&args));
        assert_eq!(d.policy().map(|p| p.name()), Some(want), "{policies}");
    }
}

#[test]
fn approval_fields_come_from_the_chosen_policy() {
    let set = compile(json!([{
        "namespace": "ops", "name": "big", "version": "2.1.0", "scope": "agent",
        "action": "escalate", "reason": "needs two", "approvals_required": 2,
        "on_reject": "fail", "on_modify": "revalidate", "comprehension_required": true,
        "timeout": {"after_minutes": 30, "default": "escalate"}, "authority_ref": "cfo",
        "runtime": {"phrony.com/approver_role": "finance", "approver_role": "ignored", "x": 1}
    }]));
    let args = json!({});
    let d = set.evaluate(&req(&args));
    let p = d.policy().expect("policy");
    assert_eq!(d.kind(), DecisionKind::RequireApproval);
    assert_eq!(p.action(), Action::Escalate);
    assert_eq!(p.approvals_required(), 2);
    assert_eq!(p.on_reject(), OnReject::Fail);
    assert_eq!(p.on_modify(), OnModify::Revalidate);
    assert!(p.comprehension_required());
    let t = p.timeout().expect("timeout");
    assert_eq!((t.after_minutes, t.default), (30, TimeoutDefault::Escalate));
    assert_eq!(p.authority_ref(), Some("cfo"));
    assert_eq!(p.route(), Some("finance"));
    assert_eq!(p.runtime().and_then(|r| r.get("x")), Some(&json!(1)));
    assert_eq!(
        serde_json::to_value(&d).unwrap(),
        json!({
            "decision": "require_approval", "policy": "ops/big@2.1.0", "reason": "needs two",
            "action": "escalate", "approvals_required": 2, "on_reject": "fail",
            "on_modify": "revalidate", "comprehension_required": true,
            "timeout": {"after_minutes": 30, "default": "escalate"}, "authority_ref": "cfo",
            "route": "finance",
            "runtime": {"phrony.com/approver_role": "finance", "approver_role": "ignored", "x": 1}
        })
    );
    // Defaults.
    let set = compile(
        json!([{"name": "plain", "scope": "agent", "action": "require_approval",
                              "timeout": {"after_minutes": 5}}]),
    );
    let p = set.get("plain").expect("plain");
    assert_eq!(p.approvals_required(), 1);
    assert_eq!(p.on_reject(), OnReject::ReturnToAgent);
    assert_eq!(p.on_modify(), OnModify::Unchecked);
    assert_eq!(p.timeout().map(|t| t.default), Some(TimeoutDefault::Deny));
    assert_eq!(p.route(), None);
}

#[test]
fn scopes() {
    let args = json!({});
    let cases = [
        ("", TOOL, true),
        ("agent", TOOL, true),
        ("agent", "anything.else", true),
        ("tool:payments.issue-refund", TOOL, true),
        (
            "tool:payments.issue-refund",
            "payments.issue-refund-v2",
            false,
        ),
        ("tool:payments.issue-refund", "orders.lookup-order", false),
    ];
    for (scope, tool, want) in cases {
        let set = compile(json!([{"name": "p", "scope": scope, "action": "deny",
                                  "conditions": {"field": "x", "op": "exists", "value": false}}]));
        let d = set.evaluate(&Request::new(ToolCtx::new(tool), &args));
        assert_eq!(d.kind() == DecisionKind::Deny, want, "{scope:?} on {tool}");
        assert_eq!(set.policies()[0].applies_to(tool), want);
    }
}

#[test]
fn allow_lists() {
    let currency = json!({"name": "payment-currency-allow", "scope": "agent", "action": "allow", "allow": ["USD", "cad"]});
    let cases: Vec<(Value, Value, Option<&str>)> = vec![
        (
            currency.clone(),
            json!({"currency": "usd", "amount": 5}),
            None,
        ),
        (currency.clone(), json!({"currency": "CAD"}), None),
        (
            currency.clone(),
            json!({"currency": "EUR", "amount": 5}),
            Some("value EUR is not allowed by policy payment-currency-allow"),
        ),
        // Heuristic key order: `queue` before `currency`.
        (
            currency.clone(),
            json!({"currency": "USD", "queue": "EUR"}),
            Some("value EUR is not allowed by policy payment-currency-allow"),
        ),
        // A preferred key holding a non-scalar is skipped.
        (
            currency.clone(),
            json!({"value": {"x": 1}, "currency": "USD"}),
            None,
        ),
        // No preferred key: the string/number field whose key sorts first.
        (
            currency.clone(),
            json!({"zeta": "EUR", "alpha": "usd", "flag": true}),
            None,
        ),
        (
            currency.clone(),
            json!({"zeta": "USD", "beta": 7}),
            Some("value 7 is not allowed by policy payment-currency-allow"),
        ),
        (
            currency.clone(),
            json!({"flag": true, "items": []}),
            Some("tool arguments do not include a value to check against the allow list"),
        ),
        (
            currency.clone(),
            json!("USD"),
            Some("tool arguments do not include a value to check against the allow list"),
        ),
        // Numbers compare with eq semantics.
        (
            json!({"name": "n", "scope": "agent", "action": "allow", "allow": ["100", "200"]}),
            json!({"id": 100.0}),
            None,
        ),
        // allow_field checks exactly that field.
        (
            json!({"name": "f", "scope": "agent", "action": "allow", "allow": ["USD"], "allow_field": "payment.currency"}),
            json!({"currency": "EUR", "payment": {"currency": "usd"}}),
            None,
        ),
        (
            json!({"name": "f", "scope": "agent", "action": "allow", "allow": ["USD"], "allow_field": "payment.currency"}),
            json!({"currency": "USD", "payment": {"currency": "GBP"}}),
            Some("value GBP is not allowed by policy f"),
        ),
        (
            json!({"name": "f", "scope": "agent", "action": "allow", "allow": ["USD"], "allow_field": "payment.currency"}),
            json!({"currency": "USD"}),
            Some("no value at `payment.currency` to check against the allow list of policy f"),
        ),
        (
            json!({"name": "f", "scope": "agent", "action": "allow", "allow": ["USD"], "allow_field": "payment.currency"}),
            json!({"payment": {"currency": ["USD"]}}),
            Some("no value at `payment.currency` to check against the allow list of policy f"),
        ),
        // [all]: every element must be listed; the first offender is reported.
        (
            json!({"name": "skus", "scope": "agent", "action": "allow", "allow": ["A", "B"], "allow_field": "items[all].sku"}),
            json!({"items": [{"sku": "a"}, {"sku": "b"}]}),
            None,
        ),
        (
            json!({"name": "skus", "scope": "agent", "action": "allow", "allow": ["A", "B"], "allow_field": "items[all].sku"}),
            json!({"items": [{"sku": "a"}, {"sku": "Z"}, {"sku": "Y"}]}),
            Some("value Z is not allowed by policy skus"),
        ),
        (
            json!({"name": "skus", "scope": "agent", "action": "allow", "allow": ["A", "B"], "allow_field": "items[all].sku"}),
            json!({"items": []}),
            Some("no value at `items[all].sku` to check against the allow list of policy skus"),
        ),
        // Context fields can be allow-listed.
        (
            json!({"name": "roles", "scope": "agent", "action": "allow", "allow": ["ops"], "allow_field": "phrony.tool.ref"}),
            json!({}),
            Some("value payments.issue-refund is not allowed by policy roles"),
        ),
        // Conditions gate the check.
        (
            json!({"name": "gated", "scope": "agent", "action": "allow", "allow": ["USD"],
                "conditions": {"field": "amount", "op": "gt", "value": 1000}}),
            json!({"currency": "EUR", "amount": 10}),
            None,
        ),
        (
            json!({"name": "gated", "scope": "agent", "action": "allow", "allow": ["USD"],
                "conditions": {"field": "amount", "op": "gt", "value": 1000}}),
            json!({"currency": "EUR", "amount": 5000}),
            Some("value EUR is not allowed by policy gated"),
        ),
    ];
    for (policy, args, want) in cases {
        let set = compile(json!([policy]));
        let d = set.evaluate(&req(&args));
        assert_eq!(d.reason(), want, "{policy} on {args}");
        assert_eq!(d.kind() == DecisionKind::Deny, want.is_some());
    }
    // An allow-list violation beats an approval, whatever the order.
    let set = compile(json!([
        {"name": "approve", "scope": "agent", "action": "require_approval"},
        currency
    ]));
    let args = json!({"currency": "EUR"});
    assert_eq!(set.evaluate(&req(&args)).kind(), DecisionKind::Deny);
}

#[test]
fn dispatch_failure_triggers() {
    let set = compile(json!([
        {"name": "a-deny-on-trigger", "scope": "agent", "action": "deny",
         "conditions": {"field": "phrony.dispatch.trigger", "value": "dispatch:no_handler"}},
        {"name": "b-unconditional", "scope": "agent", "action": "require_approval"},
        {"name": "b-amount-only", "scope": "agent", "action": "require_approval",
         "reason": "Refund amount above delegated limit.",
         "conditions": {"field": "amount", "op": "gt", "value": 250}},
        {"name": "c-other-tool", "scope": "tool:other.tool", "action": "escalate",
         "conditions": {"field": "phrony.dispatch.trigger", "op": "eq", "value": "dispatch:no_handler"}},
        {"name": "d-no-handler", "scope": "agent", "action": "escalate", "reason": "No handler.",
         "runtime": {"phrony.com/approver_role": "ops"},
         "conditions": {"field": "phrony.dispatch.trigger", "op": "eq", "value": "DISPATCH:NO_HANDLER"}},
        {"name": "e-indeterminate", "scope": "agent", "action": "require_approval",
         "conditions": {"all": [
            {"field": "dispatch.outcome", "op": "==", "value": "indeterminate"},
            {"field": "amount", "op": "gt", "value": 100}]}},
        {"name": "f-not-capacity", "scope": "agent", "action": "require_approval",
         "conditions": {"not": {"field": "phrony.dispatch.trigger", "op": "eq", "value": "dispatch:capacity_exhausted"}}},
        {"name": "g-limit", "scope": "agent", "action": "escalate",
         "conditions": {"field": "dispatch.outcome", "op": "eq", "value": "limit:escalate"}}
    ]));
    let big = json!({"amount": 500});
    let small = json!({"amount": 5});
    let name = |args: &Value, t| {
        set.evaluate_failure(&req(args), t)
            .map(|p| p.name().to_owned())
    };
    assert_eq!(
        name(&big, Trigger::NoHandler).as_deref(),
        Some("d-no-handler")
    );
    assert_eq!(
        name(&big, Trigger::Indeterminate).as_deref(),
        Some("e-indeterminate")
    );
    // The amount condition fails, so the next matching policy (`not capacity`) applies.
    assert_eq!(
        name(&small, Trigger::Indeterminate).as_deref(),
        Some("f-not-capacity")
    );
    // `b-amount-only` holds for `big` but never reads the trigger: it decided the call before
    // dispatch and does not ask the approvers again when the dispatch fails.
    assert_eq!(name(&big, Trigger::CapacityExhausted), None);
    let amount_only = set
        .policies()
        .iter()
        .find(|p| p.name() == "b-amount-only")
        .expect("policy");
    assert!(amount_only.has_conditions() && !amount_only.reads_trigger());
    assert_eq!(
        name(&big, Trigger::LimitEscalate).as_deref(),
        Some("f-not-capacity")
    );
    let p = set
        .evaluate_failure(&req(&big), Trigger::NoHandler)
        .expect("policy");
    assert_eq!((p.reason(), p.route()), (Some("No handler."), Some("ops")));
    // On the other tool, `c` comes first.
    let other = Request::new(ToolCtx::new("other.tool"), &big);
    assert_eq!(
        set.evaluate_failure(&other, Trigger::NoHandler)
            .map(|p| p.name()),
        Some("c-other-tool")
    );

    // Before dispatch trigger leaves are false for eq and neq, so only `not trigger` matches.
    let pre = compile(json!([
        {"name": "eq", "scope": "agent", "action": "deny",
         "conditions": {"field": "phrony.dispatch.trigger", "op": "eq", "value": "dispatch:no_handler"}},
        {"name": "neq", "scope": "agent", "action": "deny",
         "conditions": {"field": "phrony.dispatch.trigger", "op": "neq", "value": "dispatch:no_handler"}},
        {"name": "not", "scope": "agent", "action": "require_approval",
         "conditions": {"not": {"field": "phrony.dispatch.trigger", "op": "eq", "value": "dispatch:no_handler"}}}
    ]));
    let d = pre.evaluate(&req(&big));
    assert_eq!(d.kind(), DecisionKind::RequireApproval);
    assert_eq!(d.policy().map(|p| p.name()), Some("not"));
    // neq holds for another trigger.
    assert_eq!(
        pre.evaluate_failure(&req(&big), Trigger::LeaseExpired)
            .map(|p| p.name()),
        Some("not")
    );
    let neq = compile(
        json!([{"name": "neq", "scope": "agent", "action": "escalate",
        "conditions": {"field": "phrony.dispatch.trigger", "op": "!=", "value": "dispatch:no_handler"}}]),
    );
    assert!(
        neq.evaluate_failure(&req(&big), Trigger::NoHandler)
            .is_none()
    );
    assert!(
        neq.evaluate_failure(&req(&big), Trigger::Indeterminate)
            .is_some()
    );
}

#[test]
fn trigger_wire_forms() {
    for t in Trigger::ALL {
        assert_eq!(t.as_str().parse::<Trigger>(), Ok(t));
        assert_eq!(t.to_string(), t.as_str());
    }
    assert_eq!(
        " Dispatch:Indeterminate ".parse::<Trigger>(),
        Ok(Trigger::Indeterminate)
    );
    assert!("dispatch:nope".parse::<Trigger>().is_err());
}

/// Compiles one policy and returns its errors as `(path, variant name)`.
/// The name of the policy that hides the tool `tool` for a principal, session metadata and time.
fn hidden_by(
    set: &PolicySet,
    tool: &str,
    principal: &Value,
    metadata: &Value,
    now: i64,
) -> Option<String> {
    let args = Value::Null;
    let req = Request::new(ToolCtx::new(tool), &args)
        .with_agent(AgentCtx {
            namespace: "support",
            name: "refund-desk",
            version: "1.0.0",
        })
        .with_session(SessionCtx {
            id: "run_1",
            metadata: Some(metadata),
        })
        .with_principal(principal)
        .at(now);
    set.hidden_tool(&req).map(|p| p.name().to_owned())
}

#[test]
fn tools_denied_whatever_the_args_are_hidden() {
    let set = compile(json!([
        {"name": "a-amount-cap", "scope": "tool:payments.issue-refund", "action": "deny",
         "conditions": {"field": "amount", "op": "gt", "value": 5000}},
        {"name": "b-approval", "scope": "tool:payments.issue-refund", "action": "require_approval",
         "conditions": {"field": "phrony.principal.role", "op": "eq", "value": "intern"}},
        {"name": "c-interns", "scope": "tool:payments.issue-refund", "action": "deny",
         "conditions": {"all": [
            {"field": "phrony.principal.role", "op": "eq", "value": "viewer"},
            {"not": {"field": "phrony.dispatch.trigger", "op": "eq", "value": "dispatch:no_handler"}}
         ]}},
        {"name": "d-sandbox", "scope": "tool:payments.issue-refund", "action": "deny",
         "conditions": {"field": "phrony.session.metadata.env", "op": "eq", "value": "sandbox"}},
        {"name": "e-night", "scope": "agent", "action": "deny",
         "conditions": {"any": [
            {"field": "phrony.time.hour", "op": "lt", "value": 6},
            {"field": "phrony.time.hour", "op": "gte", "value": 22}
         ]}},
        {"name": "f-mixed", "scope": "tool:crm.update", "action": "deny",
         "conditions": {"all": [
            {"field": "phrony.principal.role", "op": "eq", "value": "viewer"},
            {"field": "note", "op": "exists", "value": true}
         ]}},
        {"name": "g-roles", "scope": "tool:crm.export", "action": "allow",
         "allow": ["ops", "admin"], "allow_field": "phrony.principal.role"},
        {"name": "h-args-list", "scope": "tool:crm.lookup", "action": "allow",
         "allow": ["USD"], "allow_field": "currency"},
        {"name": "i-always", "scope": "tool:admin.wipe", "action": "block"}
    ]));
    let noon = 1_733_400_000 - 1_733_400_000 % 86_400 + 12 * 3_600;
    let night = noon + 11 * 3_600;
    let ops = json!({"role": "ops"});
    let viewer = json!({"role": "viewer"});
    let intern = json!({"role": "intern"});
    let prod = json!({"env": "prod"});
    let sandbox = json!({"env": "sandbox"});
    let refund = "payments.issue-refund";
    // The same tool: hidden for one principal and not for another; an argument-dependent deny
    // and an approval never hide.
    assert_eq!(hidden_by(&set, refund, &ops, &prod, noon), None);
    assert_eq!(hidden_by(&set, refund, &intern, &prod, noon), None);
    assert_eq!(
        hidden_by(&set, refund, &viewer, &prod, noon).as_deref(),
        Some("c-interns")
    );
    // Session metadata, then the time (an agent-wide deny hides every tool).
    assert_eq!(
        hidden_by(&set, refund, &ops, &sandbox, noon).as_deref(),
        Some("d-sandbox")
    );
    assert_eq!(
        hidden_by(&set, refund, &ops, &prod, night).as_deref(),
        Some("e-night")
    );
    assert_eq!(
        hidden_by(&set, "crm.lookup", &ops, &prod, night).as_deref(),
        Some("e-night")
    );
    // A deny that also reads an argument does not hide.
    assert_eq!(hidden_by(&set, "crm.update", &viewer, &prod, noon), None);
    // An allow list on a context field hides from principals it does not list; one on the
    // arguments never hides.
    assert_eq!(hidden_by(&set, "crm.export", &ops, &prod, noon), None);
    assert_eq!(
        hidden_by(&set, "crm.export", &viewer, &prod, noon).as_deref(),
        Some("g-roles")
    );
    assert_eq!(hidden_by(&set, "crm.lookup", &viewer, &prod, noon), None);
    // No conditions: always hidden; without a principal an allow list on it hides too.
    assert_eq!(
        hidden_by(&set, "admin.wipe", &ops, &prod, noon).as_deref(),
        Some("i-always")
    );
    let args = Value::Null;
    let bare = Request::new(ToolCtx::new("crm.export"), &args);
    assert_eq!(
        set.hidden_tool(&bare)
            .map(|p| p.name().to_owned())
            .as_deref(),
        Some("g-roles")
    );
    // Whenever a tool is hidden, the call is denied whatever its arguments.
    for args in [
        json!({}),
        json!({"amount": 1}),
        json!({"amount": 9000, "note": "x"}),
        Value::Null,
    ] {
        let req = Request::new(ToolCtx::new(refund), &args)
            .with_principal(&viewer)
            .at(noon);
        assert_eq!(set.evaluate(&req).kind(), DecisionKind::Deny, "{args}");
    }
    // A visible tool is still decided by its arguments.
    for (args, kind) in [
        (json!({"amount": 1}), DecisionKind::Allow),
        (json!({"amount": 9000}), DecisionKind::Deny),
    ] {
        let req = Request::new(ToolCtx::new(refund), &args)
            .with_principal(&ops)
            .at(noon);
        assert_eq!(set.evaluate(&req).kind(), kind, "{args}");
    }
    // An empty set hides nothing.
    let empty = PolicySet::default();
    assert_eq!(hidden_by(&empty, refund, &viewer, &sandbox, night), None);
}

fn errors_of(policy: Value) -> Vec<(String, String)> {
    compile_err(json!([policy]))
        .into_iter()
        .map(|e| {
            let kind = format!("{:?}", e.kind);
            let variant = kind
                .split([' ', '{', '('])
                .next()
                .unwrap_or_default()
                .to_owned();
            (e.path, variant)
        })
        .collect()
}

#[test]
fn compile_errors_name_the_path() {
    let base = |extra: Value| {
        let mut p = json!({"name": "p", "scope": "agent", "action": "deny"});
        for (k, v) in extra.as_object().expect("map") {
            p[k] = v.clone();
        }
        p
    };
    let cond = |c: Value| base(json!({"conditions": c}));
    let cases: Vec<(Value, Vec<(&str, &str)>)> = vec![
        (base(json!({"name": ""})), vec![("name", "MissingName")]),
        (
            base(json!({"action": ""})),
            vec![("action", "MissingAction")],
        ),
        (
            base(json!({"action": "requires_approval"})),
            vec![("action", "UnknownAction")],
        ),
        (
            base(json!({"action": "Deny"})),
            vec![("action", "UnknownAction")],
        ),
        (
            base(json!({"scope": "tools:x.y"})),
            vec![("scope", "UnknownScope")],
        ),
        (
            base(json!({"scope": "tool:"})),
            vec![("scope", "UnknownScope")],
        ),
        (
            base(json!({"scope": "tool: x.y"})),
            vec![("scope", "UnknownScope")],
        ),
        (
            json!({"name": "p", "action": "deny"}),
            vec![("scope", "NoTarget")],
        ),
        (
            json!({"name": "p", "action": "deny", "conditions": {}}),
            vec![("scope", "NoTarget")],
        ),
        (
            base(json!({"on_reject": "retry"})),
            vec![("on_reject", "UnknownOnReject")],
        ),
        (
            base(json!({"on_modify": "dispatch"})),
            vec![("on_modify", "UnknownOnModify")],
        ),
        (
            base(json!({"timeout": {"after_minutes": 10, "default": "approve"}})),
            vec![("timeout.default", "UnknownTimeoutDefault")],
        ),
        (
            base(json!({"timeout": {"default": "deny"}})),
            vec![("timeout.after_minutes", "InvalidTimeoutMinutes")],
        ),
        (
            base(json!({"approvals_required": 0})),
            vec![("approvals_required", "InvalidApprovals")],
        ),
        (
            base(json!({"approvals_required": -2})),
            vec![("approvals_required", "InvalidApprovals")],
        ),
        (
            base(json!({"approvals_required": 5_000_000_000_i64})),
            vec![("approvals_required", "InvalidApprovals")],
        ),
        (
            base(json!({"runtime": {"phrony.com/approver_role": 3}})),
            vec![("runtime.phrony.com/approver_role", "RouteNotString")],
        ),
        (
            base(json!({"allow": ["USD"]})),
            vec![("allow", "AllowOnOtherAction")],
        ),
        (
            base(json!({"action": "allow", "allow": ["USD", " "]})),
            vec![("allow[1]", "EmptyAllowEntry")],
        ),
        (
            base(json!({"action": "allow", "allow_field": "currency"})),
            vec![("allow_field", "AllowFieldWithoutAllow")],
        ),
        (
            base(json!({"action": "allow", "allow": ["A"], "allow_field": "items[any].sku"})),
            vec![("allow_field", "AllowFieldAny")],
        ),
        (
            base(json!({"action": "allow", "allow": ["A"], "allow_field": "items[x]"})),
            vec![("allow_field", "BadPath")],
        ),
        (
            base(json!({"action": "allow", "allow": ["A"], "allow_field": "phrony.user"})),
            vec![("allow_field", "UnknownContextField")],
        ),
        (
            base(
                json!({"action": "allow", "allow": ["A"], "allow_field": "phrony.dispatch.trigger"}),
            ),
            vec![("allow_field", "BadPath")],
        ),
        (
            cond(json!("amount > 5")),
            vec![("conditions", "NodeNotMap")],
        ),
        (
            cond(json!([{"field": "a"}])),
            vec![("conditions", "NodeNotMap")],
        ),
        (
            cond(json!({"fields": "amount", "op": "gt", "value": 5})),
            vec![
                ("conditions.fields", "UnknownKey"),
                ("conditions", "EmptyNode"),
            ],
        ),
        (
            cond(json!({"field": "a", "value": 1, "any": []})),
            vec![("conditions", "AmbiguousNode")],
        ),
        (
            cond(json!({"all": [{"field": "a", "value": 1}], "op": "eq"})),
            vec![("conditions.op", "UnknownKey")],
        ),
        (
            cond(json!({"field": "a", "value": 1, "comment": "x"})),
            vec![("conditions.comment", "UnknownKey")],
        ),
        (
            cond(json!({"all": {"field": "a", "value": 1}})),
            vec![("conditions.all", "NotAList")],
        ),
        (
            cond(json!({"any": []})),
            vec![("conditions.any", "EmptyAny")],
        ),
        (
            cond(json!({"not": [1]})),
            vec![("conditions.not", "NodeNotMap")],
        ),
        (
            cond(
                json!({"all": [{"field": "a", "value": 1}, {"field": "b", "op": "gt", "value": "x"}]}),
            ),
            vec![("conditions.all[1].value", "ValueNotNumeric")],
        ),
        (
            cond(
                json!({"all": [{"field": "a", "value": 1}, {"field": "b", "op": "like", "value": 1}]}),
            ),
            vec![("conditions.all[1].op", "UnknownOp")],
        ),
        (
            cond(json!({"any": [{"not": {"field": "a", "op": 3, "value": 1}}]})),
            vec![("conditions.any[0].not.op", "OpNotString")],
        ),
        (
            cond(json!({"field": "", "value": 1})),
            vec![("conditions.field", "FieldNotString")],
        ),
        (
            cond(json!({"field": 5, "value": 1})),
            vec![("conditions.field", "FieldNotString")],
        ),
        (
            cond(json!({"field": "items[", "value": 1})),
            vec![("conditions.field", "BadPath")],
        ),
        (
            cond(json!({"field": "phrony.user.id", "value": 1})),
            vec![("conditions.field", "UnknownContextField")],
        ),
        (
            cond(json!({"field": "a", "op": "eq"})),
            vec![("conditions.value", "MissingValue")],
        ),
        (
            cond(json!({"field": "a", "op": "eq", "value": ["x", "y"]})),
            vec![("conditions.value", "ValueNotScalar")],
        ),
        (
            cond(json!({"field": "a", "op": "in", "value": "x"})),
            vec![("conditions.value", "ValueNotList")],
        ),
        (
            cond(json!({"field": "a", "op": "not_in", "value": []})),
            vec![("conditions.value", "EmptyList")],
        ),
        (
            cond(json!({"field": "a", "op": "in", "value": [1, {"x": 1}]})),
            vec![("conditions.value[1]", "ValueNotScalar")],
        ),
        (
            cond(json!({"field": "a", "op": "lte", "value": true})),
            vec![("conditions.value", "ValueNotNumeric")],
        ),
        (
            cond(json!({"field": "a", "op": "matches", "value": "(unclosed"})),
            vec![("conditions.value", "InvalidRegex")],
        ),
        (
            cond(json!({"field": "a", "op": "matches", "value": 5})),
            vec![("conditions.value", "ValueNotString")],
        ),
        (
            cond(json!({"field": "a", "op": "exists", "value": "yes"})),
            vec![("conditions.value", "ValueNotBool")],
        ),
        (
            cond(json!({"field": "a", "op": "contains", "value": " "})),
            vec![("conditions.value", "EmptyNeedle")],
        ),
        (
            cond(json!({"field": "a", "op": "starts_with", "value": 1})),
            vec![("conditions.value", "ValueNotString")],
        ),
        (
            cond(json!({"field": "a", "op": "ends_with", "value": ""})),
            vec![("conditions.value", "EmptyNeedle")],
        ),
        (
            cond(
                json!({"field": "phrony.dispatch.trigger", "op": "in", "value": ["dispatch:no_handler"]}),
            ),
            vec![("conditions.op", "TriggerOp")],
        ),
        (
            cond(json!({"field": "dispatch.outcome", "op": "eq", "value": "timeout"})),
            vec![("conditions.value", "UnknownTrigger")],
        ),
        (
            cond(json!({"field": "phrony.dispatch.trigger", "op": "eq", "value": 1})),
            vec![("conditions.value", "ValueNotString")],
        ),
        // A bad field still has its value checked, so both problems show at once.
        (
            cond(json!({"field": "phrony.nope", "op": "gt", "value": "x"})),
            vec![
                ("conditions.field", "UnknownContextField"),
                ("conditions.value", "ValueNotNumeric"),
            ],
        ),
        // Several problems in one policy, in field order.
        (
            json!({"name": "p", "scope": "team", "action": "approve", "on_reject": "x",
                   "conditions": {"any": [{"field": "a", "op": "gt"}, {"fields": "b"}]}}),
            vec![
                ("scope", "UnknownScope"),
                ("action", "UnknownAction"),
                ("conditions.any[0].value", "MissingValue"),
                ("conditions.any[1].fields", "UnknownKey"),
                ("conditions.any[1]", "EmptyNode"),
                ("on_reject", "UnknownOnReject"),
            ],
        ),
    ];
    for (policy, want) in cases {
        let got = errors_of(policy.clone());
        let want: Vec<(String, String)> = want
            .into_iter()
            .map(|(p, k)| (p.to_owned(), k.to_owned()))
            .collect();
        assert_eq!(got, want, "{policy}");
    }
}

#[test]
fn all_policies_are_checked_and_duplicates_rejected() {
    let errs = compile_err(json!([
        {"name": "ok", "scope": "agent", "action": "deny"},
        {"name": "bad-1", "scope": "agent", "action": "nope"},
        {"name": "ok", "scope": "agent", "action": "deny"},
        {"name": "bad-2", "scope": "agent", "action": "deny", "conditions": {"field": "a", "op": "~"}}
    ]));
    let got: Vec<(String, usize, String)> = errs
        .errors()
        .iter()
        .map(|e| (e.policy.clone(), e.index, e.path.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("bad-1".to_owned(), 1, "action".to_owned()),
            ("ok".to_owned(), 2, "name".to_owned()),
            ("bad-2".to_owned(), 3, "conditions.op".to_owned()),
        ]
    );
    let text = errs.to_string();
    assert!(text.starts_with("3 invalid policy fields"), "{text}");
    assert!(
        text.contains(
            "policy `ok`: name: duplicate policy name; the policy at index 0 has the same name"
        ),
        "{text}"
    );
    assert!(
        text.contains("policy `bad-1`: action: unknown decision type `nope`"),
        "{text}"
    );
}

#[test]
fn definitions_reject_unknown_keys() {
    let err = serde_json::from_value::<PolicyDef>(json!({"name": "p", "condition": {}}))
        .expect_err("unknown key");
    assert!(
        err.to_string().contains("unknown field `condition`"),
        "{err}"
    );
    let err = serde_json::from_value::<PolicyDef>(
        json!({"name": "p", "timeout": {"after_minutes": 1, "defualt": "deny"}}),
    )
    .expect_err("unknown key");
    assert!(err.to_string().contains("defualt"), "{err}");
    // Round trip keeps the compiled snapshot names.
    let def: PolicyDef = serde_json::from_value(json!({
        "name": "p", "scope": "agent", "action": "require_approval", "approvals_required": 2,
        "namespace": "ns", "version": "1.0.0"
    }))
    .expect("def");
    assert_eq!(
        serde_json::to_value(&def).expect("json"),
        json!({"name": "p", "scope": "agent", "action": "require_approval",
               "approvals_required": 2, "namespace": "ns", "version": "1.0.0"})
    );
    assert_eq!(def.id().to_string(), "ns/p@1.0.0");
}

#[test]
fn policy_ids() {
    let id = |ns: &str, name: &str, v: &str| PolicyId {
        namespace: ns.into(),
        name: name.into(),
        version: v.into(),
    };
    assert_eq!(
        id("payments", "refund-hard-limit", "1.0.0").to_string(),
        "payments/refund-hard-limit@1.0.0"
    );
    assert_eq!(
        id("", "merged-allow-agent", "").to_string(),
        "merged-allow-agent"
    );
    assert_eq!(id("ns", "p", "").to_string(), "ns/p");
    assert_eq!(id("", "p", "2").to_string(), "p@2");
    assert_eq!(
        serde_json::to_value(id("a", "b", "c")).expect("json"),
        json!("a/b@c")
    );
}

#[test]
fn decision_json() {
    let set = refund_set();
    let cases = [
        (100, json!({"decision": "allow"})),
        (
            14000,
            json!({"decision": "deny", "policy": "payments/refund-hard-limit@1.0.0",
                   "reason": "Refund amount exceeds the absolute ceiling for agent-initiated refunds."}),
        ),
        (
            400,
            json!({"decision": "require_approval", "policy": "payments/refund-approval-boundary@1.0.0",
                   "reason": "Refund amount above delegated limit.", "action": "require_approval",
                   "approvals_required": 1, "on_reject": "return_to_agent",
                   "comprehension_required": false}),
        ),
    ];
    for (amount, want) in cases {
        let args = json!({"amount": amount});
        assert_eq!(
            serde_json::to_value(set.evaluate(&req(&args))).expect("json"),
            want
        );
    }
}

#[test]
fn explanations() {
    let set = compile(json!([
        {"namespace": "payments", "name": "boundary", "version": "1.0.0", "scope": "tool:payments.issue-refund",
         "action": "require_approval", "reason": "big", "conditions": {"field": "amount", "op": "gt", "value": 250}},
        {"namespace": "payments", "name": "limit", "version": "1.0.0", "scope": "tool:payments.issue-refund",
         "action": "deny", "reason": "too big", "conditions": {"field": "amount", "op": "gt", "value": 5000}},
        {"name": "currency", "scope": "agent", "action": "allow", "allow": ["EUR"], "allow_field": "currency"},
        {"name": "lookup-only", "scope": "tool:orders.lookup-order", "action": "deny"},
        {"name": "second-deny", "scope": "agent", "action": "deny", "conditions": {"field": "amount", "op": "gt", "value": 10000}}
    ]));
    let args = json!({"amount": 14000, "currency": "USD"});
    let e = set.explain(&req(&args));
    assert_eq!(e.decision.kind(), DecisionKind::Deny);
    assert_eq!(e.decision.policy().map(|p| p.name()), Some("limit"));
    let rows: Vec<(&str, bool, bool, Effect, bool)> = e
        .policies
        .iter()
        .map(|t| (t.policy.name(), t.applies, t.matched, t.effect, t.deciding))
        .collect();
    assert_eq!(
        rows,
        vec![
            ("boundary", true, true, Effect::RequireApproval, false),
            ("limit", true, true, Effect::Deny, true),
            ("currency", true, true, Effect::Deny, false),
            ("lookup-only", false, false, Effect::None, false),
            ("second-deny", true, true, Effect::Deny, false),
        ]
    );
    let v = serde_json::to_value(&e).expect("json");
    assert_eq!(v["decision"], "deny");
    assert_eq!(v["policy"], "payments/limit@1.0.0");
    assert_eq!(v["reason"], "too big");
    assert_eq!(
        v["policies"][2],
        json!({"policy": "currency", "scope": "agent", "action": "allow", "applies": true,
               "matched": true, "effect": "deny",
               "message": "value USD is not allowed by policy currency", "deciding": false})
    );
    assert_eq!(
        v["policies"][3],
        json!({"policy": "lookup-only", "scope": "tool:orders.lookup-order", "action": "deny",
               "applies": false, "matched": false, "effect": "none", "deciding": false})
    );
    let text = e.to_string();
    assert!(
        text.starts_with("decision: deny\npolicy:   payments/limit@1.0.0\nreason:   too big\n"),
        "{text}"
    );
    assert!(
        text.contains("  payments/limit@1.0.0 (deny): matched -> deny: too big [deciding]"),
        "{text}"
    );
    assert!(
        text.contains("  lookup-only (deny): not applicable (scope tool:orders.lookup-order)"),
        "{text}"
    );

    // The explanation's decision is always evaluate's decision.
    for args in [
        json!({"amount": 1, "currency": "EUR"}),
        json!({"amount": 400, "currency": "EUR"}),
        json!({"amount": 400, "currency": "GBP"}),
        json!({"amount": 20000}),
        json!({}),
    ] {
        let r = req(&args);
        let (d, e) = (set.evaluate(&r), set.explain(&r));
        assert_eq!(
            serde_json::to_value(&d).expect("json"),
            serde_json::to_value(&e.decision).expect("json"),
            "{args}"
        );
        assert_eq!(
            e.policies.iter().filter(|t| t.deciding).count(),
            usize::from(!d.is_allow())
        );
    }

    // Default allow: no policy key; approval text.
    let args = json!({"amount": 1, "currency": "eur"});
    let e = set.explain(&req(&args));
    assert!(
        serde_json::to_value(&e)
            .expect("json")
            .get("policy")
            .is_none()
    );
    let args = json!({"amount": 300, "currency": "eur"});
    let text = set.explain(&req(&args)).to_string();
    assert!(
        text.contains("approval: 1 approval(s) required, on_reject return_to_agent"),
        "{text}"
    );
}

#[test]
fn sets_are_shareable() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PolicySet>();
    assert_send_sync::<CompileErrors>();
}

#[test]
fn nesting_and_path_limits() {
    let nest = |depth: usize| {
        let mut c = json!({"field": "a", "value": 1});
        for _ in 1..depth {
            c = json!({"not": c});
        }
        json!({"name": "p", "scope": "agent", "action": "deny", "conditions": c})
    };
    assert!(PolicySet::compile(defs(json!([nest(64)]))).is_ok());
    let errs = errors_of(nest(65));
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].1, "TooDeep");
    assert_eq!(errs[0].0, format!("conditions{}", ".not".repeat(64)));

    let path = |steps: usize| vec!["k"; steps].join(".");
    let policy = |field: String| json!({"name": "p", "scope": "agent", "action": "deny", "conditions": {"field": field, "op": "exists"}});
    assert!(PolicySet::compile(defs(json!([policy(path(64))]))).is_ok());
    assert_eq!(
        errors_of(policy(path(65))),
        vec![("conditions.field".to_owned(), "BadPath".to_owned())]
    );
}

#[test]
fn shadow_policies_are_reported_and_never_decide() {
    let set = compile(json!([
        {"namespace": "payments", "name": "big", "version": "1.0.0", "scope": "agent",
         "action": "require_approval", "conditions": {"field": "amount", "op": "gt", "value": 1000}},
        {"namespace": "payments", "name": "no-gold", "version": "2.0.0", "scope": "agent",
         "mode": "shadow", "action": "deny", "reason": "gold is off limits",
         "conditions": {"field": "tier", "op": "eq", "value": "gold"}},
        {"namespace": "payments", "name": "mid", "version": "1.0.0", "scope": "agent",
         "mode": "shadow", "action": "require_approval", "approvals_required": 2,
         "conditions": {"field": "amount", "op": "gt", "value": 100}},
        {"namespace": "payments", "name": "currencies", "version": "1.0.0",
         "mode": "shadow", "action": "allow", "allow": ["USD"], "allow_field": "currency"}
    ]));
    assert_eq!(set.len(), 1, "only the enforced policy decides");
    let shadow: Vec<String> = set.shadow_policies().map(|p| p.id().to_string()).collect();
    assert_eq!(
        shadow,
        [
            "payments/no-gold@2.0.0",
            "payments/mid@1.0.0",
            "payments/currencies@1.0.0"
        ]
    );
    assert!(set.has_shadow());

    // A shadow deny of an allowed call: allowed, and reported as a deny by `no-gold`.
    let args = json!({"amount": 5, "tier": "gold", "currency": "USD"});
    let decision = set.evaluate(&req(&args));
    assert_eq!(decision.kind(), DecisionKind::Allow);
    let outcome = set
        .shadow(&req(&args), decision.kind())
        .expect("the shadow deny would have changed the call");
    assert_eq!(outcome.enforced, DecisionKind::Allow);
    assert_eq!(outcome.shadow.kind(), DecisionKind::Deny);
    assert_eq!(outcome.shadow.reason(), Some("gold is off limits"));
    assert_eq!(outcome.policy.id().to_string(), "payments/no-gold@2.0.0");

    // A shadow approval on an allowed call.
    let args = json!({"amount": 500, "currency": "USD"});
    let outcome = set
        .shadow(&req(&args), set.evaluate(&req(&args)).kind())
        .expect("the shadow approval would have held the call");
    assert_eq!(outcome.shadow.kind(), DecisionKind::RequireApproval);
    assert_eq!(outcome.policy.name(), "mid");

    // An approval either way, but under the shadow policy's stricter quorum.
    let args = json!({"amount": 5000, "currency": "USD"});
    let decision = set.evaluate(&req(&args));
    assert_eq!(decision.policy().map(|p| p.name()), Some("big"));
    let outcome = set
        .shadow(&req(&args), decision.kind())
        .expect("the shadow quorum would have applied");
    assert_eq!(outcome.policy.approvals_required(), 2);

    // A shadow allow list that passes, and shadow policies that do not match: nothing.
    let args = json!({"amount": 5, "tier": "silver", "currency": "usd"});
    assert_eq!(set.evaluate(&req(&args)).kind(), DecisionKind::Allow);
    assert!(set.shadow(&req(&args), DecisionKind::Allow).is_none());
    // The shadow allow list would deny another currency.
    let args = json!({"amount": 5, "currency": "EUR"});
    let outcome = set
        .shadow(&req(&args), DecisionKind::Allow)
        .expect("the allow list would have denied");
    assert_eq!(outcome.policy.name(), "currencies");

    // The explanation lists only the enforced policies.
    let explanation = serde_json::to_value(set.explain(&req(&args))).expect("serializes");
    assert_eq!(explanation["policies"].as_array().map(Vec::len), Some(1));

    // A shadow deny where the enforced policies deny anyway changes nothing.
    let both = compile(json!([
        {"name": "deny-all", "scope": "agent", "action": "deny"},
        {"name": "shadow-deny", "scope": "agent", "action": "deny", "mode": "shadow"}
    ]));
    assert!(both.shadow(&req(&args), DecisionKind::Deny).is_none());
    // A set without shadow policies has none to report.
    let plain = refund_set();
    assert!(!plain.has_shadow());
    assert!(plain.shadow(&req(&args), DecisionKind::Allow).is_none());
}

#[test]
fn an_unknown_mode_is_a_compile_error_naming_it() {
    let errors = compile_err(json!([
        {"name": "p", "scope": "agent", "action": "deny", "mode": "log-only"}
    ]));
    let text = errors.to_string();
    assert!(
        text.contains("unknown mode `log-only`; expected enforce or shadow"),
        "{text}"
    );
    assert!(errors.into_iter().any(|e| e.path == "mode"), "{text}");
    // `enforce` is the default, written or not, and does not change the definition's bytes.
    let enforced =
        compile(json!([{"name": "p", "scope": "agent", "action": "deny", "mode": "enforce"}]));
    assert_eq!(enforced.len(), 1);
    assert!(!enforced.has_shadow());
    let def = PolicyDef {
        name: "p".to_owned(),
        ..PolicyDef::default()
    };
    assert!(
        !serde_json::to_string(&def)
            .expect("serializes")
            .contains("mode")
    );
}

mod scope_index {
    //! The scope index against the linear scan it replaced.

    use proptest::prelude::*;
    use proptest::test_runner::Config;
    use serde_json::{Map, Value, json};

    use crate::{Decision, PolicyDef, PolicySet, Request, ToolCtx, Trigger};

    const SCOPES: [&str; 5] = ["", "agent", "tool:a.one", "tool:a.two", "tool:b.three"];
    /// Tools of the calls: three that policies name and one that none does.
    const TOOLS: [&str; 4] = ["a.one", "a.two", "b.three", "c.none"];
    const ACTIONS: [&str; 5] = ["allow", "deny", "block", "require_approval", "escalate"];

    fn conditions() -> Vec<Value> {
        vec![
            json!({"field": "amount", "op": "gt", "value": 250}),
            json!({"field": "amount", "op": "lte", "value": 600}),
            json!({"field": "currency", "op": "in", "value": ["USD", "EUR"]}),
            json!({"not": {"field": "currency", "op": "exists"}}),
            json!({"field": "dispatch.outcome", "op": "eq", "value": "no_handler"}),
            json!({"field": "phrony.dispatch.trigger", "op": "neq", "value": "limit:escalate"}),
            json!({"any": [
                {"field": "amount", "op": "gt", "value": 900},
                {"field": "dispatch.outcome", "op": "eq", "value": "indeterminate"}
            ]}),
            // Equality gates (an `eq`/`in` the conditions cannot hold without) and keyed
            // equalities, on numbers given as text, null, booleans, case and whitespace variants,
            // nested paths.
            json!({"field": "amount", "op": "eq", "value": "250"}),
            json!({"field": "amount", "op": "in", "value": [0, "500.0", null, true]}),
            json!({"all": [
                {"field": "amount", "op": "gte", "value": 100},
                {"all": [{"field": "currency", "op": "eq", "value": " usd "}]}
            ]}),
            json!({"field": "customer.tier", "op": "eq", "value": "Gold"}),
            json!({"field": "customer.tier", "op": "in", "value": [1, "SILVER", "gölD"]}),
            json!({"not": {"field": "customer.tier", "op": "in", "value": ["gold", "silver"]}}),
            json!({"field": "currency", "op": "neq", "value": "usd"}),
            json!({"field": "amount", "op": "not_in", "value": [250, "gbp", null]}),
            json!({"any": [
                {"field": "currency", "op": "eq", "value": "GBP"},
                {"field": "customer.tier", "op": "eq", "value": null}
            ]}),
            // `matches` leaves behind a slot's regex filter, and one walking past the slot.
            json!({"field": "currency", "op": "matches", "value": "^(?i)us"}),
            json!({"any": [
                {"field": "currency", "op": "matches", "value": "P$"},
                {"field": "amount", "op": "matches", "value": "^2"}
            ]}),
            json!({"field": "customer.tags[any]", "op": "matches", "value": "vip"}),
        ]
    }

    /// One compiling definition from indexes into the tables above.
    #[allow(
        clippy::too_many_arguments,
        reason = "one parameter per generated field keeps the strategy a flat tuple"
    )]
    fn def(
        i: usize,
        scope: usize,
        action: usize,
        condition: Option<usize>,
        quorum: i64,
        reason: bool,
        route: bool,
        allow_list: bool,
    ) -> PolicyDef {
        let action = ACTIONS[action % ACTIONS.len()];
        let conditions = condition.map(|c| {
            let pool = conditions();
            pool[c % pool.len()].clone()
        });
        let allow_list = action == "allow" && allow_list;
        let mut scope = SCOPES[scope % SCOPES.len()].to_owned();
        if scope.is_empty() && conditions.is_none() && !allow_list {
            scope = "agent".to_owned();
        }
        let mut def = PolicyDef {
            name: format!("p{i}"),
            namespace: "ns".to_owned(),
            version: "1.0.0".to_owned(),
            scope,
            action: action.to_owned(),
            conditions,
            reason: reason.then(|| format!("reason {i}")),
            ..PolicyDef::default()
        };
        if allow_list {
            def.allow = vec!["USD".to_owned(), "GBP".to_owned()];
        }
        if matches!(action, "require_approval" | "escalate") {
            def.approvals_required = Some(quorum);
            def.runtime = route.then(|| {
                let mut runtime = Map::new();
                runtime.insert("approver_role".to_owned(), Value::from(format!("role-{i}")));
                runtime
            });
        }
        def
    }

    fn set() -> impl Strategy<Value = PolicySet> {
        let one = (
            0..SCOPES.len(),
            0..ACTIONS.len(),
            prop::option::weighted(0.8, 0..conditions().len()),
            1i64..4,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        );
        prop::collection::vec(one, 0..24).prop_map(|shapes| {
            let defs = shapes.into_iter().enumerate().map(
                |(i, (scope, action, condition, quorum, reason, route, allow_list))| {
                    def(
                        i, scope, action, condition, quorum, reason, route, allow_list,
                    )
                },
            );
            match PolicySet::compile(defs) {
                Ok(set) => set,
                Err(e) => panic!("the generator made an invalid set: {e}"),
            }
        })
    }

    fn args() -> impl Strategy<Value = Value> {
        let amount = prop_oneof![
            (0i64..1000).prop_map(Value::from),
            prop::sample::select(vec![
                json!(250),
                json!(250.0),
                json!("250"),
                json!(" 500 "),
                json!(-0.0),
                json!(0),
                json!(null),
                json!(true),
                json!("2x"),
                json!([250]),
            ]),
        ];
        let currency = prop::sample::select(vec![
            json!("USD"),
            json!("EUR"),
            json!("GBP"),
            json!("JPY"),
            json!("usd"),
            json!(" Usd\t"),
            json!("gbp"),
            json!("ÜSD"),
            json!(1),
            json!(null),
            json!({"code": "USD"}),
        ]);
        let customer = prop::sample::select(vec![
            json!({"tier": "gold"}),
            json!({"tier": " GOLD "}),
            json!({"tier": "Silver", "tags": ["vip", "new"]}),
            json!({"tier": "GÖLD"}),
            json!({"tier": 1.0}),
            json!({"tier": null}),
            json!({"tags": []}),
            json!("gold"),
        ]);
        (
            prop::option::of(amount),
            prop::option::of(currency),
            prop::option::of(customer),
        )
            .prop_map(|(amount, currency, customer)| {
                let mut map = Map::new();
                for (key, value) in [
                    ("amount", amount),
                    ("currency", currency),
                    ("customer", customer),
                ] {
                    if let Some(v) = value {
                        map.insert(key.to_owned(), v);
                    }
                }
                Value::Object(map)
            })
    }

    /// The same decision, down to the deciding policy (by address) and the message.
    fn same(a: &Decision<'_>, b: &Decision<'_>) -> bool {
        a.kind() == b.kind()
            && a.reason() == b.reason()
            && match (a.policy(), b.policy()) {
                (Some(x), Some(y)) => std::ptr::eq(x, y),
                (None, None) => true,
                _ => false,
            }
    }

    /// A set reading more distinct path prefixes than fit on the stack keeps its slots on the
    /// heap and decides as the linear scan does; its gates still skip the policies of other
    /// values.
    #[test]
    fn many_path_prefixes_decide_like_the_linear_scan() {
        let defs = (0..200).map(|i| PolicyDef {
            name: format!("p{i}"),
            scope: "agent".to_owned(),
            action: if i % 2 == 0 {
                "deny"
            } else {
                "require_approval"
            }
            .to_owned(),
            conditions: Some(json!({"all": [
                {"field": format!("f{i}"), "op": "eq", "value": i},
                {"field": format!("g{i}.h"), "op": "matches", "value": "^x"}
            ]})),
            ..PolicyDef::default()
        });
        let set = PolicySet::compile(defs).expect("compiles");
        assert!(set.slot_count() > crate::slots::MAX_STACK_SLOTS);
        for (args, want) in [
            (json!({"f150": "150.0", "g150": {"h": "xy"}}), Some("p150")),
            (
                json!({"f151": 151, "g151": {"h": "X"}, "f3": 3, "g3": {"h": "x"}}),
                Some("p3"),
            ),
            (json!({"f150": 150, "g150": {"h": "y"}}), None),
            (json!({"f150": 151, "g150": {"h": "x"}}), None),
        ] {
            let req = Request::new(ToolCtx::new("t.any"), &args);
            let indexed = set.evaluate(&req);
            assert!(same(&indexed, &set.evaluate_linear(&req)), "{args}");
            assert_eq!(indexed.policy().map(crate::Policy::name), want, "{args}");
        }
    }

    proptest! {
        #![proptest_config(Config { cases: 512, failure_persistence: None, ..Config::default() })]

        /// `evaluate` and `evaluate_failure` visit only the agent-wide policies and the call's
        /// tool's, skip the policies whose equality gate the call fails, read each path prefix
        /// once through the decision's slots and answer `matches` leaves from the slots' regex
        /// filters, and still decide exactly as the linear scan over every policy (no slots, no
        /// gates, no filters) did: the same kind, deciding policy and message, for every tool
        /// (one no policy names included) and trigger.
        #[test]
        fn indexed_evaluation_equals_the_linear_scan(set in set(), args in args()) {
            for tool in TOOLS {
                let req = Request::new(ToolCtx::new(tool), &args);
                let indexed = set.evaluate(&req);
                let linear = set.evaluate_linear(&req);
                prop_assert!(same(&indexed, &linear), "{tool}: {indexed:?} vs {linear:?}");
                for trigger in Trigger::ALL {
                    let indexed = set.evaluate_failure(&req, trigger);
                    let linear = set.evaluate_failure_linear(&req, trigger);
                    prop_assert!(
                        match (indexed, linear) {
                            (Some(x), Some(y)) => std::ptr::eq(x, y),
                            (None, None) => true,
                            _ => false,
                        },
                        "{tool} {trigger}: {:?} vs {:?}",
                        indexed.map(|p| p.name()),
                        linear.map(|p| p.name())
                    );
                }
            }
        }
    }
}
