//! The data-driven test of `policies-examples/`: every example compiles without a warning, and
//! every call of its `cases.yaml` gets the expected decision from the real policy engine.
//!
//! A case is `{name, tool, args, context?, expect, policy?, approvals_required?, on_reject?,
//! message_contains?, hidden?}`; `hidden` (tool visibility) says whether policy denies every call
//! of the tool in the case's context whatever its arguments (`PolicySet::hidden_tool`), so the
//! runtime does not offer it to the model; `tool` is a wire name or a logical id, `context` is what
//! `phrony policies check --context` takes. All mismatches of all examples are reported at once.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers as well as tests: a panic is a failed assertion, with its message"
)]

use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use phrony_manifest::{CompiledAgent, ToolBinding};
use phrony_policy::{AgentCtx, Decision, EarlierCall, HistoryFacts, Request, SessionCtx};
use serde::Deserialize;
use serde_json::Value;
use tests::{example_dirs, yaml_files, yaml_to_json, yaml_with_merges};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    tool: String,
    #[serde(default = "empty_object")]
    args: Value,
    #[serde(default)]
    context: Context,
    expect: Expect,
    policy: Option<String>,
    approvals_required: Option<u32>,
    on_reject: Option<String>,
    message_contains: Option<String>,
    hidden: Option<bool>,
    /// What the example's `mode: shadow` policies would have made of the call (absent: they
    /// would change nothing).
    shadow: Option<Expect>,
    /// The shadow policy responsible (required with `shadow`).
    shadow_policy: Option<String>,
    /// Earlier calls the example's history-aware conditions see (absent: none).
    #[serde(default)]
    history: Vec<Earlier>,
}

/// One earlier call of a case's `history`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Earlier {
    tool: String,
    #[serde(default = "empty_object")]
    args: Value,
    result: Option<Value>,
    /// Its session id (default: the case's).
    session: Option<String>,
    /// When it was decided (RFC 3339 or Unix seconds; default: inside every window).
    at: Option<Value>,
    /// `succeeded` (default) or `reserved` (allowed, not finished).
    #[serde(default)]
    outcome: EarlierOutcome,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum EarlierOutcome {
    #[default]
    Succeeded,
    Reserved,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Expect {
    Allow,
    Deny,
    RequireApproval,
}

impl Expect {
    fn as_str(self) -> &'static str {
        match self {
            Expect::Allow => "allow",
            Expect::Deny => "deny",
            Expect::RequireApproval => "require_approval",
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Context {
    agent: Option<AgentIdentity>,
    session: Option<Session>,
    principal: Option<Value>,
    now: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentIdentity {
    namespace: String,
    name: String,
    #[serde(default)]
    version: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Session {
    #[serde(default)]
    id: String,
    metadata: Option<Value>,
}

/// `now` as Unix seconds: a number, or an RFC 3339 timestamp.
fn unix_seconds(now: &Value) -> Result<i64, String> {
    match now {
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| format!("now {n} is not whole seconds")),
        Value::String(s) => chrono::DateTime::parse_from_rfc3339(s)
            .map(|t| t.timestamp())
            .map_err(|e| format!("now {s:?}: {e}")),
        other => Err(format!(
            "now must be a number or an RFC 3339 string, got {other}"
        )),
    }
}

/// The binding a case calls: by wire name, else by logical id.
fn find_tool<'a>(agent: &'a CompiledAgent, name: &str) -> Option<&'a ToolBinding> {
    let tools = &agent.spec.tools;
    tools
        .iter()
        .find(|t| t.wire_name() == name)
        .or_else(|| tools.iter().find(|t| t.reference == name))
}

fn load_cases(dir: &Path) -> Result<Vec<Case>, String> {
    let path = dir.join("cases.yaml");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let json = yaml_with_merges(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_value(json).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every way the engine's answer to `case` differs from its expectation.
fn check_case(
    agent: &CompiledAgent,
    policies: &phrony_policy::PolicySet,
    case: &Case,
) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(binding) = find_tool(agent, &case.tool) else {
        return vec![format!("no tool {:?} in the agent", case.tool)];
    };
    let wire_name = binding.wire_name();
    let tool = binding.tool_ctx(&wire_name);
    let agent_ctx = match &case.context.agent {
        Some(a) => AgentCtx {
            namespace: &a.namespace,
            name: &a.name,
            version: &a.version,
        },
        None => agent.agent_ctx(),
    };
    let mut request = Request::new(tool, &case.args).with_agent(agent_ctx);
    if let Some(s) = &case.context.session {
        request = request.with_session(SessionCtx {
            id: &s.id,
            metadata: s.metadata.as_ref(),
        });
    }
    if let Some(p) = &case.context.principal {
        request = request.with_principal(p);
    }
    if let Some(now) = &case.context.now {
        match unix_seconds(now) {
            Ok(t) => request = request.at(t),
            Err(e) => return vec![e],
        }
    }

    // The earlier calls, as the ledger index would answer for them.
    let agent_key = format!("{}/{}", agent_ctx.namespace, agent_ctx.name);
    let session_id = case.context.session.as_ref().map_or("", |s| s.id.as_str());
    let mut earlier = Vec::with_capacity(case.history.len());
    let mut wires = Vec::with_capacity(case.history.len());
    for e in &case.history {
        let Some(b) = find_tool(agent, &e.tool) else {
            return vec![format!("history: no tool {:?} in the agent", e.tool)];
        };
        wires.push((b, b.wire_name()));
    }
    for (e, (b, wire)) in case.history.iter().zip(&wires) {
        let at_unix = match e.at.as_ref().map(unix_seconds).transpose() {
            Ok(t) => t,
            Err(err) => return vec![format!("history: {err}")],
        };
        earlier.push(EarlierCall {
            tool: b.tool_ctx(wire),
            args: &e.args,
            result: e.result.as_ref(),
            session: e.session.as_deref().unwrap_or(session_id),
            agent: &agent_key,
            at_unix,
            committed: e.outcome == EarlierOutcome::Succeeded,
        });
    }
    if !case.history.is_empty() && !policies.has_history() {
        problems.push("`history` is set but no policy has a history condition".to_owned());
    }
    let facts = HistoryFacts::from_calls(policies, &request, &earlier);
    if policies.has_history() {
        request = request.with_history(&facts);
    }

    if let Some(want) = case.hidden {
        check_visibility(policies, &request, want, case.expect, &mut problems);
    }
    let decision = policies.evaluate(&request);
    let kind = decision.kind().as_str();
    if kind != case.expect.as_str() {
        problems.push(format!(
            "decision is {kind}, expected {}",
            case.expect.as_str()
        ));
    }
    let got_policy = decision.policy().map(|p| p.id().to_string());
    match (&case.policy, case.expect) {
        (Some(_), Expect::Allow) => problems.push("`policy` is set on an allow case".to_owned()),
        (None, Expect::Deny | Expect::RequireApproval) => {
            problems.push("a deny or require_approval case must name its `policy`".to_owned());
        }
        (Some(want), _) if got_policy.as_deref() != Some(want.as_str()) => {
            problems.push(format!(
                "deciding policy is {got_policy:?}, expected {want:?}"
            ));
        }
        _ => {}
    }
    if case.expect != Expect::RequireApproval
        && (case.approvals_required.is_some() || case.on_reject.is_some())
    {
        problems.push("approvals_required / on_reject only go with require_approval".to_owned());
    }
    if let Decision::RequireApproval { policy } = &decision {
        if let Some(want) = case.approvals_required
            && policy.approvals_required() != want
        {
            problems.push(format!(
                "approvals_required is {}, expected {want}",
                policy.approvals_required()
            ));
        }
        if let Some(want) = &case.on_reject
            && policy.on_reject().as_str() != want
        {
            problems.push(format!(
                "on_reject is {}, expected {want}",
                policy.on_reject().as_str()
            ));
        }
    }
    if let Some(needle) = &case.message_contains {
        let reason = decision.reason().unwrap_or_default();
        if !reason.contains(needle.as_str()) {
            problems.push(format!("reason {reason:?} does not contain {needle:?}"));
        }
    }
    let shadow = policies.shadow(&request, decision.kind());
    let got = shadow
        .as_ref()
        .map(|s| (s.shadow.kind().as_str(), s.policy.id().to_string()));
    let want = case
        .shadow
        .map(|k| (k.as_str(), case.shadow_policy.clone()));
    match (got, want) {
        (None, None) => {}
        (Some((kind, policy)), Some((want_kind, want_policy)))
            if kind == want_kind && want_policy.as_deref() == Some(policy.as_str()) => {}
        (got, want) => problems.push(format!(
            "the shadow policies would change the call to {got:?}, expected {want:?} (`shadow` \
             and `shadow_policy`)"
        )),
    }
    problems
}

/// Whether the case's tool is hidden in its context as `want` says (visibility does not read
/// the case's arguments). A hidden tool's case must expect a deny.
fn check_visibility(
    policies: &phrony_policy::PolicySet,
    request: &Request<'_>,
    want: bool,
    expect: Expect,
    problems: &mut Vec<String>,
) {
    match (
        policies.hidden_tool(request).map(|p| p.id().to_string()),
        want,
    ) {
        (Some(policy), false) => {
            problems.push(format!(
                "the tool is hidden (by {policy}), expected it offered"
            ));
        }
        (None, true) => problems.push("the tool is offered, expected it hidden".to_owned()),
        _ => {}
    }
    if want && expect != Expect::Deny {
        problems.push("a hidden tool's case must expect deny".to_owned());
    }
}

/// An example's `agent.yaml`, compiled; in a bundle example (a `bundle.yaml` beside it, whose
/// root it is) as the bundle compiles it, with every member's warnings and a committed lock that
/// must match the closure.
fn load_example(dir: &Path) -> Result<phrony_manifest::Compiled, phrony_manifest::Diagnostics> {
    let bundle = dir.join("bundle.yaml");
    if !bundle.is_file() {
        return phrony_manifest::load_agent(dir.join("agent.yaml"));
    }
    let validated = phrony_manifest::validate_bundle(&bundle, true)?;
    let root = validated.bundle.members.into_iter().next();
    let agent = root
        .and_then(|m| m.vendored)
        .map(|(_, agent)| agent)
        .unwrap_or_else(|| panic!("{}: the bundle's root is not a local member", dir.display()));
    Ok(phrony_manifest::Compiled {
        agent,
        warnings: validated.bundle.warnings,
        // Bundles do not run the policy analysis (`policies check --analyze` takes an agent).
        findings: Vec::new(),
    })
}

#[test]
fn every_example_case_gets_its_expected_decision() {
    let mut report = String::new();
    let mut total = 0;
    for dir in example_dirs() {
        let example = dir.file_name().unwrap().to_string_lossy().into_owned();
        let agent = match load_example(&dir) {
            Ok(compiled) => compiled.agent,
            Err(diags) => {
                let _ = writeln!(report, "{example}: the agent does not compile:\n{diags}");
                continue;
            }
        };
        let policies = agent.policy_set().unwrap();
        let cases = match load_cases(&dir) {
            Ok(cases) if cases.is_empty() => {
                let _ = writeln!(report, "{example}: cases.yaml has no cases");
                continue;
            }
            Ok(cases) => cases,
            Err(e) => {
                let _ = writeln!(report, "{example}: {e}");
                continue;
            }
        };
        let mut names = HashSet::new();
        for case in &cases {
            total += 1;
            let mut problems = check_case(&agent, &policies, case);
            if !names.insert(case.name.as_str()) {
                problems.push("duplicate case name".to_owned());
            }
            for problem in problems {
                let _ = writeln!(report, "{example}: {}: {problem}", case.name);
            }
        }
    }
    assert!(report.is_empty(), "mismatches:\n{report}");
    assert!(total >= 50, "only {total} cases found");
}

/// refund-agent's own cases, run against refund-agent-cedar (its policies written in Cedar):
/// every call gets the same decision kind and quorum from both agents, and meets the YAML
/// case's expectations with the Cedar document in place of the two YAML ones.
#[test]
fn the_cedar_refund_agent_decides_like_the_yaml_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies-examples");
    let yaml = load_example(&root.join("refund-agent")).unwrap().agent;
    let cedar = load_example(&root.join("refund-agent-cedar"))
        .unwrap()
        .agent;
    let (yaml_set, cedar_set) = (yaml.policy_set().unwrap(), cedar.policy_set().unwrap());
    assert!(
        cedar_set
            .policies()
            .iter()
            .any(phrony_policy::Policy::is_cedar)
    );
    let mut cases = load_cases(&root.join("refund-agent")).unwrap();
    assert!(cases.len() >= 8, "{} cases", cases.len());
    let mut report = String::new();
    let quorum = |d: &Decision<'_>| match d {
        Decision::RequireApproval { policy } => Some(policy.approvals_required()),
        _ => None,
    };
    for case in &mut cases {
        // The two YAML policies are one Cedar document.
        if let Some(p) = &mut case.policy {
            assert!(
                [
                    "payments/refund-approval-boundary@1.0.0",
                    "payments/refund-hard-limit@1.0.0"
                ]
                .contains(&p.as_str()),
                "{p}"
            );
            *p = "payments/refund-limits@1.0.0".to_owned();
        }
        for problem in check_case(&cedar, &cedar_set, case) {
            let _ = writeln!(report, "{}: {problem}", case.name);
        }
        let (yb, cb) = (find_tool(&yaml, &case.tool), find_tool(&cedar, &case.tool));
        let (Some(yb), Some(cb)) = (yb, cb) else {
            let _ = writeln!(report, "{}: tool {} not bound", case.name, case.tool);
            continue;
        };
        let (yw, cw) = (yb.wire_name(), cb.wire_name());
        let y = yaml_set.evaluate(&Request::new(yb.tool_ctx(&yw), &case.args).at(1_700_000_000));
        let c = cedar_set.evaluate(&Request::new(cb.tool_ctx(&cw), &case.args).at(1_700_000_000));
        if (y.kind(), quorum(&y)) != (c.kind(), quorum(&c)) {
            let _ = writeln!(
                report,
                "{}: YAML {:?} quorum {:?}, Cedar {:?} quorum {:?}",
                case.name,
                y.kind(),
                quorum(&y),
                c.kind(),
                quorum(&c)
            );
        }
    }
    assert!(report.is_empty(), "mismatches:\n{report}");
}

/// refund-cumulative's own cases, run against refund-cumulative-cedar (its two history-aware
/// policies written in Cedar over named history facts): every case gets the same decision,
/// deciding policy and message from both.
#[test]
fn the_cedar_cumulative_refund_agent_decides_like_the_yaml_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies-examples");
    let yaml = load_example(&root.join("refund-cumulative")).unwrap().agent;
    let cedar = load_example(&root.join("refund-cumulative-cedar"))
        .unwrap()
        .agent;
    let (yaml_set, cedar_set) = (yaml.policy_set().unwrap(), cedar.policy_set().unwrap());
    assert!(
        cedar_set
            .policies()
            .iter()
            .all(|p| p.is_cedar() && p.reads_history())
    );
    assert!(
        !yaml_set
            .policies()
            .iter()
            .any(phrony_policy::Policy::is_cedar)
    );
    // The same queries (so the ledger's index is shared), asked by Cedar facts or by leaves.
    let keys = |set: &phrony_policy::PolicySet| {
        let mut k: Vec<String> = set
            .history_queries()
            .iter()
            .map(|q| q.key().to_owned())
            .collect();
        k.sort();
        k
    };
    assert_eq!(keys(&yaml_set), keys(&cedar_set));
    let cases = load_cases(&root.join("refund-cumulative")).unwrap();
    assert!(cases.len() >= 10, "{} cases", cases.len());
    let mut report = String::new();
    for case in &cases {
        for (which, agent, set) in [("YAML", &yaml, &yaml_set), ("Cedar", &cedar, &cedar_set)] {
            for problem in check_case(agent, set, case) {
                let _ = writeln!(report, "{which}: {}: {problem}", case.name);
            }
        }
    }
    assert!(report.is_empty(), "mismatches:\n{report}");
}

#[test]
fn every_example_compiles_without_warnings() {
    let mut report = String::new();
    let dirs = example_dirs();
    for dir in &dirs {
        match load_example(dir) {
            Ok(compiled) => {
                for warning in compiled.warnings {
                    let _ = writeln!(report, "{warning}");
                }
            }
            Err(diags) => {
                let _ = writeln!(report, "{diags}");
            }
        }
    }
    assert!(report.is_empty(), "{report}");
    let names: Vec<String> = dirs
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for required in ["refund-agent", "weather-alert"] {
        assert!(
            names.iter().any(|n| n == required),
            "missing example {required}: {names:?}"
        );
    }
}

/// What the examples' policies use, gathered from their YAML.
#[derive(Debug, Default)]
struct Coverage {
    ops: BTreeSet<String>,
    decisions: BTreeSet<String>,
    features: BTreeSet<&'static str>,
}

impl Coverage {
    fn condition(&mut self, node: &Value) {
        let Some(map) = node.as_object() else { return };
        for (combinator, feature) in [("all", "all"), ("any", "any")] {
            if let Some(children) = map.get(combinator).and_then(Value::as_array) {
                self.features.insert(feature);
                children.iter().for_each(|c| self.condition(c));
            }
        }
        if let Some(inner) = map.get("not") {
            self.features.insert("not");
            self.condition(inner);
        }
        if let Some(field) = map.get("field").and_then(Value::as_str) {
            if let Some(op) = map.get("op").and_then(Value::as_str) {
                self.ops.insert(op.to_owned());
            }
            for (needle, feature) in [
                ("[any]", "path [any]"),
                ("[all]", "path [all]"),
                ("[0]", "path [index]"),
                ("phrony.tool.", "phrony.tool.*"),
                ("phrony.agent.", "phrony.agent.*"),
                ("phrony.session.metadata.", "phrony.session.metadata.*"),
                ("phrony.principal.", "phrony.principal.*"),
                ("phrony.time.", "phrony.time.*"),
            ] {
                if field.contains(needle) {
                    self.features.insert(feature);
                }
            }
        }
    }

    fn policy(&mut self, doc: &Value) {
        let spec = &doc["spec"];
        self.condition(&spec["conditions"]);
        let decision = &spec["decision"];
        let kind = decision["type"].as_str().unwrap_or_default();
        self.decisions.insert(kind.to_owned());
        let quorum = decision["approvals_required"].as_i64().unwrap_or(1);
        for (present, feature) in [
            (spec.get("allow_field").is_some(), "allow_field"),
            (kind == "escalate" && quorum > 1, "escalate with quorum"),
            (
                kind == "require_approval" && quorum > 1,
                "require_approval with quorum",
            ),
            (decision["on_reject"] == "fail", "on_reject fail"),
            (
                decision["on_modify"] == "revalidate",
                "on_modify revalidate",
            ),
            (decision.get("timeout").is_some(), "timeout"),
            (spec["scope"] == "agent", "scope agent"),
            (
                spec["scope"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("tool:")),
                "scope tool",
            ),
        ] {
            if present {
                self.features.insert(feature);
            }
        }
    }
}

#[test]
fn the_examples_cover_every_operator_and_decision_type() {
    let mut coverage = Coverage::default();
    for dir in example_dirs() {
        for path in yaml_files(&dir) {
            let doc = yaml_to_json(&path).unwrap();
            match doc["kind"].as_str() {
                Some("Policy") => coverage.policy(&doc),
                Some("Agent") => {
                    let boundaries = &doc["metadata"]["governance"]["authority_boundaries"];
                    if boundaries.as_array().is_some_and(|b| !b.is_empty()) {
                        coverage.features.insert("authority boundaries");
                    }
                    if doc["spec"]["default_policies"].is_array() {
                        coverage.features.insert("default_policies");
                    }
                }
                _ => {}
            }
        }
    }
    let ops = [
        "eq",
        "==",
        "neq",
        "!=",
        "gt",
        ">",
        "gte",
        ">=",
        "lt",
        "<",
        "lte",
        "<=",
        "in",
        "not_in",
        "matches",
        "exists",
        "contains",
        "starts_with",
        "ends_with",
    ];
    let missing: Vec<&str> = ops
        .into_iter()
        .filter(|op| !coverage.ops.contains(*op))
        .collect();
    assert!(
        missing.is_empty(),
        "no example uses the operators {missing:?}"
    );
    let decisions = ["allow", "deny", "block", "require_approval", "escalate"];
    let missing: Vec<&str> = decisions
        .into_iter()
        .filter(|d| !coverage.decisions.contains(*d))
        .collect();
    assert!(
        missing.is_empty(),
        "no example uses the decision types {missing:?}"
    );
    let features = [
        "all",
        "any",
        "not",
        "path [any]",
        "path [all]",
        "path [index]",
        "phrony.tool.*",
        "phrony.agent.*",
        "phrony.session.metadata.*",
        "phrony.principal.*",
        "phrony.time.*",
        "allow_field",
        "escalate with quorum",
        "require_approval with quorum",
        "on_reject fail",
        "on_modify revalidate",
        "timeout",
        "scope agent",
        "scope tool",
        "authority boundaries",
        "default_policies",
    ];
    let missing: Vec<&str> = features
        .into_iter()
        .filter(|f| !coverage.features.contains(f))
        .collect();
    assert!(missing.is_empty(), "no example covers {missing:?}");
}
