//! Property tests of the policy engine on generated policy sets and calls: a matching deny always
//! wins, evaluation is deterministic and independent of the order policies are given in (for the
//! decision type), a definition survives its JSON round trip and evaluates identically, and a
//! tool hidden in a context (`PolicySet::hidden_tool`) is denied there whatever its arguments.

use phrony_policy::{DecisionKind, PolicyDef, PolicySet, Request, SessionCtx, ToolCtx, Trigger};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Map, Value, json};

/// The tool every generated call is made to (a scope may name it, or another tool).
const TOOL: &str = "payments.issue-refund";

/// Keys generated arguments use, and condition paths read (some are never sent).
const FIELDS: [&str; 8] = [
    "amount",
    "currency",
    "tier",
    "flag",
    "note",
    "items[any].price",
    "items[all].price",
    "customer.tier",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-1000i64..10_000).prop_map(Value::from),
        (-100.0f64..1000.0).prop_map(|f| json!((f * 100.0).round() / 100.0)),
        (0i64..600).prop_map(|n| Value::from(n.to_string())),
        prop::sample::select(vec![
            "USD", "usd ", "EUR", "gold", "Gold", "silver", "", "x"
        ])
        .prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
    ]
}

fn arg_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => scalar(),
        1 => Just(Value::Null),
        1 => prop::collection::vec(scalar(), 0..3).prop_map(Value::from),
    ]
}

/// Tool arguments of several JSON types, with some keys missing.
fn args() -> impl Strategy<Value = Value> {
    (
        prop::option::of(arg_value()),
        prop::option::of(arg_value()),
        prop::option::of(arg_value()),
        prop::option::of(arg_value()),
        prop::collection::vec(prop::option::of(scalar()), 0..3),
        prop::option::of(scalar()),
    )
        .prop_map(|(amount, currency, tier, flag, prices, customer_tier)| {
            let mut map = Map::new();
            for (key, value) in [
                ("amount", amount),
                ("currency", currency),
                ("tier", tier),
                ("flag", flag),
            ] {
                if let Some(value) = value {
                    map.insert(key.to_owned(), value);
                }
            }
            if !prices.is_empty() {
                let items = prices
                    .into_iter()
                    .map(|price| match price {
                        Some(p) => json!({"price": p}),
                        None => json!({}),
                    })
                    .collect();
                map.insert("items".to_owned(), Value::Array(items));
            }
            if let Some(tier) = customer_tier {
                map.insert("customer".to_owned(), json!({"tier": tier}));
            }
            Value::Object(map)
        })
}

/// A condition leaf that compiles: an operator with a value of the type it takes.
fn leaf() -> impl Strategy<Value = Value> {
    let field = prop::sample::select(FIELDS.to_vec());
    let threshold = prop_oneof![
        (-100i64..2000).prop_map(Value::from),
        (0i64..600).prop_map(|n| Value::from(n.to_string())),
        (0.0f64..500.0).prop_map(|f| json!((f * 10.0).round() / 10.0)),
    ];
    let op_value = prop_oneof![
        (
            prop::sample::select(vec!["gt", "gte", "lt", "lte", ">", "<="]),
            threshold
        )
            .prop_map(|(op, v)| (op, v)),
        (
            prop::sample::select(vec!["eq", "neq", "==", "!="]),
            scalar()
        )
            .prop_map(|(op, v)| (op, v)),
        (
            prop::sample::select(vec!["in", "not_in"]),
            prop::collection::vec(scalar(), 1..4)
        )
            .prop_map(|(op, v)| (op, Value::from(v))),
        any::<bool>().prop_map(|b| ("exists", Value::from(b))),
        (
            prop::sample::select(vec!["contains", "starts_with", "ends_with"]),
            prop::sample::select(vec!["us", "G", "1", "old", "d"])
        )
            .prop_map(|(op, v)| (op, Value::from(v))),
        prop::sample::select(vec!["^[0-9]+$", "(?i)usd", "^g", "5"])
            .prop_map(|re| ("matches", Value::from(re))),
    ];
    (field, op_value)
        .prop_map(|(field, (op, value))| json!({"field": field, "op": op, "value": value}))
}

/// A condition tree of `all`/`any`/`not` over leaves, a few levels deep.
fn condition() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(|c| json!({"all": c})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|c| json!({"any": c})),
            inner.prop_map(|c| json!({"not": c})),
        ]
    })
}

/// A condition that holds for every call: `any: [c, not c]` (a missing value makes `c` false and
/// `not c` true).
fn tautology() -> impl Strategy<Value = Value> {
    condition().prop_map(|c| json!({"any": [c.clone(), {"not": c}]}))
}

#[derive(Debug, Clone)]
struct Shape {
    action: &'static str,
    scope: &'static str,
    conditions: Option<Value>,
    quorum: Option<i64>,
    reason: Option<&'static str>,
    route: Option<&'static str>,
    allow_list: bool,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop::sample::select(vec![
            "allow",
            "deny",
            "block",
            "require_approval",
            "escalate",
        ]),
        prop::sample::select(vec![
            "",
            "agent",
            "tool:payments.issue-refund",
            "tool:crm.lookup",
        ]),
        prop::option::weighted(0.85, condition()),
        prop::option::of(1i64..4),
        prop::option::of(prop::sample::select(vec!["over the limit", "needs a lead"])),
        prop::option::of(prop::sample::select(vec!["finance", "support-lead"])),
        any::<bool>(),
    )
        .prop_map(
            |(action, scope, conditions, quorum, reason, route, allow_list)| Shape {
                action,
                scope,
                conditions,
                quorum,
                reason,
                route,
                allow_list,
            },
        )
}

/// A definition that compiles (every problem `PolicySet::compile` names is avoided).
fn def_of(index: usize, s: &Shape) -> PolicyDef {
    let approval = matches!(s.action, "require_approval" | "escalate");
    let allow_list = s.action == "allow" && (s.allow_list || s.conditions.is_none());
    let mut def = PolicyDef {
        name: format!("policy-{index}"),
        namespace: "payments".to_owned(),
        version: "1.0.0".to_owned(),
        // A policy needs a scope, conditions or an allow list.
        scope: if s.scope.is_empty() && s.conditions.is_none() && !allow_list {
            "agent".to_owned()
        } else {
            s.scope.to_owned()
        },
        action: s.action.to_owned(),
        conditions: s.conditions.clone(),
        reason: s.reason.map(str::to_owned),
        ..PolicyDef::default()
    };
    if allow_list {
        def.allow = vec!["USD".to_owned(), "gold".to_owned()];
        def.allow_field = Some("currency".to_owned());
    }
    if approval {
        def.approvals_required = s.quorum;
        def.runtime = s.route.map(|r| {
            let mut runtime = Map::new();
            runtime.insert("phrony.com/approver_role".to_owned(), Value::from(r));
            runtime
        });
    }
    def
}

fn defs() -> impl Strategy<Value = Vec<PolicyDef>> {
    prop::collection::vec(shape(), 0..7).prop_map(|shapes| {
        shapes
            .iter()
            .enumerate()
            .map(|(i, s)| def_of(i, s))
            .collect()
    })
}

#[track_caller]
fn compile(defs: &[PolicyDef]) -> PolicySet {
    match PolicySet::compile(defs.to_vec()) {
        Ok(set) => set,
        Err(errors) => panic!("the generator made an invalid set: {errors}\n{defs:#?}"),
    }
}

/// What a decision says, as data to compare.
fn decide(set: &PolicySet, args: &Value) -> (DecisionKind, Option<String>, Option<String>) {
    let decision = set.evaluate(&Request::new(ToolCtx::new(TOOL), args));
    (
        decision.kind(),
        decision.policy().map(|p| p.id().to_string()),
        decision.reason().map(str::to_owned),
    )
}

/// Each policy's own verdict in the explanation, by name: `(applies, matched, effect)`.
fn verdicts(set: &PolicySet, args: &Value) -> Vec<(String, Value, Value, Value)> {
    let explanation = serde_json::to_value(set.explain(&Request::new(ToolCtx::new(TOOL), args)))
        .expect("an explanation serializes");
    let mut out: Vec<_> = explanation["policies"]
        .as_array()
        .expect("the explanation lists its policies")
        .iter()
        .map(|t| {
            (
                t["policy"].as_str().unwrap_or_default().to_owned(),
                t["applies"].clone(),
                t["matched"].clone(),
                t["effect"].clone(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn config() -> Config {
    Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// A set with a deny policy that matches the call denies it, wherever the deny sits and
    /// whatever else matches (allows, allow lists, approvals of any quorum), and names a deny.
    #[test]
    fn a_matching_deny_always_wins(
        defs in defs(),
        deny_conditions in tautology(),
        deny_scope in prop::sample::select(vec!["", "agent", "tool:payments.issue-refund"]),
        position in any::<prop::sample::Index>(),
        args in args(),
    ) {
        let mut defs = defs;
        let deny = PolicyDef {
            name: "the-deny".to_owned(),
            namespace: "payments".to_owned(),
            version: "1.0.0".to_owned(),
            scope: deny_scope.to_owned(),
            action: "deny".to_owned(),
            conditions: Some(deny_conditions),
            reason: Some("never".to_owned()),
            ..PolicyDef::default()
        };
        defs.insert(position.index(defs.len() + 1), deny);
        let set = compile(&defs);
        let decision = set.evaluate(&Request::new(ToolCtx::new(TOOL), &args));
        prop_assert_eq!(decision.kind(), DecisionKind::Deny);
        let decider = decision.policy().expect("a deny names its policy");
        prop_assert!(
            matches!(decider.action().as_str(), "deny" | "allow"),
            "a deny is decided by a deny or an allow-list violation, not {}",
            decider.action().as_str()
        );
    }

    /// Whenever the explanation shows a matching deny policy in scope, the decision is a deny.
    #[test]
    fn any_matching_deny_in_a_random_set_denies(defs in defs(), args in args()) {
        let set = compile(&defs);
        let a_deny_matched = verdicts(&set, &args).iter().any(|(_, applies, matched, effect)| {
            applies == &Value::Bool(true) && matched == &Value::Bool(true) && effect == "deny"
        });
        if a_deny_matched {
            prop_assert_eq!(decide(&set, &args).0, DecisionKind::Deny);
        }
    }

    /// The same call against the same set twice gives the same decision and the same
    /// explanation; the set given in another order decides the same type, and every policy's
    /// own verdict is unchanged.
    #[test]
    fn evaluation_is_deterministic_and_order_independent(
        defs in defs(),
        args in args(),
        seed in any::<u64>(),
    ) {
        let set = compile(&defs);
        let request = Request::new(ToolCtx::new(TOOL), &args);
        prop_assert_eq!(decide(&set, &args), decide(&set, &args));
        let first = serde_json::to_value(set.explain(&request)).expect("serializes");
        let second = serde_json::to_value(set.explain(&request)).expect("serializes");
        prop_assert_eq!(&first, &second);
        prop_assert_eq!(set.explain(&request).to_string(), set.explain(&request).to_string());

        let mut permuted = defs.clone();
        shuffle(&mut permuted, seed);
        let other = compile(&permuted);
        let (kind, policy, _) = decide(&set, &args);
        let (other_kind, other_policy, _) = decide(&other, &args);
        prop_assert_eq!(kind, other_kind, "order changed the decision type: {:?}", permuted);
        prop_assert_eq!(verdicts(&set, &args), verdicts(&other, &args));
        // A single deciding candidate decides in any order.
        let deciders = verdicts(&set, &args)
            .iter()
            .filter(|(_, applies, matched, effect)| {
                applies == &Value::Bool(true) && matched == &Value::Bool(true) && effect == "deny"
            })
            .count();
        if kind == DecisionKind::Deny && deciders == 1 {
            prop_assert_eq!(policy, other_policy);
        }
    }

    /// Shadow policies never decide: a set with extra shadow policies (anywhere in the order,
    /// names of their own) decides, explains and routes failures exactly like the set without
    /// them, and whatever `shadow` reports is the what-if decision of the set with those
    /// policies enforced, named by a shadow policy and different from the enforced decision.
    #[test]
    fn shadow_policies_never_change_the_enforced_decision(
        defs in defs(),
        extra in defs(),
        positions in prop::collection::vec(any::<prop::sample::Index>(), 7),
        args in args(),
    ) {
        let plain = compile(&defs);
        let mut mixed = defs.clone();
        let mut enforced_all = defs.clone();
        for (i, (def, at)) in extra.into_iter().zip(&positions).enumerate() {
            let renamed = PolicyDef { name: format!("shadow-{i}"), ..def };
            let at = at.index(mixed.len() + 1);
            enforced_all.insert(at, renamed.clone());
            mixed.insert(at, PolicyDef { mode: "shadow".to_owned(), ..renamed });
        }
        let with_shadow = compile(&mixed);
        prop_assert_eq!(decide(&plain, &args), decide(&with_shadow, &args));
        let request = Request::new(ToolCtx::new(TOOL), &args);
        prop_assert_eq!(
            serde_json::to_value(plain.explain(&request)).expect("serializes"),
            serde_json::to_value(with_shadow.explain(&request)).expect("serializes")
        );
        for trigger in Trigger::ALL {
            prop_assert_eq!(
                plain.evaluate_failure(&request, trigger).map(|p| p.id().to_string()),
                with_shadow.evaluate_failure(&request, trigger).map(|p| p.id().to_string())
            );
        }
        let enforced = with_shadow.evaluate(&request).kind();
        prop_assert!(plain.shadow(&request, enforced).is_none());
        let what_if = compile(&enforced_all);
        let would = what_if.evaluate(&request);
        match with_shadow.shadow(&request, enforced) {
            Some(outcome) => {
                prop_assert!(outcome.policy.is_shadow());
                prop_assert_eq!(outcome.shadow.kind(), would.kind());
                prop_assert_eq!(outcome.enforced, enforced);
                prop_assert!(
                    outcome.shadow.kind() != enforced
                        || enforced == DecisionKind::RequireApproval
                );
            }
            // Nothing reported: the shadow policies change nothing about the kind.
            None => prop_assert_eq!(would.kind(), enforced),
        }
    }

    /// A definition serialises to the snapshot's JSON and parses back to itself (as a value
    /// and from text), and the parsed set evaluates and explains every call identically.
    #[test]
    fn definitions_round_trip_and_evaluate_identically(
        defs in defs(),
        calls in prop::collection::vec(args(), 1..4),
    ) {
        let text = serde_json::to_string(&defs).expect("definitions serialize");
        let parsed: Vec<PolicyDef> = serde_json::from_str(&text).expect("and parse back");
        prop_assert_eq!(&parsed, &defs);
        let as_value: Vec<PolicyDef> =
            serde_json::from_value(serde_json::to_value(&defs).expect("serialize"))
                .expect("parse");
        prop_assert_eq!(&as_value, &defs);
        let original = compile(&defs);
        let reparsed = compile(&parsed);
        for args in &calls {
            let request = Request::new(ToolCtx::new(TOOL), args);
            prop_assert_eq!(decide(&original, args), decide(&reparsed, args));
            prop_assert_eq!(
                serde_json::to_value(original.explain(&request)).expect("serializes"),
                serde_json::to_value(reparsed.explain(&request)).expect("serializes")
            );
        }
    }
}

/// Context paths the visibility sets read, beside the argument paths of [`FIELDS`].
const CONTEXT_FIELDS: [&str; 5] = [
    "phrony.principal.role",
    "phrony.session.metadata.env",
    "phrony.time.hour",
    "phrony.time.weekday",
    "phrony.tool.side_effect_class",
];

/// A leaf on a context path (mostly) or an argument path, with values the context can hold.
fn context_leaf() -> impl Strategy<Value = Value> {
    let context = (
        prop::sample::select(CONTEXT_FIELDS.to_vec()),
        prop::sample::select(vec!["eq", "neq", "in", "not_in", "exists", "lt", "gte"]),
        prop::sample::select(vec![
            "viewer",
            "ops",
            "sandbox",
            "prod",
            "monday",
            "saturday",
            "read_only",
            "12",
            "6",
        ]),
    )
        .prop_map(|(field, op, value)| match op {
            "in" | "not_in" => json!({"field": field, "op": op, "value": [value, "ops"]}),
            "exists" => json!({"field": field, "op": op, "value": value.len() % 2 == 0}),
            "lt" | "gte" => json!({"field": field, "op": op, "value": value.len() * 3}),
            _ => json!({"field": field, "op": op, "value": value}),
        });
    prop_oneof![4 => context, 1 => leaf()]
}

fn context_condition() -> impl Strategy<Value = Value> {
    context_leaf().prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(|c| json!({"all": c})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|c| json!({"any": c})),
            inner.prop_map(|c| json!({"not": c})),
        ]
    })
}

/// A policy of a visibility set: deny, allow (with an allow list on the principal's role or on
/// an argument) or approval, on the call's tool, another tool or the agent.
fn visibility_def() -> impl Strategy<Value = (PolicyDef, bool)> {
    (
        prop::sample::select(vec!["deny", "allow", "require_approval"]),
        prop::sample::select(vec![
            "agent",
            "tool:payments.issue-refund",
            "tool:crm.lookup",
        ]),
        prop::option::weighted(0.8, context_condition()),
        prop::sample::select(vec!["phrony.principal.role", "currency"]),
    )
        .prop_map(|(action, scope, conditions, allow_field)| {
            let mut def = PolicyDef {
                namespace: "payments".to_owned(),
                version: "1.0.0".to_owned(),
                scope: scope.to_owned(),
                action: action.to_owned(),
                conditions,
                ..PolicyDef::default()
            };
            if action == "allow" {
                def.allow = vec!["ops".to_owned(), "USD".to_owned()];
                def.allow_field = Some(allow_field.to_owned());
            }
            let reads_args = def.conditions.as_ref().is_some_and(|c| {
                FIELDS
                    .iter()
                    .any(|f| c.to_string().contains(&format!("\"{f}\"")))
            });
            (def, reads_args)
        })
}

/// The context a visibility call runs in: the principal's role, the session's `env`, the time.
fn context() -> impl Strategy<Value = (Value, Value, i64)> {
    (
        prop::option::of(prop::sample::select(vec!["viewer", "ops", "admin"])),
        prop::option::of(prop::sample::select(vec!["sandbox", "prod"])),
        0i64..(14 * 86_400),
    )
        .prop_map(|(role, env, now)| {
            let principal = role.map_or_else(|| json!({}), |r| json!({"role": r}));
            let metadata = env.map_or_else(|| json!({}), |e| json!({"env": e}));
            (principal, metadata, now)
        })
}

proptest! {
    #![proptest_config(config())]

    /// Whenever `hidden_tool` hides the call's tool in a context, `evaluate` denies the call in
    /// that context with every generated argument value; and a set none of whose in-scope deny
    /// or allow-list policies can decide without the arguments hides nothing.
    #[test]
    fn a_hidden_tool_is_denied_whatever_the_args(
        defs in prop::collection::vec(visibility_def(), 0..6),
        (principal, metadata, now) in context(),
        side_effect_class in prop::sample::select(vec!["read_only", "irreversible_action"]),
        calls in prop::collection::vec(args(), 1..6),
    ) {
        let all_read_args = defs.iter().all(|(def, reads_args)| {
            *reads_args || def.action == "require_approval" || def.allow_field.as_deref() == Some("currency")
        });
        let defs: Vec<PolicyDef> = defs
            .into_iter()
            .enumerate()
            .map(|(i, (def, _))| PolicyDef { name: format!("policy-{i}"), ..def })
            .collect();
        let set = compile(&defs);
        let tool = ToolCtx { side_effect_class, ..ToolCtx::new(TOOL) };
        let request = |args| {
            Request::new(tool, args)
                .with_session(SessionCtx { id: "run_1", metadata: Some(&metadata) })
                .with_principal(&principal)
                .at(now)
        };
        let hidden = set.hidden_tool(&request(&Value::Null)).map(|p| p.name().to_owned());
        if all_read_args {
            prop_assert_eq!(&hidden, &None, "nothing here decides without the arguments");
        }
        if let Some(name) = hidden {
            for args in calls.iter().chain([&Value::Null, &json!({})]) {
                let decision = set.evaluate(&request(args));
                prop_assert_eq!(
                    decision.kind(),
                    DecisionKind::Deny,
                    "{} hides the tool but {} is not denied", name, args
                );
            }
        }
    }
}

/// A Fisher–Yates shuffle driven by `seed` (a small xorshift: reproducible from the case).
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed | 1;
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = usize::try_from(state % (i as u64 + 1)).unwrap_or(0);
        items.swap(i, j);
    }
}
