//! Ours against Cedar on equivalent policies: the same requests, the same run, the same
//! decisions (asserted before timing).
//!
//! `cargo bench -p phrony-policy --features cedar --bench cedar`. Times are the benchmark
//! thread's CPU time unless `PHRONY_BENCH_CLOCK=wall` (`support/cpu_time.rs`).
//!
//! Three evaluators per request:
//!
//! - `phrony`: [`PolicySet::evaluate`] on the tool arguments (a borrowed JSON value);
//! - `cedar`: [`CedarPolicies::evaluate`], the crate's Cedar embedding as the mock gate uses it
//!   (context facts type-checked against the declared schema, the Cedar request built, forbid
//!   wins, and the `@escalate` convention: one authorizer call on a set where escalate forbids
//!   are permits), from the same JSON;
//! - `cedar_authorizer`: one bare `Authorizer::is_authorized` on a request built beforehand,
//!   Cedar's core alone (a lower bound on what any Cedar embedding pays).
//!
//! The group `runtime_yaml_vs_cedar` measures the runtime path: a full call decided by
//! [`PolicySet::evaluate`] on the refund tutorial's YAML policies and on the same policies as
//! one Cedar document (`PolicyDef::cedar`, `policies-examples/refund-agent-cedar`).
//!
//! Equivalence. Phrony's scope `tool:<ref>` is Cedar's `resource == Tool::"<ref>"`; its default
//! allow is a `permit` for every call; `deny` is a `forbid`; `require_approval`/`escalate` is an
//! `@escalate("approver")` forbid (hard forbid > escalate > permit, as deny > approval > allow);
//! an allow list on `currency` is a forbid when the conditions hold and the currency is not
//! listed. Phrony compares strings case-insensitively and Cedar exactly, so the requests use
//! the spelling the policies use; the assertions check every request's decision kind, and that
//! the policy Phrony names is among those Cedar reports.

use std::hint::black_box;
use std::str::FromStr;

use cedar_policy::{
    Authorizer, Context, Entities, EntityUid, PolicySet as CedarSet, Request as CedarRequest,
};
use criterion::measurement::Measurement;
use criterion::{BenchmarkId, Criterion, Throughput};
use phrony_policy::cedar::{CedarPolicies, CedarSpec, CedarVerdict, FactSpec, FactType};
use phrony_policy::{DecisionKind, PolicyDef, PolicySet, Request, ToolCtx};
use serde_json::{Map, Value, json};

#[path = "support/cpu_time.rs"]
mod cpu_time;
#[path = "support/refund.rs"]
mod refund;

const ACTION: &str = "call_tool";
const PRINCIPAL: &str = "refund-bot";

/// The same two policies in Cedar, under the crate's `@id` / `@escalate` conventions.
const REFUND_CEDAR: &str = r#"
@id("default-allow")
permit (principal, action == Action::"call_tool", resource);

@id("refund-approval-boundary")
@escalate("approver")
forbid (principal, action == Action::"call_tool", resource == Tool::"payments.issue-refund")
when { context.amount > 250 };

@id("refund-hard-limit")
forbid (principal, action == Action::"call_tool", resource == Tool::"payments.issue-refund")
when { context.amount > 5000 };
"#;

fn spec(facts: &[(&str, FactType)]) -> CedarSpec {
    let facts = facts
        .iter()
        .map(|(name, ty)| {
            (
                (*name).to_owned(),
                FactSpec {
                    ty: *ty,
                    optional: false,
                },
            )
        })
        .collect();
    CedarSpec {
        principal_type: "Agent".into(),
        resource_type: "Tool".into(),
        actions: [(ACTION.to_owned(), facts)].into(),
    }
}

/// 1,000 policies both engines can express: thresholds, `in` lists, string equality, `any`,
/// allow lists; a quarter agent-wide, the rest spread over 50 tools; every decision type.
fn generated(n: usize) -> (Vec<PolicyDef>, String) {
    let mut defs = Vec::with_capacity(n);
    let mut cedar = String::from(
        "@id(\"default-allow\")\npermit (principal, action == Action::\"call_tool\", resource);\n",
    );
    for i in 0..n {
        let tool = (i % 4 != 0).then(|| format!("svc.tool-{}", i % 50));
        let (conditions, when) = match (i / 4) % 4 {
            0 => (
                json!({"field": "amount", "op": "gt", "value": 10_000 + i}),
                format!("context.amount > {}", 10_000 + i),
            ),
            1 => (
                json!({"all": [
                    {"field": "currency", "op": "in", "value": ["GBP", "JPY", "CHF"]},
                    {"field": "amount", "op": "gte", "value": 5_000 + i}
                ]}),
                format!(
                    "[\"GBP\", \"JPY\", \"CHF\"].contains(context.currency) && context.amount >= {}",
                    5_000 + i
                ),
            ),
            2 => (
                json!({"field": "customer.tier", "op": "eq", "value": format!("tier-{i}")}),
                format!("context.tier == \"tier-{i}\""),
            ),
            _ => (
                json!({"any": [
                    {"field": "phrony.principal.role", "op": "eq", "value": format!("banned-{i}")},
                    {"field": "amount", "op": "lt", "value": -(i as i64)}
                ]}),
                format!("context.role == \"banned-{i}\" || context.amount < -{i}"),
            ),
        };
        let mut def = json!({
            "namespace": "gen", "name": format!("policy-{i:04}"), "version": "1.0.0",
            "scope": tool.as_ref().map_or_else(|| "agent".to_owned(), |t| format!("tool:{t}")),
            "conditions": conditions, "reason": format!("generated policy {i}")
        });
        let (annotation, when) = match i % 5 {
            0 => {
                def["action"] = json!("deny");
                (String::new(), when)
            }
            1 | 2 => {
                def["action"] = json!("require_approval");
                def["approvals_required"] = json!(1 + i % 2);
                ("@escalate(\"approver\")\n".to_owned(), when)
            }
            3 => {
                def["action"] = json!("escalate");
                ("@escalate(\"approver\")\n".to_owned(), when)
            }
            _ => {
                def["action"] = json!("allow");
                def["allow"] = json!(["EUR", "USD"]);
                def["allow_field"] = json!("currency");
                (
                    String::new(),
                    format!("({when}) && !([\"EUR\", \"USD\"].contains(context.currency))"),
                )
            }
        };
        let resource = tool.map_or_else(
            || "resource".to_owned(),
            |t| format!("resource == Tool::\"{t}\""),
        );
        cedar.push_str(&format!(
            "@id(\"policy-{i:04}\")\n{annotation}forbid (principal, action == Action::\"call_tool\", {resource})\nwhen {{ {when} }};\n"
        ));
        defs.push(serde_json::from_value(def).expect("generated policy"));
    }
    (defs, cedar)
}

/// One request as both engines see it.
struct Call {
    label: String,
    tool: &'static str,
    args: Value,
    claims: Value,
    /// The Cedar context: the same facts, flat.
    context: Map<String, Value>,
    /// The bare Cedar request, built once.
    request: CedarRequest,
}

impl Call {
    fn new(label: &str, tool: &'static str, args: Value, claims: Value) -> Self {
        let mut context = Map::new();
        context.insert("amount".into(), args["amount"].clone());
        if let Some(currency) = args.get("currency") {
            context.insert("currency".into(), currency.clone());
        }
        if let Some(tier) = args.pointer("/customer/tier") {
            context.insert("tier".into(), tier.clone());
        }
        if let Some(role) = claims.get("role") {
            context.insert("role".into(), role.clone());
        }
        let uid = |s: String| EntityUid::from_str(&s).expect("entity uid");
        let request = CedarRequest::new(
            uid(format!("Agent::\"{PRINCIPAL}\"")),
            uid(format!("Action::\"{ACTION}\"")),
            uid(format!("Tool::\"{tool}\"")),
            Context::from_json_value(Value::Object(context.clone()), None).expect("context"),
            None,
        )
        .expect("cedar request");
        Self {
            label: label.to_owned(),
            tool,
            args,
            claims,
            context,
            request,
        }
    }

    fn phrony<'s>(&self, set: &'s PolicySet) -> phrony_policy::Decision<'s> {
        set.evaluate(
            &Request::new(ToolCtx::new(self.tool), &self.args).with_principal(&self.claims),
        )
    }

    fn cedar(&self, set: &CedarPolicies) -> CedarVerdict {
        set.evaluate(PRINCIPAL, ACTION, self.tool, &self.context)
    }
}

/// Both engines decide `call` the same way; returns the kind.
fn assert_equivalent(
    call: &Call,
    ours: &PolicySet,
    cedar: &CedarPolicies,
    bare: &CedarSet,
) -> DecisionKind {
    let decision = call.phrony(ours);
    let named = decision.policy().map(|p| p.name().to_owned());
    let verdict = call.cedar(cedar);
    let (kind, cedar_ids) = match &verdict {
        CedarVerdict::Allow { .. } => (DecisionKind::Allow, Vec::new()),
        CedarVerdict::Deny { forbids } => (DecisionKind::Deny, forbids.clone()),
        CedarVerdict::Escalate { policies, .. } => {
            (DecisionKind::RequireApproval, policies.clone())
        }
        other => panic!("{}: Cedar gave {other:?}", call.label),
    };
    assert_eq!(
        decision.kind(),
        kind,
        "{}: phrony vs cedar ({verdict:?})",
        call.label
    );
    if let Some(name) = named {
        assert!(
            cedar_ids.contains(&name),
            "{}: {name} not in {cedar_ids:?}",
            call.label
        );
    }
    // The bare authorizer: allow, or a deny whose matched forbids are all escalate forbids
    // (an approval under the convention; the permit matches every call) or not.
    let response = Authorizer::new().is_authorized(&call.request, bare, &Entities::empty());
    assert_eq!(response.diagnostics().errors().count(), 0, "{}", call.label);
    let bare_kind = if response.decision() == cedar_policy::Decision::Allow {
        DecisionKind::Allow
    } else if response.diagnostics().reason().all(|id| {
        bare.policy(id)
            .is_some_and(|p| p.annotation("escalate").is_some())
    }) {
        DecisionKind::RequireApproval
    } else {
        DecisionKind::Deny
    };
    assert_eq!(bare_kind, kind, "{}: bare authorizer", call.label);
    kind
}

fn compare<M: Measurement>(
    c: &mut Criterion<M>,
    name: &str,
    ours: &PolicySet,
    cedar_text: &str,
    cedar_spec: &CedarSpec,
    calls: &[Call],
) {
    let cedar = CedarPolicies::compile(cedar_text, cedar_spec).expect("Cedar policies compile");
    let bare = CedarSet::from_str(cedar_text).expect("Cedar policies parse");
    let kinds: Vec<DecisionKind> = calls
        .iter()
        .map(|call| assert_equivalent(call, ours, &cedar, &bare))
        .collect();
    for want in [
        DecisionKind::Allow,
        DecisionKind::Deny,
        DecisionKind::RequireApproval,
    ] {
        assert!(
            kinds.contains(&want),
            "{name}: no request is decided {want}"
        );
    }
    println!(
        "{name}: {} policies (Cedar: {}); every request decided alike: {}",
        ours.len(),
        cedar.ids().len(),
        calls
            .iter()
            .zip(&kinds)
            .map(|(c, k)| format!("{}={k}", c.label))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    for call in calls {
        group.bench_with_input(BenchmarkId::new("phrony", &call.label), call, |b, call| {
            b.iter(|| black_box(black_box(call).phrony(ours)).kind())
        });
        group.bench_with_input(BenchmarkId::new("cedar", &call.label), call, |b, call| {
            b.iter(|| black_box(black_box(call).cedar(&cedar)))
        });
        group.bench_with_input(
            BenchmarkId::new("cedar_authorizer", &call.label),
            call,
            |b, call| {
                let authorizer = Authorizer::new();
                let entities = Entities::empty();
                b.iter(|| {
                    black_box(authorizer.is_authorized(black_box(&call.request), &bare, &entities))
                        .decision()
                })
            },
        );
    }
    group.finish();
}

fn bench<M: Measurement>(c: &mut Criterion<M>) {
    let refund_calls: Vec<Call> = [100, 400, 14000]
        .into_iter()
        .map(|amount| {
            Call::new(
                &format!("amount={amount}"),
                "payments.issue-refund",
                json!({"order_id": "ORD-1", "amount": amount, "reason": "damaged"}),
                json!({}),
            )
        })
        .collect();
    compare(
        c,
        "refund_vs_cedar",
        &refund::policies(),
        REFUND_CEDAR,
        &spec(&[("amount", FactType::Long)]),
        &refund_calls,
    );

    let (defs, cedar_text) = generated(1000);
    let ours = PolicySet::compile(defs).expect("generated policies compile");
    let call = |label: &str, amount: i64, currency: &str, tier: &str, role: &str| {
        Call::new(
            label,
            "svc.tool-7",
            json!({"amount": amount, "currency": currency, "customer": {"id": "C-1", "tier": tier}}),
            json!({"role": role}),
        )
    };
    let generated_calls = [
        // Nothing matches: every policy in scope is evaluated.
        call("allow", 100, "EUR", "gold", "agent"),
        // An agent-wide escalate policy matches the tier.
        call("approval", 100, "EUR", "tier-8", "agent"),
        // Over every threshold: deny policies match.
        call("deny", 20_000, "EUR", "gold", "agent"),
        // The first matching policy in scope is an allow list that rejects the currency.
        call("allow_list_deny", 6_000, "JPY", "gold", "agent"),
    ];
    compare(
        c,
        "generated_1000_vs_cedar",
        &ours,
        &cedar_text,
        &spec(&[
            ("amount", FactType::Long),
            ("currency", FactType::String),
            ("tier", FactType::String),
            ("role", FactType::String),
        ]),
        &generated_calls,
    );
}

/// The refund-agent-cedar example's Cedar document (`policies-examples/refund-agent-cedar`).
const RUNTIME_CEDAR: &str = r#"
@id("delegated-refunds")
permit (principal, action == Action::"payments.issue-refund", resource);

@id("above-delegated-limit")
@escalate("finance")
forbid (principal, action == Action::"payments.issue-refund", resource)
when { context.args.amount.greaterThan(decimal("250.0")) };

@id("absolute-ceiling")
@reason("Refund amount exceeds the absolute ceiling for agent-initiated refunds.")
forbid (principal, action == Action::"payments.issue-refund", resource)
when { context.args.amount.greaterThan(decimal("5000.0")) };
"#;

/// The runtime path: one [`PolicySet::evaluate`] of a full call (tool, arguments, agent,
/// session metadata, principal claims, time), on the refund tutorial's YAML policies and on
/// the same policies as one Cedar document (`spec.cedar`) in the same run.
fn runtime_path<M: Measurement>(c: &mut Criterion<M>) {
    let yaml = refund::policies();
    let def = PolicyDef {
        namespace: "payments".into(),
        name: "refund-limits".into(),
        version: "1.0.0".into(),
        scope: "tool:payments.issue-refund".into(),
        approvals_required: Some(1),
        reason: Some("Refund amount above delegated limit.".into()),
        cedar: Some(RUNTIME_CEDAR.into()),
        cedar_tools: std::collections::BTreeMap::from([(
            "payments.issue-refund".to_owned(),
            json!({"type": "object", "required": ["order_id", "amount", "currency"],
                   "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"},
                                  "currency": {"type": "string"}, "reason": {"type": "string"}}}),
        )]),
        ..PolicyDef::default()
    };
    let cedar = PolicySet::compile([def]).expect("the Cedar document compiles");
    let metadata = json!({"channel": "chat"});
    let claims = json!({"sub": "u-1", "roles": ["support"]});
    let mut group = c.benchmark_group("runtime_yaml_vs_cedar");
    group.throughput(Throughput::Elements(1));
    for amount in [100, 400, 14000] {
        let args = json!({"order_id": "ORD-1", "amount": amount, "currency": "EUR"});
        let tool = ToolCtx {
            r#ref: "payments.issue-refund",
            version: "1.0.0",
            side_effect_class: "irreversible_action",
            name: "issue_refund",
        };
        let req = Request::new(tool, &args)
            .with_agent(phrony_policy::AgentCtx {
                namespace: "support",
                name: "refund-agent",
                version: "0.1.0",
            })
            .with_session(phrony_policy::SessionCtx {
                id: "run_1",
                metadata: Some(&metadata),
            })
            .with_principal(&claims)
            .at(1_700_000_000);
        assert_eq!(
            yaml.evaluate(&req).kind(),
            cedar.evaluate(&req).kind(),
            "amount {amount}"
        );
        let label = format!("amount={amount}");
        group.bench_with_input(BenchmarkId::new("yaml", &label), &req, |b, req| {
            b.iter(|| black_box(yaml.evaluate(black_box(req)).kind()));
        });
        group.bench_with_input(BenchmarkId::new("cedar", &label), &req, |b, req| {
            b.iter(|| black_box(cedar.evaluate(black_box(req)).kind()));
        });
    }
    group.finish();
}

fn bench_all<M: Measurement>(c: &mut Criterion<M>) {
    bench(c);
    runtime_path(c);
}

fn main() {
    cpu_time::run(bench_all, bench_all);
}
