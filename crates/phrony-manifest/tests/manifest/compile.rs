//! Compilation (§1.9): the tutorial's refund agent, ref resolution with version candidates,
//! Tool document merging, policy attachment, scoping and the deny-wins merge.

use phrony_manifest::{CompiledAgent, CompiledPolicy, SecretRequirement, load_agent};
use phrony_policy::{DecisionKind, Request, ToolCtx};
use serde_json::{Value, json};

use crate::support::{MINIMAL_AGENT, Project, fixture};

/// Decides a call with the agent's policy engine: (decision, deciding policy).
fn decide(agent: &CompiledAgent, tool_ref: &str, args: Value) -> (DecisionKind, Option<String>) {
    let set = agent.policy_set().unwrap();
    let d = set.evaluate(&Request::new(ToolCtx::new(tool_ref), &args));
    (d.kind(), d.policy().map(|p| p.id().to_string()))
}

#[test]
fn the_tutorial_refund_agent_compiles_with_versioned_policies() {
    let compiled = load_agent(fixture("refund-agent/agent.yaml")).unwrap();
    assert!(compiled.warnings.is_empty(), "{:?}", compiled.warnings);
    let agent = &compiled.agent;
    assert_eq!(agent.qualified_name(), "support/refund-agent");
    assert_eq!(agent.metadata.version, "0.1.0");

    let names: Vec<String> = agent
        .spec
        .policies
        .iter()
        .map(CompiledPolicy::qualified_name)
        .collect();
    assert_eq!(
        names,
        [
            "payments/refund-approval-boundary@1.0.0",
            "payments/refund-hard-limit@1.0.0"
        ]
    );
    // Attached through the issue_refund binding without a scope of their own: they govern that
    // binding only.
    assert!(
        agent
            .spec
            .policies
            .iter()
            .all(|p| p.scope == "tool:payments.issue-refund")
    );

    let tools: Vec<(&str, &str, &str, &str)> = agent
        .spec
        .tools
        .iter()
        .map(|t| {
            (
                t.reference.as_str(),
                t.wire_name.as_str(),
                t.version.as_str(),
                t.side_effect_class.as_str(),
            )
        })
        .collect();
    assert_eq!(
        tools,
        [
            ("orders.lookup-order", "lookup_order", "1.0.0", "read_only"),
            (
                "payments.issue-refund",
                "issue_refund",
                "1.0.0",
                "irreversible_action"
            ),
        ]
    );
    assert_eq!(
        agent.secret_requirements(),
        [SecretRequirement {
            name: "openai".into(),
            from_env: "OPENAI_API_KEY".into()
        }]
    );
    assert_eq!(
        agent.secret_requirements()[0].unset_message(),
        "secret \"openai\": OPENAI_API_KEY is not set in the local environment"
    );

    let refund = "payments.issue-refund";
    let boundary = Some("payments/refund-approval-boundary@1.0.0".to_owned());
    let limit = Some("payments/refund-hard-limit@1.0.0".to_owned());
    assert_eq!(
        decide(
            agent,
            refund,
            json!({"order_id": "ORD-1", "amount": 100, "currency": "EUR"})
        ),
        (DecisionKind::Allow, None)
    );
    assert_eq!(
        decide(
            agent,
            refund,
            json!({"order_id": "ORD-1", "amount": 400, "currency": "EUR"})
        ),
        (DecisionKind::RequireApproval, boundary)
    );
    assert_eq!(
        decide(
            agent,
            refund,
            json!({"order_id": "ORD-2", "amount": 14000, "currency": "EUR"})
        ),
        (DecisionKind::Deny, limit)
    );
    // Reads stay fast: the refund policies do not govern lookup_order.
    assert_eq!(
        decide(
            agent,
            "orders.lookup-order",
            json!({"order_id": "ORD-2", "amount": 14000})
        ),
        (DecisionKind::Allow, None)
    );
}

#[test]
fn refs_tool_documents_and_policies_are_resolved() {
    let agent = load_agent(fixture("agent-rules/valid.yaml")).unwrap().agent;
    assert_eq!(
        agent.spec.instructions.text, "You are prompt two.",
        "prompts/system-2.md, trimmed"
    );
    assert!(agent.spec.instructions.reference.is_empty());

    let pay = agent.tool_by_wire_name("pay").unwrap();
    assert_eq!(pay.reference, "payments.pay", "the @constraint is dropped");
    assert_eq!(
        (pay.version.as_str(), pay.description.as_str()),
        ("1.2.0", "Pay a payee.")
    );
    let lookup = agent.tool_by_wire_name("search_lookup").unwrap();
    assert_eq!(lookup.version, "2");
    assert_eq!(
        lookup
            .input_schema
            .as_ref()
            .unwrap()
            .inline
            .as_ref()
            .unwrap()
            .0,
        json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
        "a schema ref is inlined from schemas/lookup-input.json"
    );
    let web = agent.tool_by_wire_name("web_search").unwrap();
    assert_eq!(web.mcp.as_ref().unwrap().server, "search");
    assert!(web.version.is_empty(), "MCP bindings skip the tool catalog");

    let policies: Vec<(&str, &str, &str)> = agent
        .spec
        .policies
        .iter()
        .map(|p| (p.scope.as_str(), p.name.as_str(), p.action.as_str()))
        .collect();
    assert_eq!(
        policies,
        [
            ("", "big-pay", "require_approval"),
            (
                "agent",
                "authority-boundary-finance-controller",
                "require_approval"
            ),
            ("tool:payments.pay", "usd-only", "allow"),
        ],
        "sorted by (scope, name); the binding's own policies replace the Tool doc's defaults"
    );
    let boundary = &agent.spec.policies[1];
    assert_eq!(
        (boundary.authority_ref.as_str(), boundary.approvals_required),
        ("Finance Controller", 1)
    );
    assert_eq!(agent.spec.policies[2].allow_field, "currency");
    assert_eq!(
        agent.spec.policies[0].approvals_required, 1,
        "approval quorum defaults to 1"
    );

    let pay_ref = "payments.pay";
    assert_eq!(
        decide(&agent, pay_ref, json!({"amount": 5, "currency": "EUR"})).0,
        DecisionKind::Deny
    );
    assert_eq!(
        decide(&agent, pay_ref, json!({"amount": 5, "currency": "usd"})).0,
        DecisionKind::RequireApproval
    );
    assert_eq!(
        agent
            .output
            .as_ref()
            .unwrap()
            .schema
            .as_ref()
            .unwrap()
            .inline
            .as_ref()
            .unwrap()
            .0,
        json!({"type": "object"})
    );
}

fn agent_with_instructions(instructions: &str) -> String {
    format!(
        "apiVersion: phrony.com/v1\nkind: Agent\nmetadata: {{name: a, namespace: demo, version: 1.0.0}}\nspec:\n  purpose: p\n  instructions: {instructions}\n  model: {{provider: openai, name: gpt-4o}}\n"
    )
}

#[test]
fn version_candidates_are_tried_in_order() {
    let p = Project::new();
    p.write("prompts/p.md", "plain");
    p.write("prompts/p-2.md", "dash two");
    p.write("prompts/p/2.md", "dir two (shadowed by p-2.md)");
    p.write("prompts/p/3.md", "dir three");
    p.write("prompts/p/v4.md", "v-dir four");
    p.write("prompts/y.yaml", "content: from yaml content\n");
    p.write("prompts/y.yml", "text: shadowed by y.yaml\n");
    let cases = [
        ("{ref: prompts/p}", "plain"),
        ("{ref: prompts/p.md}", "plain"),
        ("{ref: prompts/p, version: 2}", "dash two"),
        ("{ref: prompts/p.md, version: '2'}", "dash two"),
        ("{ref: prompts/p, version: 2.0}", "dash two"),
        ("{ref: prompts/p, version: 3}", "dir three"),
        ("{ref: prompts/p, version: 4}", "v-dir four"),
        ("{ref: ./prompts/y}", "from yaml content"),
    ];
    for (instructions, want) in cases {
        p.write("agent.yaml", &agent_with_instructions(instructions));
        let agent = p
            .load("agent.yaml")
            .unwrap_or_else(|e| panic!("{instructions}: {e}"))
            .agent;
        assert_eq!(agent.spec.instructions.text, want, "{instructions}");
    }
    for (instructions, want) in [
        (
            "{ref: prompts/p, version: 5}",
            "ref \"prompts/p\" (version \"5\") not found in bundle directory",
        ),
        (
            "{ref: prompts/p.txt}",
            "ref \"prompts/p.txt\" not found in bundle directory",
        ),
        ("{ref: /etc/hostname}", "ref must be bundle-relative"),
        (
            "{ref: prompts/../../p.md}",
            "ref path escapes bundle directory",
        ),
        (
            "{ref: prompts/p, version: ../p}",
            "ref path escapes bundle directory",
        ),
    ] {
        p.write("agent.yaml", &agent_with_instructions(instructions));
        let err = p.load("agent.yaml").unwrap_err();
        let d = err.errors().next().unwrap();
        assert_eq!(d.path, "spec.instructions.ref", "{instructions}");
        assert!(d.message.starts_with(want), "{instructions}: {}", d.message);
    }
}

const TWO_TOOLS: &str = "\
apiVersion: phrony.com/v1
kind: Tool
metadata: {name: a, namespace: t, version: 1.0.0}
spec:
  default_policies: [p.unscoped]
";

fn tool_doc(name: &str) -> String {
    TWO_TOOLS.replace("name: a", &format!("name: {name}"))
}

fn policy_doc(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: phrony.com/v1\nkind: Policy\nmetadata: {{name: {name}, namespace: p, version: 1.0.0}}\nspec:\n{spec}"
    )
}

fn agent_doc(rest: &str) -> String {
    format!("{MINIMAL_AGENT}{rest}")
}

#[test]
fn unscoped_policies_attached_to_a_binding_govern_that_binding() {
    let p = Project::new();
    p.write("tools/a.yaml", &tool_doc("a"));
    p.write("tools/b.yaml", &tool_doc("b"));
    p.write(
        "policies/unscoped.yaml",
        &policy_doc(
            "unscoped",
            "  conditions: {field: n, op: gt, value: 1}\n  decision: {type: deny}\n",
        ),
    );

    // Through the Tool document's default_policies (the binding declares none).
    p.write("agent.yaml", &agent_doc("  tools:\n    - ref: t.a\n"));
    let agent = p.load("agent.yaml").unwrap().agent;
    assert_eq!(agent.spec.policies[0].scope, "tool:t.a");
    assert_eq!(
        decide(&agent, "t.b", json!({"n": 5})).0,
        DecisionKind::Allow
    );
    assert_eq!(decide(&agent, "t.a", json!({"n": 5})).0, DecisionKind::Deny);

    // Through spec.default_policies: agent-wide, as in the reference; later binding attachments
    // of the same document add nothing.
    p.write(
        "agent.yaml",
        &agent_doc("  default_policies: [p.unscoped]\n  tools:\n    - ref: t.a\n"),
    );
    let agent = p.load("agent.yaml").unwrap().agent;
    assert_eq!(agent.spec.policies.len(), 1);
    assert_eq!(agent.spec.policies[0].scope, "");

    // Through two bindings: one compiled policy cannot have two scopes.
    p.write(
        "agent.yaml",
        &agent_doc("  tools:\n    - ref: t.a\n    - ref: t.b\n"),
    );
    let err = p.load("agent.yaml").unwrap_err();
    let d = err.errors().next().unwrap();
    assert!(d.file.ends_with("tools/b.yaml"), "{d}");
    assert_eq!((d.line, d.path.as_str()), (5, "spec.default_policies[0]"));
    assert!(
        d.message
            .contains("is attached to several bindings (tool:t.a and tool:t.b)"),
        "{d}"
    );
}

#[test]
fn policy_names_must_be_unique_across_namespaces() {
    let p = Project::new();
    p.write(
        "policies/one.yaml",
        &policy_doc("same", "  scope: agent\n  decision: {type: deny}\n"),
    );
    p.write(
        "policies/two.yaml",
        &policy_doc("same", "  scope: agent\n  decision: {type: deny}\n")
            .replace("namespace: p", "namespace: q"),
    );
    p.write(
        "agent.yaml",
        &agent_doc("  default_policies: [p.same, q.same]\n"),
    );
    let err = p.load("agent.yaml").unwrap_err();
    let msgs: Vec<String> = err
        .errors()
        .map(|d| format!("{}:{} {}: {}", d.line, d.column, d.path, d.message))
        .collect();
    assert_eq!(
        msgs,
        [
            "8:30 spec.default_policies[1]: policy name \"same\" is used by both p.same and q.same; compiled policy names must be unique within an agent"
        ]
    );
}

#[test]
fn unconditional_approvals_and_allow_lists_are_merged_by_scope() {
    let p = Project::new();
    let approval = |name: &str, decision: &str| {
        policy_doc(name, &format!("  scope: agent\n  decision: {decision}\n"))
    };
    p.write("policies/a1.yaml", &approval("a1", "{type: require_approval, approvals_required: 2, timeout: {after_minutes: 30, default: allow}}"));
    p.write("policies/a2.yaml", &approval("a2", "{type: require_approval, reason: Second opinion., on_reject: fail, on_modify: revalidate, comprehension_required: true, allow_self_approval: true, timeout: {after_minutes: 10, default: escalate}}"));
    p.write(
        "policies/allow1.yaml",
        &policy_doc(
            "allow1",
            "  scope: agent\n  allow: [USD, EUR, GBP]\n  decision: {type: allow}\n",
        ),
    );
    p.write(
        "policies/allow2.yaml",
        &policy_doc(
            "allow2",
            "  scope: agent\n  allow: [eur, usd]\n  decision: {type: allow}\n",
        ),
    );
    p.write("policies/cond.yaml", &policy_doc("cond", "  scope: agent\n  conditions: {field: n, op: gt, value: 1}\n  decision: {type: require_approval, allow_self_approval: true}\n"));
    p.write(
        "agent.yaml",
        &agent_doc("  default_policies: [p.a1, p.a2, p.allow1, p.allow2, p.cond]\n").replace(
            "version: 1.0.0}",
            "version: 1.0.0, governance: {authority_boundaries: [CFO]}}",
        ),
    );
    let agent = p.load("agent.yaml").unwrap().agent;
    let names: Vec<&str> = agent
        .spec
        .policies
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["cond", "merged-allow-agent", "merged-approval-agent"]
    );

    let allow = &agent.spec.policies[1];
    assert_eq!(
        allow.allow,
        ["USD", "EUR"],
        "case-insensitive intersection, first list's order"
    );
    assert_eq!(allow.merged_from, ["p/allow1@1.0.0", "p/allow2@1.0.0"]);

    let merged = &agent.spec.policies[2];
    assert_eq!(merged.approvals_required, 2);
    assert_eq!(
        (merged.reason.as_str(), merged.authority_ref.as_str()),
        ("Second opinion.", "CFO")
    );
    assert_eq!(
        (merged.on_reject.as_str(), merged.on_modify.as_str()),
        ("fail", "revalidate")
    );
    assert!(merged.comprehension_required);
    assert!(
        !merged.allow_self_approval,
        "a merged approval opts out of separation of duties only when every policy does"
    );
    assert!(
        agent.spec.policies[0].allow_self_approval,
        "the opt-out reaches the snapshot"
    );
    let set = agent.policy_set().unwrap();
    assert!(
        set.policies()
            .iter()
            .any(|p| p.name() == "cond" && p.allow_self_approval()),
        "and the policy engine"
    );
    let t = merged.timeout.as_ref().unwrap();
    assert_eq!(
        (t.after_minutes, t.default_decision.as_str()),
        (10, "escalate"),
        "the strictest timeout"
    );
    assert_eq!(
        merged.merged_from,
        ["p/a1@1.0.0", "p/a2@1.0.0", "authority-boundary-cfo"]
    );
    assert!(merged.namespace.is_empty() && merged.version.is_empty());
    // The merged set is a valid policy set.
    assert_eq!(agent.policy_set().unwrap().len(), 3);
}

#[test]
fn disjoint_allow_lists_are_kept_apart_with_a_warning() {
    let p = Project::new();
    p.write(
        "policies/x.yaml",
        &policy_doc(
            "x",
            "  scope: agent\n  allow: [USD]\n  decision: {type: allow}\n",
        ),
    );
    p.write(
        "policies/y.yaml",
        &policy_doc(
            "y",
            "  scope: agent\n  allow: [EUR]\n  decision: {type: allow}\n",
        ),
    );
    p.write("agent.yaml", &agent_doc("  default_policies: [p.x, p.y]\n"));
    let compiled = p.load("agent.yaml").unwrap();
    assert_eq!(compiled.agent.spec.policies.len(), 2);
    assert_eq!(
        compiled.warnings[0].message,
        "the allow lists of p/x@1.0.0, p/y@1.0.0 (scope \"agent\") have no value in common: every call in that scope is denied"
    );
}

#[test]
fn policies_scoped_to_unbound_tools_are_warned_about() {
    let p = Project::new();
    p.write(
        "policies/ghost.yaml",
        &policy_doc("ghost", "  scope: tool:t.ghost\n  decision: {type: deny}\n"),
    );
    p.write("agent.yaml", &agent_doc("  default_policies: [p.ghost]\n"));
    let compiled = p.load("agent.yaml").unwrap();
    let w = &compiled.warnings[0];
    assert!(w.file.ends_with("policies/ghost.yaml"));
    assert_eq!(
        format!("{}:{} {}: {}", w.line, w.column, w.path, w.message),
        "5:10 spec.scope: tool \"t.ghost\" is not bound by agent demo/a; the policy never applies"
    );
}

#[test]
fn an_allow_list_scoped_to_an_unbound_tool_is_an_error() {
    let p = Project::new();
    p.write(
        "policies/usd.yaml",
        &policy_doc(
            "usd",
            "  scope: tool:t.ghost\n  allow: [USD]\n  decision: {type: allow}\n",
        ),
    );
    p.write("agent.yaml", &agent_doc("  default_policies: [p.usd]\n"));
    let err = p.load("agent.yaml").unwrap_err();
    let e = err.errors().next().unwrap();
    assert!(e.file.ends_with("policies/usd.yaml"));
    assert_eq!(
        format!("{}:{} {}: {}", e.line, e.column, e.path, e.message),
        "5:10 spec.scope: references undeclared tool ref t.ghost: agent demo/a does not bind it, \
         so the allow list could never apply"
    );
}

#[test]
fn an_agent_wide_allow_list_without_a_scope_compiles_to_scope_agent() {
    let p = Project::new();
    p.write(
        "policies/usd.yaml",
        &policy_doc("usd", "  allow: [USD]\n  decision: {type: allow}\n"),
    );
    p.write("agent.yaml", &agent_doc("  default_policies: [p.usd]\n"));
    // `Project::load` also checks that the snapshot validates (an allow list needs a scope).
    let agent = p.load("agent.yaml").unwrap().agent;
    let policy = &agent.spec.policies[0];
    assert_eq!(
        (policy.name.as_str(), policy.scope.as_str()),
        ("usd", "agent")
    );
}

#[test]
fn a_broken_document_is_named_when_its_id_is_not_found() {
    let p = Project::new();
    p.write(
        "policies/limit.yaml",
        "apiVersion: phrony.com/v1\nkind: Policy\nmetadata: {name: limit, namespace: p\nspec: {}\n",
    );
    p.write("agent.yaml", &agent_doc("  default_policies: [p.limit]\n"));
    let err = p.load("agent.yaml").unwrap_err();
    let lines: Vec<String> = err
        .errors()
        .map(|d| {
            format!(
                "{}:{}:{} {}",
                d.file.file_name().unwrap().to_string_lossy(),
                d.line,
                d.column,
                d.message
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            "limit.yaml:4:5 invalid YAML: while parsing a flow mapping, did not find expected ',' or '}'",
            "agent.yaml:8:22 policy \"p.limit\" not found in bundle policies/ (limit.yaml could not be read)",
        ]
    );
}

/// A binding whose side-effect class is unknown keeps it empty in the snapshot, like the
/// reference (the content hash must not change); the warning, not the snapshot, says it is
/// treated as irreversible_action (see `agent-rules/tool-doc-missing.yaml`).
#[test]
fn an_unknown_side_effect_class_stays_empty_in_the_snapshot() {
    let compiled = load_agent(fixture("agent-rules/tool-doc-missing.yaml")).unwrap();
    let tools = &compiled.agent.spec.tools;
    let classes: Vec<(String, &str)> = tools
        .iter()
        .map(|t| (t.wire_name(), t.side_effect_class.as_str()))
        .collect();
    assert_eq!(
        classes,
        [
            ("issue_refund".to_owned(), ""),
            ("payments_lookup-charge".to_owned(), "read_only"),
            ("note".to_owned(), ""),
        ]
    );
    let snapshot: Value = serde_json::from_slice(&compiled.agent.snapshot_json()).unwrap();
    assert_eq!(
        snapshot["spec"]["tools"][0],
        json!({"ref": "payments.issue-refund", "as": "issue_refund"})
    );
}

/// A binding's `timeout` wins over its Tool document's, which applies to bindings that set none;
/// it is compiled to milliseconds, hashed when set, and omitted (hash unchanged) when unset.
#[test]
fn a_binding_timeout_overrides_the_tool_documents_and_is_omitted_when_unset() {
    let p = Project::new();
    let tool = |name: &str, timeout: &str| {
        format!(
            "apiVersion: phrony.com/v1\nkind: Tool\nmetadata: {{name: {name}, namespace: demo, version: 1.0.0}}\nspec:\n  side_effect_class: read_only\n{timeout}"
        )
    };
    p.write("tools/slow.yaml", &tool("slow", "  timeout: 2m\n"));
    p.write("tools/plain.yaml", &tool("plain", ""));
    let agent = |bindings: &str| {
        format!(
            "apiVersion: phrony.com/v1\nkind: Agent\nmetadata: {{name: a, namespace: demo, version: 1.0.0}}\nspec:\n  purpose: p\n  instructions: {{text: hi}}\n  model: {{provider: openai, name: gpt-4o}}\n  tools:\n{bindings}"
        )
    };
    p.write(
        "agent.yaml",
        &agent(
            "    - ref: demo.slow@1.0.0\n    - ref: demo.slow\n      as: slow_fast\n      timeout: 1m30s\n    - ref: demo.plain\n      timeout: 45\n",
        ),
    );
    let compiled = p.load("agent.yaml").unwrap().agent;
    let timeouts: Vec<u64> = compiled.spec.tools.iter().map(|t| t.timeout_ms).collect();
    assert_eq!(timeouts, [120_000, 90_000, 45_000]);
    let json: Value = serde_json::from_slice(&compiled.snapshot_json()).unwrap();
    assert_eq!(json["spec"]["tools"][0]["timeout_ms"], json!(120_000));
    compiled.validate().unwrap();
    let again = CompiledAgent::from_snapshot_json(&compiled.snapshot_json()).unwrap();
    assert_eq!(again, compiled);

    // Without any timeout the snapshot has no such key, and the hash is the one of the same
    // agent compiled before the field existed (computed from the same bytes).
    p.write("agent.yaml", &agent("    - ref: demo.plain\n"));
    let plain = p.load("agent.yaml").unwrap().agent;
    let text = String::from_utf8(plain.canonical_json()).unwrap();
    assert!(!text.contains("timeout"), "{text}");
    let mut with = plain.clone();
    with.spec.tools[0].timeout_ms = 1_000;
    assert_ne!(with.content_hash(), plain.content_hash());

    // A snapshot from elsewhere is held to the same bound.
    with.spec.tools[0].timeout_ms = 25 * 3_600_000;
    let err = with.validate().unwrap_err().to_string();
    assert!(
        err.contains("spec.tools[0].timeout_ms: must be at most"),
        "{err}"
    );
}

#[test]
fn shadow_policies_reach_the_snapshot_unmerged_and_never_decide() {
    let p = Project::new();
    let approval = |name: &str, mode: &str| {
        policy_doc(
            name,
            &format!("  scope: agent\n{mode}  decision: {{type: require_approval}}\n"),
        )
    };
    p.write("policies/a1.yaml", &approval("a1", ""));
    p.write("policies/a2.yaml", &approval("a2", "  mode: enforce\n"));
    p.write("policies/s1.yaml", &approval("s1", "  mode: shadow\n"));
    p.write(
        "policies/deny.yaml",
        &policy_doc(
            "deny",
            "  mode: shadow\n  scope: agent\n  conditions: {field: n, op: gt, value: 1}\n  decision: {type: deny}\n",
        ),
    );
    p.write(
        "agent.yaml",
        &agent_doc("  default_policies: [p.a1, p.a2, p.s1, p.deny]\n"),
    );
    let agent = p.load("agent.yaml").unwrap().agent;
    let modes: Vec<(&str, &str)> = agent
        .spec
        .policies
        .iter()
        .map(|p| (p.name.as_str(), p.mode.as_str()))
        .collect();
    // The two enforced approvals merge (`mode: enforce` is stored as nothing); the shadow
    // approval stays apart, so it neither changes the merged one nor loses its name.
    assert_eq!(
        modes,
        [
            ("deny", "shadow"),
            ("merged-approval-agent", ""),
            ("s1", "shadow")
        ]
    );
    let snapshot = String::from_utf8(agent.snapshot_json()).unwrap();
    assert_eq!(
        snapshot.matches("\"mode\":\"shadow\"").count(),
        2,
        "{snapshot}"
    );
    assert!(!snapshot.contains("enforce"), "{snapshot}");
    let reread = CompiledAgent::from_snapshot_json(snapshot.as_bytes()).unwrap();
    assert_eq!(reread, agent);
    assert_ne!(
        agent.canonical_json(),
        {
            let mut enforced = agent.clone();
            for policy in &mut enforced.spec.policies {
                policy.mode.clear();
            }
            enforced.canonical_json()
        },
        "the mode changes what the agent does, so it is hashed"
    );

    let set = agent.policy_set().unwrap();
    assert_eq!(set.len(), 1);
    assert_eq!(set.shadow_policies().count(), 2);
    // Enforced: the merged approval. The shadow deny would have denied.
    let args = json!({"n": 5});
    let request = Request::new(ToolCtx::new("x.a"), &args);
    assert_eq!(
        decide(&agent, "x.a", args.clone()),
        (
            DecisionKind::RequireApproval,
            Some("merged-approval-agent".to_owned())
        )
    );
    let outcome = set
        .shadow(&request, DecisionKind::RequireApproval)
        .expect("the shadow deny would have changed it");
    assert_eq!(outcome.shadow.kind(), DecisionKind::Deny);
    assert_eq!(outcome.policy.id().to_string(), "p/deny@1.0.0");
}
