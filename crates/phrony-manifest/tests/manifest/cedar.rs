//! Cedar policy documents (`spec.cedar`): compiled into the snapshot (only when present),
//! validated against the tools' input schemas with file:line:column inside the block scalar,
//! decided by the runtime's policy set, analysed.

use std::path::Path;

use phrony_manifest::{CompiledAgent, Severity, load_agent};
use phrony_policy::{DecisionKind, Request};
use serde_json::{Value, json};

use crate::support::Project;

const TOOL: &str = "\
apiVersion: phrony.com/v1
kind: Tool
metadata: {name: issue-refund, namespace: payments, version: 1.0.0}
spec:
  side_effect_class: irreversible_action
  input_schema:
    inline:
      type: object
      properties:
        amount: {type: number}
        currency: {type: string}
      required: [amount]
";

const LOOKUP: &str = "\
apiVersion: phrony.com/v1
kind: Tool
metadata: {name: lookup, namespace: orders, version: 1.0.0}
spec:
  side_effect_class: read_only
";

fn agent(policies: &str) -> String {
    format!(
        "apiVersion: phrony.com/v1\nkind: Agent\nmetadata: {{name: a, namespace: demo, version: 1.0.0}}\nspec:\n  purpose: p\n  instructions: {{text: hi}}\n  model: {{provider: openai, name: gpt-4o}}\n  tools:\n    - ref: payments.issue-refund\n      as: refund\n    - ref: orders.lookup\n{policies}"
    )
}

fn cedar_policy(cedar: &str, extra: &str) -> String {
    let body: String = cedar.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: phrony.com/v1\nkind: Policy\nmetadata: {{name: limits, namespace: payments, version: 1.0.0}}\nspec:\n  scope: tool:payments.issue-refund\n  cedar: |\n{body}{extra}"
    )
}

fn project(policy: &str) -> Project {
    let p = Project::new();
    p.write("tools/refund.yaml", TOOL);
    p.write("tools/lookup.yaml", LOOKUP);
    p.write("policies/limits.yaml", policy);
    p.write(
        "agent.yaml",
        &agent("  default_policies: [payments.limits]\n"),
    );
    p
}

fn decide(agent: &CompiledAgent, args: &Value) -> DecisionKind {
    let set = agent.policy_set().unwrap();
    let binding = &agent.spec.tools[0];
    let wire = binding.wire_name();
    set.evaluate(&Request::new(binding.tool_ctx(&wire), args).at(1))
        .kind()
}

const GOOD: &str = "@id(\"refunds\")\npermit (principal, action == Action::\"payments.issue-refund\", resource);\n@id(\"big\") @escalate(\"finance\")\nforbid (principal, action, resource) when { context.args.amount.greaterThan(decimal(\"250.0\")) };";

#[test]
fn a_cedar_policy_reaches_the_snapshot_and_decides() {
    let p = project(&cedar_policy(
        GOOD,
        "  decision: {type: require_approval, approvals_required: 2}\n",
    ));
    let agent = p.load("agent.yaml").unwrap().agent;
    let policy = &agent.spec.policies[0];
    assert_eq!(policy.cedar.as_deref().map(str::trim), Some(GOOD));
    assert_eq!(
        (policy.action.as_str(), policy.approvals_required),
        ("require_approval", 2)
    );
    let snapshot = agent.snapshot_json();
    let reread = CompiledAgent::from_snapshot_json(&snapshot).unwrap();
    assert_eq!(reread, agent);
    reread.validate().unwrap();
    let mut changed = agent.clone();
    changed.spec.policies[0].cedar = Some(GOOD.replace("250.0", "300.0"));
    assert_ne!(changed.content_hash(), agent.content_hash());

    assert_eq!(decide(&agent, &json!({"amount": 100})), DecisionKind::Allow);
    assert_eq!(
        decide(&agent, &json!({"amount": 400})),
        DecisionKind::RequireApproval
    );
    assert_eq!(
        decide(&agent, &json!({"currency": "EUR"})),
        DecisionKind::Deny
    );

    // Without a decision block the Cedar policy escalates to one approval.
    let p = project(&cedar_policy(GOOD, ""));
    let agent = p.load("agent.yaml").unwrap().agent;
    assert_eq!(agent.spec.policies[0].approvals_required, 1);
}

/// The shadow-mode pattern: a policy without Cedar text serializes exactly as before the field
/// existed, so snapshots, content hashes and agent version ids of existing agents are unchanged.
#[test]
fn policies_without_cedar_keep_their_snapshot_bytes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies-examples/refund-agent");
    let agent = load_agent(dir.join("agent.yaml")).unwrap().agent;
    let snapshot = String::from_utf8(agent.snapshot_json()).unwrap();
    assert!(!snapshot.contains("cedar"), "{snapshot}");
    let canonical = String::from_utf8(agent.canonical_json()).unwrap();
    assert!(!canonical.contains("cedar"), "{canonical}");
    // Re-reading and re-writing keeps every byte (no default value is written out).
    let reread = CompiledAgent::from_snapshot_json(snapshot.as_bytes()).unwrap();
    assert_eq!(reread.snapshot_json(), snapshot.as_bytes());
    assert_eq!(reread.content_hash(), agent.content_hash());
}

#[test]
fn cedar_problems_point_into_the_block_scalar_all_at_once() {
    // Line 7 of the file is the first Cedar line (indent 4).
    let cedar = "@id(\"refunds\")\npermit (principal, action, resource)\nwhen { context.args.amout == 1 };\n@id(\"cur\") forbid (principal, action, resource) when { context.args.currency == 3 };";
    let p = project(&cedar_policy(
        cedar,
        "  decision: {type: require_approval}\n",
    ));
    let diags = p.load("agent.yaml").unwrap_err();
    let errors: Vec<_> = diags.errors().collect();
    assert_eq!(errors.len(), 3, "{diags}");
    let at = |d: &phrony_manifest::Diagnostic| (d.line, d.column, d.path.clone());
    // `context.args.amout` starts at column 8 of Cedar line 3 → file line 9, column 12.
    assert!(
        errors
            .iter()
            .any(|d| at(d) == (9, 12, "spec.cedar".into()) && d.message.contains("amout")),
        "{diags}"
    );
    assert!(
        errors
            .iter()
            .any(|d| d.line == 10 && d.message.contains("policy `cur`")),
        "{diags}"
    );
    assert!(
        errors
            .iter()
            .all(|d| d.file.ends_with("policies/limits.yaml")),
        "{diags}"
    );

    // A parse error is found checking the document on its own, also at its position.
    let p = project(&cedar_policy(
        "permit (principal, action, resource)\nwhen { context.args.amount > };",
        "  decision: {type: require_approval}\n",
    ));
    let diags = p.load("agent.yaml").unwrap_err();
    let errors: Vec<_> = diags.errors().collect();
    assert!(
        errors
            .iter()
            .any(|d| d.line == 8 && d.column > 4 && d.path == "spec.cedar"),
        "{diags}"
    );
}

#[test]
fn cedar_excludes_conditions_allow_lists_and_other_decisions() {
    let p = project(&cedar_policy(
        GOOD,
        "  conditions: {field: amount, op: gt, value: 1}\n  decision: {type: deny}\n",
    ));
    let diags = p.load("agent.yaml").unwrap_err().to_string();
    assert!(
        diags.contains("spec.conditions: a Cedar policy has no conditions"),
        "{diags}"
    );
    assert!(
        diags.contains("spec.decision.type: a Cedar policy's effect is computed by Cedar"),
        "{diags}"
    );
}

#[test]
fn analysis_warns_when_no_permit_applies_to_a_tool_in_scope() {
    let mut policy = cedar_policy(
        "@id(\"refunds\")\npermit (principal, action == Action::\"payments.issue-refund\", resource);",
        "  decision: {type: require_approval}\n",
    );
    policy = policy.replace("  scope: tool:payments.issue-refund\n", "  scope: agent\n");
    let p = project(&policy);
    let compiled = p.load("agent.yaml").unwrap();
    let findings: Vec<_> = compiled
        .findings
        .iter()
        .filter(|f| f.kind.as_str() == "cedar_no_permit")
        .collect();
    assert_eq!(findings.len(), 1, "{:?}", compiled.findings);
    let d = &findings[0].diagnostic;
    assert_eq!(d.severity, Severity::Warning);
    assert!(d.message.contains("orders.lookup"), "{}", d.message);
    assert!(d.file.ends_with("policies/limits.yaml"));
    // And indeed: the lookup tool is denied.
    let set = compiled.agent.policy_set().unwrap();
    let args = json!({});
    let lookup = &compiled.agent.spec.tools[1];
    let wire = lookup.wire_name();
    assert_eq!(
        set.evaluate(&Request::new(lookup.tool_ctx(&wire), &args).at(1))
            .kind(),
        DecisionKind::Deny
    );
}

/// A permit whose principal scope no caller can be in (the principal is a `Principal::"<sub>"`
/// in no other entity) permits nothing: the tool is reported, and indeed denied; a permit
/// scoped to one principal still applies to a tool (to that principal's calls).
#[test]
fn analysis_counts_principal_scopes_of_permits() {
    let findings_for = |cedar: &str| {
        let p = project(&cedar_policy(
            cedar,
            "  decision: {type: require_approval}\n",
        ));
        let compiled = p.load("agent.yaml").unwrap();
        let messages: Vec<String> = compiled
            .findings
            .iter()
            .filter(|f| f.kind.as_str() == "cedar_no_permit")
            .map(|f| f.diagnostic.message.clone())
            .collect();
        (compiled.agent, messages)
    };
    for never in [
        "@id(\"sessions\")\npermit (principal in Session::\"vip\", action, resource);",
        "@id(\"tools\")\npermit (principal == Tool::\"payments.issue-refund\", action, resource);",
        "@id(\"typed\")\npermit (principal is Session, action, resource);",
    ] {
        let (agent, messages) = findings_for(never);
        assert_eq!(messages.len(), 1, "{never}: {messages:?}");
        assert!(
            messages[0].contains("payments.issue-refund"),
            "{}",
            messages[0]
        );
        assert_eq!(
            decide(&agent, &json!({"amount": 1})),
            DecisionKind::Deny,
            "{never}"
        );
    }
    for applies in [
        "@id(\"alice\")\npermit (principal == Principal::\"alice\", action, resource);",
        "@id(\"anyone\")\npermit (principal is Principal, action, resource);",
        "@id(\"in-self\")\npermit (principal is Principal in Principal::\"bob\", action, resource);",
    ] {
        let (_, messages) = findings_for(applies);
        assert!(messages.is_empty(), "{applies}: {messages:?}");
    }
}
