//! Static analysis of an agent's policies: conditions that can never match the tool's
//! `input_schema`, conditions that can never hold, policies that never decide and allow lists
//! that allow everything.
//!
//! The analysis reads the policies as compiled for the agent (effective scopes) together with
//! the Policy documents they came from (for `file:line:column`) and the bound tools' input
//! schemas. Every [`Finding`] is a warning: the policies are valid, but some part of them has no
//! effect. `phrony agents validate` prints them (`--deny-warnings` makes them fatal) and
//! `phrony policies check --analyze` lists them.

use std::collections::HashSet;
use std::fmt;

use serde_json::{Map, Value, json};

use crate::diag::{Diagnostic, Severity};
use crate::doc::Source;
use crate::model::compiled::{CompiledPolicy, ToolBinding};
use crate::policy_bridge::{def_from_compiled, is_approval};

/// What a [`Finding`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A condition reads an argument the tool's `input_schema` does not declare.
    UnknownField,
    /// A condition compares an argument with a value or operator its schema type cannot match.
    TypeMismatch,
    /// An `all` holds conditions on one field that can never hold together.
    Unsatisfiable,
    /// Every call the policy matches is already denied by an unconditional `deny`.
    NeverDecides,
    /// An allow list lists every value the checked field's schema allows.
    AlwaysAllow,
    /// Two approval policies match the same call and only one's quorum / route is used.
    OverlappingApproval,
    /// No `permit` of a Cedar policy applies to a tool in its scope: every call is denied.
    CedarNoPermit,
    /// A history condition that cannot work as written: `calls` names no tool of the agent, a
    /// `same`/`of` path the tool's `input_schema` does not declare, or a history leaf whose
    /// fail-closed answer (it holds when it cannot be answered) would allow: under `not`, or in
    /// an `allow` policy.
    History,
}

impl FindingKind {
    /// The kind's name, as in JSON output (`unknown_field`, …).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownField => "unknown_field",
            Self::TypeMismatch => "type_mismatch",
            Self::Unsatisfiable => "unsatisfiable",
            Self::NeverDecides => "never_decides",
            Self::AlwaysAllow => "always_allow",
            Self::OverlappingApproval => "overlapping_approval",
            Self::CedarNoPermit => "cedar_no_permit",
            Self::History => "history",
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One warning of the policy analysis.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// What kind of problem it is.
    pub kind: FindingKind,
    /// Where (the Policy document, `line:column`, field path) and what, as a warning.
    pub diagnostic: Diagnostic,
    /// A call that shows the problem, `{"tool": <wire name>, "arguments": {…}}`, when one can be
    /// built.
    pub example: Option<Value>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.diagnostic, self.kind)?;
        if let Some(example) = &self.example {
            write!(f, "\n  example call: {example}")?;
        }
        Ok(())
    }
}

impl Finding {
    /// The finding as JSON: kind, file, line, column, path, message and example.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let d = &self.diagnostic;
        json!({
            "kind": self.kind,
            "file": d.file.display().to_string(),
            "line": d.line,
            "column": d.column,
            "path": d.path,
            "message": d.message,
            "example": self.example,
        })
    }
}

/// A compiled policy with the document it came from.
pub(crate) struct Subject<'a> {
    pub(crate) policy: &'a CompiledPolicy,
    pub(crate) src: &'a Source,
}

/// Runs every check over the agent's policies.
pub(crate) fn analyze(subjects: &[Subject<'_>], tools: &[ToolBinding]) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in subjects {
        let Some(conditions) = s.policy.conditions.as_ref().map(|c| &c.0) else {
            continue;
        };
        let mut leaves = Vec::new();
        collect_leaves(conditions, "spec.conditions", &mut leaves);
        if let Some(tool) = scoped_tool(s.policy, tools)
            && let Some(schema) = tool.input_schema.as_ref().and_then(|x| x.inline.as_ref())
        {
            for leaf in &leaves {
                check_leaf_schema(s, tool, &schema.0, leaf, &mut out);
            }
        }
        check_unsatisfiable(s, conditions, "spec.conditions", &mut out);
        check_history(s, tools, conditions, "spec.conditions", false, &mut out);
    }
    check_shadowed(subjects, tools, &mut out);
    check_always_allow(subjects, tools, &mut out);
    check_overlapping_approvals(subjects, tools, &mut out);
    check_cedar_permits(subjects, tools, &mut out);
    out.sort_by(|a, b| {
        let (x, y) = (&a.diagnostic, &b.diagnostic);
        (&x.file, x.line, x.column).cmp(&(&y.file, y.line, y.column))
    });
    out
}

fn finding(
    kind: FindingKind,
    src: &Source,
    path: &str,
    message: String,
    example: Option<Value>,
) -> Finding {
    let mark = src.pos.locate(path);
    Finding {
        kind,
        diagnostic: Diagnostic {
            severity: Severity::Warning,
            file: src.path.clone(),
            line: mark.line,
            column: mark.column,
            path: path.to_owned(),
            message,
        },
        example,
    }
}

/// The binding a `tool:` scope names.
fn scoped_tool<'t>(p: &CompiledPolicy, tools: &'t [ToolBinding]) -> Option<&'t ToolBinding> {
    let target = p.scope.strip_prefix("tool:")?;
    tools.iter().find(|t| t.reference == target)
}

/// Whether the policy is `mode: shadow` (evaluated and recorded, never enforced).
fn is_shadow(p: &CompiledPolicy) -> bool {
    p.mode == "shadow"
}

fn agent_wide(p: &CompiledPolicy) -> bool {
    p.scope.is_empty() || p.scope == "agent"
}

// ---------------------------------------------------------------------------------------------
// Leaves and paths

/// One `field`/`op`/`value` node.
#[derive(Debug)]
struct Leaf<'v> {
    /// Document path of the node (`spec.conditions.all[1]`).
    at: String,
    field: &'v str,
    /// Canonical operator name.
    op: &'static str,
    value: Option<&'v Value>,
}

impl Leaf<'_> {
    fn describe(&self) -> String {
        match self.value {
            Some(v) => format!("`{} {} {v}`", self.field, self.op),
            None => format!("`{} {}`", self.field, self.op),
        }
    }
}

fn canonical_op(op: &str) -> Option<&'static str> {
    Some(match op.trim() {
        "eq" | "==" => "eq",
        "neq" | "!=" => "neq",
        "gt" | ">" => "gt",
        "gte" | ">=" => "gte",
        "lt" | "<" => "lt",
        "lte" | "<=" => "lte",
        "in" => "in",
        "not_in" => "not_in",
        "matches" => "matches",
        "exists" => "exists",
        "contains" => "contains",
        "starts_with" => "starts_with",
        "ends_with" => "ends_with",
        _ => return None,
    })
}

fn leaf_of<'v>(m: &'v Map<String, Value>, at: &str) -> Option<Leaf<'v>> {
    let field = m.get("field")?.as_str()?.trim();
    let op = match m.get("op") {
        None => "eq",
        Some(v) => canonical_op(v.as_str()?)?,
    };
    Some(Leaf {
        at: at.to_owned(),
        field,
        op,
        value: m.get("value"),
    })
}

/// Every leaf under `v` (through `all`, `any` and `not`).
fn collect_leaves<'v>(v: &'v Value, at: &str, out: &mut Vec<Leaf<'v>>) {
    let Some(m) = v.as_object() else { return };
    for key in ["all", "any"] {
        if let Some(Value::Array(items)) = m.get(key) {
            for (i, item) in items.iter().enumerate() {
                collect_leaves(item, &format!("{at}.{key}[{i}]"), out);
            }
            return;
        }
    }
    if let Some(inner) = m.get("not") {
        collect_leaves(inner, &format!("{at}.not"), out);
        return;
    }
    out.extend(leaf_of(m, at));
}

/// The history leaves under `v`: `calls` must name a tool of the agent, `same` and `of` (an
/// argument path) must be declared by the schemas of the tools involved, and a leaf must not sit
/// under `not` or in an `allow` policy (where failing closed would allow).
fn check_history(
    s: &Subject<'_>,
    tools: &[ToolBinding],
    v: &Value,
    at: &str,
    negated: bool,
    out: &mut Vec<Finding>,
) {
    let Some(m) = v.as_object() else { return };
    for key in ["all", "any"] {
        if let Some(Value::Array(items)) = m.get(key) {
            for (i, item) in items.iter().enumerate() {
                check_history(s, tools, item, &format!("{at}.{key}[{i}]"), negated, out);
            }
            return;
        }
    }
    if let Some(inner) = m.get("not") {
        check_history(s, tools, inner, &format!("{at}.not"), !negated, out);
        return;
    }
    let Some(query) = m.get("history") else {
        return;
    };
    if negated || s.policy.action == "allow" {
        out.push(finding(
            FindingKind::History,
            s.src,
            &format!("{at}.history"),
            format!(
                "a history condition holds when it cannot be answered (fail-closed); {} it would \
                 let such a call through: write it as the condition of a deny or approval policy",
                if negated {
                    "under `not`"
                } else {
                    "in an `allow` policy"
                }
            ),
            None,
        ));
    }
    let own = scoped_tool(s.policy, tools);
    let mut sides = vec![(query, format!("{at}.history"))];
    if let Some(from) = m.get("value_from").and_then(|f| f.get("history")) {
        sides.push((from, format!("{at}.value_from.history")));
    }
    for (q, q_at) in sides {
        let calls = match q.get("calls").and_then(Value::as_str) {
            Some(name) => {
                let found = tools
                    .iter()
                    .find(|t| t.wire_name() == name || t.reference == name);
                if found.is_none() {
                    out.push(finding(
                        FindingKind::History,
                        s.src,
                        &format!("{q_at}.calls"),
                        format!(
                            "`calls: {name}` names no tool of this agent: no earlier call can match"
                        ),
                        None,
                    ));
                }
                found
            }
            None => own,
        };
        let mut paths: Vec<(String, String)> = q
            .get("same")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, p)| Some((p.as_str()?.to_owned(), format!("{q_at}.same[{i}]"))))
            .collect();
        let same_count = paths.len();
        if let Some(of) = q.get("of").and_then(Value::as_str)
            && !of.starts_with("result.")
        {
            paths.push((of.to_owned(), format!("{q_at}.of")));
        }
        for (i, (path, path_at)) in paths.iter().enumerate() {
            // `same` must be declared by the earlier call's tool and by this call's; `of` by
            // the earlier call's.
            let mut holders = vec![calls];
            if i < same_count && !matches!((calls, own), (Some(a), Some(b)) if std::ptr::eq(a, b)) {
                holders.push(own);
            }
            for tool in holders.into_iter().flatten() {
                let Some(schema) = tool.input_schema.as_ref().and_then(|x| x.inline.as_ref())
                else {
                    continue;
                };
                let Some(steps) = arg_steps(path) else {
                    continue;
                };
                if let Found::Missing { key, .. } = resolve(&schema.0, &steps) {
                    out.push(finding(
                        FindingKind::History,
                        s.src,
                        path_at,
                        format!(
                            "`{path}` is not declared by the input_schema of {} (no `{key}`): \
                             the history condition cannot group or sum by it",
                            tool.wire_name()
                        ),
                        None,
                    ));
                }
            }
        }
    }
}

/// One step of an argument path.
#[derive(Debug, PartialEq)]
enum Step<'f> {
    Key(&'f str),
    /// `[0]`: one element.
    Index,
    /// `[any]` / `[all]`: several elements.
    Spread,
}

/// The steps of an argument path; `None` for context fields (`phrony.*`, `dispatch.outcome`)
/// and for paths the engine would refuse.
fn arg_steps(field: &str) -> Option<Vec<Step<'_>>> {
    if field == "dispatch.outcome" {
        return None;
    }
    let mut steps = Vec::new();
    for piece in field.split('.').filter(|p| !p.is_empty()) {
        let (key, rest) = piece.split_at(piece.find('[').unwrap_or(piece.len()));
        if !key.is_empty() {
            steps.push(Step::Key(key));
        }
        for step in rest.split('[').filter(|s| !s.is_empty()) {
            steps.push(match step.strip_suffix(']')? {
                "any" | "all" => Step::Spread,
                _ => Step::Index,
            });
        }
    }
    match steps.first() {
        Some(Step::Key("phrony")) | None => None,
        Some(_) => Some(steps),
    }
}

// ---------------------------------------------------------------------------------------------
// Values

/// A value as the condition language compares it: its numeric reading, else its trimmed,
/// lower-cased text (`null` for null).
#[derive(Debug, Clone, PartialEq)]
enum Key {
    Num(f64),
    Text(String),
    Null,
}

fn key_of(v: &Value) -> Option<Key> {
    let text = match v {
        Value::Null => return Some(Key::Null),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => return n.as_f64().map(Key::Num),
        Value::String(s) => s.trim().to_owned(),
        Value::Array(_) | Value::Object(_) => return None,
    };
    Some(match text.parse::<f64>() {
        Ok(n) if n.is_finite() => Key::Num(n),
        _ => Key::Text(text.to_lowercase()),
    })
}

/// The values of an `eq` / `in` (or `neq` / `not_in`) leaf.
fn listed_keys(leaf: &Leaf<'_>) -> Option<Vec<Key>> {
    match (leaf.op, leaf.value?) {
        ("eq" | "neq", v) => Some(vec![key_of(v)?]),
        ("in" | "not_in", Value::Array(items)) => items.iter().map(key_of).collect(),
        _ => None,
    }
}

fn number_of(v: Option<&Value>) -> Option<f64> {
    match key_of(v?)? {
        Key::Num(n) => Some(n),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Schema checks

/// What a path finds in a schema.
enum Found<'s> {
    /// The schema of the value at the path.
    Schema(&'s Value),
    /// The schema says nothing definite (no `properties`, combinators, `$ref`…).
    Unknown,
    /// An object schema with `properties` that does not list `key` (reached by `prefix`).
    Missing {
        key: &'s str,
        prefix: String,
        closed: bool,
        names: Vec<&'s str>,
    },
}

/// Schema keywords that may admit properties `properties` does not list: a schema using any of
/// them is not judged on undeclared names.
const OPENING_KEYWORDS: [&str; 9] = [
    "patternProperties",
    "allOf",
    "anyOf",
    "oneOf",
    "$ref",
    "if",
    "dependentSchemas",
    "unevaluatedProperties",
    "$dynamicRef",
];

fn resolve<'s>(schema: &'s Value, steps: &[Step<'s>]) -> Found<'s> {
    let mut cur = schema;
    let mut prefix = String::new();
    for step in steps {
        match step {
            Step::Key(k) => {
                let Some(props) = cur.get("properties").and_then(Value::as_object) else {
                    return Found::Unknown;
                };
                match props.get(*k) {
                    Some(child) => cur = child,
                    None if OPENING_KEYWORDS.iter().any(|k| cur.get(*k).is_some()) => {
                        return Found::Unknown;
                    }
                    None => {
                        return Found::Missing {
                            key: k,
                            prefix,
                            closed: cur.get("additionalProperties") == Some(&Value::Bool(false)),
                            names: props.keys().map(String::as_str).collect(),
                        };
                    }
                }
                if !prefix.is_empty() {
                    prefix.push('.');
                }
                prefix.push_str(k);
            }
            Step::Index | Step::Spread => match cur.get("items") {
                Some(items) if items.is_object() => {
                    cur = items;
                    prefix.push_str("[]");
                }
                _ => return Found::Unknown,
            },
        }
    }
    Found::Schema(cur)
}

/// The JSON Schema `type`s of a schema; empty when it declares none.
fn types_of(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The declared name closest to `key`, when it is an obvious typo (at most 2 edits, and fewer
/// than half the name).
fn closest<'n>(key: &str, names: &[&'n str]) -> Option<&'n str> {
    names
        .iter()
        .map(|n| (levenshtein(&key.to_lowercase(), &n.to_lowercase()), *n))
        .filter(|(d, n)| *d <= 2 && *d * 2 < n.chars().count().max(key.chars().count()))
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

fn check_leaf_schema(
    s: &Subject<'_>,
    tool: &ToolBinding,
    schema: &Value,
    leaf: &Leaf<'_>,
    out: &mut Vec<Finding>,
) {
    let Some(steps) = arg_steps(leaf.field) else {
        return;
    };
    let wire = tool.wire_name();
    let field_at = format!("{}.field", leaf.at);
    match resolve(schema, &steps) {
        Found::Unknown => {}
        Found::Missing {
            key,
            prefix,
            closed,
            names,
        } => {
            let owner = if prefix.is_empty() {
                "the arguments".to_owned()
            } else {
                format!("`{prefix}`")
            };
            let why = if closed {
                format!(
                    "the input_schema of tool {wire} is closed (additionalProperties: false) and {owner} have no property `{key}`"
                )
            } else {
                format!("the input_schema of tool {wire} does not declare `{key}` in {owner}")
            };
            let hint = closest(key, &names)
                .map(|n| format!("; did you mean `{n}`?"))
                .unwrap_or_default();
            let message = format!(
                "condition on `{}` can never match a valid call: {why}{hint}",
                leaf.field
            );
            out.push(finding(
                FindingKind::UnknownField,
                s.src,
                &field_at,
                message,
                None,
            ));
        }
        Found::Schema(prop) => {
            if let Some(problem) = type_problem(leaf, prop) {
                let message = format!("condition {} on tool {wire}: {problem}", leaf.describe());
                let part = if matches!(leaf.op, "eq" | "in") {
                    "value"
                } else {
                    "op"
                };
                out.push(finding(
                    FindingKind::TypeMismatch,
                    s.src,
                    &format!("{}.{part}", leaf.at),
                    message,
                    None,
                ));
            }
        }
    }
}

/// Why `leaf` cannot match a value of schema `prop`, if it cannot.
fn type_problem(leaf: &Leaf<'_>, prop: &Value) -> Option<String> {
    let types = types_of(prop);
    let shown = if types.is_empty() {
        "untyped".to_owned()
    } else {
        types.join(" or ")
    };
    let has = |t: &str| types.contains(&t) || (t == "number" && types.contains(&"integer"));
    let enum_values = prop.get("enum").and_then(Value::as_array);
    match leaf.op {
        "gt" | "gte" | "lt" | "lte" if !types.is_empty() && !has("number") => {
            let numeric_enum = enum_values
                .is_some_and(|e| e.iter().any(|v| matches!(key_of(v), Some(Key::Num(_)))));
            (!numeric_enum).then(|| {
                let note = if has("string") {
                    " (only strings that read as numbers compare)"
                } else {
                    "; it never matches"
                };
                format!(
                    "`{}` compares numbers, but the schema's type of `{}` is {shown}{note}",
                    leaf.op, leaf.field
                )
            })
        }
        "matches" | "starts_with" | "ends_with"
            if !types.is_empty() && !has("string") && !has("null") =>
        {
            Some(format!(
                "`{}` tests text, but the schema's type of `{}` is {shown}{}",
                leaf.op,
                leaf.field,
                if has("number") || has("boolean") {
                    " (only its printed form would be tested)"
                } else {
                    "; it never matches"
                }
            ))
        }
        "eq" | "in" => {
            let keys = listed_keys(leaf)?;
            if let Some(allowed) = enum_values {
                let allowed: Vec<Key> = allowed.iter().filter_map(key_of).collect();
                if !keys.iter().any(|k| allowed.contains(k)) {
                    let list: Vec<String> = prop["enum"]
                        .as_array()
                        .map(|e| e.iter().map(Value::to_string).collect())
                        .unwrap_or_default();
                    return Some(format!(
                        "never matches: the schema's enum of `{}` is [{}]",
                        leaf.field,
                        list.join(", ")
                    ));
                }
                return None;
            }
            if types.is_empty() || keys.iter().any(|k| key_fits(k, &types)) {
                return None;
            }
            Some(format!(
                "never matches: the schema's type of `{}` is {shown}",
                leaf.field
            ))
        }
        _ => None,
    }
}

/// Whether a value of one of `types` can equal `k`.
fn key_fits(k: &Key, types: &[&str]) -> bool {
    types.iter().any(|t| match (*t, k) {
        ("string", Key::Num(_) | Key::Text(_)) | ("number" | "integer", Key::Num(_)) => true,
        ("boolean", Key::Text(t)) => t == "true" || t == "false",
        ("null", Key::Null) => true,
        _ => false,
    })
}

// ---------------------------------------------------------------------------------------------
// Unsatisfiable conjunctions

/// What the leaves of one `all` require of one field.
#[derive(Debug, Default)]
struct Constraint {
    /// The values the field must equal one of (intersection of `eq` / `in`).
    allowed: Option<Vec<Key>>,
    excluded: Vec<Key>,
    lower: Option<(f64, bool)>,
    upper: Option<(f64, bool)>,
    absent: bool,
    present: bool,
}

impl Constraint {
    fn add(&mut self, leaf: &Leaf<'_>) {
        match leaf.op {
            "eq" | "in" => {
                if let Some(keys) = listed_keys(leaf) {
                    self.allowed = Some(match self.allowed.take() {
                        None => keys,
                        Some(prev) => prev.into_iter().filter(|k| keys.contains(k)).collect(),
                    });
                }
            }
            "neq" | "not_in" => {
                if let Some(keys) = listed_keys(leaf) {
                    self.excluded.extend(keys);
                }
            }
            "gt" | "gte" => {
                if let Some(n) = number_of(leaf.value) {
                    let bound = (n, leaf.op == "gte");
                    if self.lower.is_none_or(|l| tighter_lower(bound, l)) {
                        self.lower = Some(bound);
                    }
                }
            }
            "lt" | "lte" => {
                if let Some(n) = number_of(leaf.value) {
                    let bound = (n, leaf.op == "lte");
                    if self.upper.is_none_or(|u| tighter_upper(bound, u)) {
                        self.upper = Some(bound);
                    }
                }
            }
            "exists" if leaf.value == Some(&Value::Bool(false)) => self.absent = true,
            _ => {}
        }
        if !(leaf.op == "exists" && leaf.value == Some(&Value::Bool(false))) {
            // Every other operator is false on a missing field.
            self.present = true;
        }
    }

    fn in_range(&self, n: f64) -> bool {
        self.lower.is_none_or(|(l, inc)| n > l || (inc && n == l))
            && self.upper.is_none_or(|(u, inc)| n < u || (inc && n == u))
    }

    fn satisfiable(&self) -> bool {
        if self.absent && self.present {
            return false;
        }
        if let (Some((l, li)), Some((u, ui))) = (self.lower, self.upper)
            && (l > u || (l == u && !(li && ui)))
        {
            return false;
        }
        let ranged = self.lower.is_some() || self.upper.is_some();
        match &self.allowed {
            None => true,
            Some(values) => values.iter().any(|k| {
                !self.excluded.contains(k)
                    && (!ranged || matches!(k, Key::Num(n) if self.in_range(*n)))
            }),
        }
    }
}

fn tighter_lower(new: (f64, bool), old: (f64, bool)) -> bool {
    new.0 > old.0 || (new.0 == old.0 && !new.1)
}

fn tighter_upper(new: (f64, bool), old: (f64, bool)) -> bool {
    new.0 < old.0 || (new.0 == old.0 && !new.1)
}

/// Reports every `all` (at any depth) whose leaves on one field cannot hold together.
fn check_unsatisfiable(s: &Subject<'_>, v: &Value, at: &str, out: &mut Vec<Finding>) {
    let Some(m) = v.as_object() else { return };
    if let Some(inner) = m.get("not") {
        check_unsatisfiable(s, inner, &format!("{at}.not"), out);
        return;
    }
    for key in ["all", "any"] {
        let Some(Value::Array(items)) = m.get(key) else {
            continue;
        };
        let list_at = format!("{at}.{key}");
        for (i, item) in items.iter().enumerate() {
            check_unsatisfiable(s, item, &format!("{list_at}[{i}]"), out);
        }
        if key == "all" {
            let leaves: Vec<Leaf<'_>> = items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| leaf_of(item.as_object()?, &format!("{list_at}[{i}]")))
                .filter(|l| !l.field.contains("[any]") && !l.field.contains("[all]"))
                .collect();
            report_conflicts(s, &list_at, &leaves, out);
        }
    }
}

fn report_conflicts(s: &Subject<'_>, list_at: &str, leaves: &[Leaf<'_>], out: &mut Vec<Finding>) {
    let mut seen = HashSet::new();
    for leaf in leaves {
        if !seen.insert(leaf.field) {
            continue;
        }
        let group: Vec<&Leaf<'_>> = leaves.iter().filter(|l| l.field == leaf.field).collect();
        if group.len() < 2 {
            continue;
        }
        let mut c = Constraint::default();
        group.iter().for_each(|l| c.add(l));
        if c.satisfiable() {
            continue;
        }
        let described: Vec<String> = group.iter().map(|l| l.describe()).collect();
        let message = format!(
            "unsatisfiable conditions: {} can never all hold, so this `all` never matches and \
             policy {} never decides through it",
            described.join(" and "),
            s.policy.name
        );
        out.push(finding(
            FindingKind::Unsatisfiable,
            s.src,
            list_at,
            message,
            None,
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Shadowed policies

/// Reports policies whose every call is denied by an unconditional `deny` covering their scope.
fn check_shadowed(subjects: &[Subject<'_>], tools: &[ToolBinding], out: &mut Vec<Finding>) {
    let is_deny = |p: &CompiledPolicy| p.action == "deny" || p.action == "block";
    // A `mode: shadow` policy is recorded, never enforced: it shadows nothing, and nothing
    // enforced keeps it from being recorded.
    let blanket: Vec<&Subject<'_>> = subjects
        .iter()
        .filter(|s| is_deny(s.policy) && s.policy.conditions.is_none() && !is_shadow(s.policy))
        .collect();
    for s in subjects {
        let p = s.policy;
        if (is_deny(p) && p.conditions.is_none()) || is_shadow(p) {
            continue;
        }
        let Some(d) = blanket
            .iter()
            .find(|d| agent_wide(d.policy) || (!agent_wide(p) && d.policy.scope == p.scope))
        else {
            continue;
        };
        let mark = d.src.pos.locate("spec.decision.type");
        let message = format!(
            "policy {} never decides: every call it matches is denied by {} at {}:{}:{}",
            p.name,
            d.policy.name,
            d.src.path.display(),
            mark.line,
            mark.column
        );
        let tool = scoped_tool(p, tools).or_else(|| tools.first());
        let example =
            tool.and_then(|t| Some(json!({"tool": t.wire_name(), "arguments": example_args(p)?})));
        out.push(finding(
            FindingKind::NeverDecides,
            s.src,
            "spec.decision.type",
            message,
            example,
        ));
    }
}

/// Arguments a policy's conditions match, when they are an `all` (or one leaf) of simple
/// conditions on distinct argument keys; `None` otherwise.
fn example_args(p: &CompiledPolicy) -> Option<Value> {
    let Some(conditions) = p.conditions.as_ref().map(|c| &c.0) else {
        return Some(json!({}));
    };
    let m = conditions.as_object()?;
    let leaves: Vec<Leaf<'_>> = match m.get("all") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| leaf_of(i.as_object()?, ""))
            .collect::<Option<_>>()?,
        Some(_) => return None,
        None => vec![leaf_of(m, "")?],
    };
    let mut args = Map::new();
    for leaf in &leaves {
        let steps = arg_steps(leaf.field)?;
        let [Step::Key(key)] = steps.as_slice() else {
            return None;
        };
        let n = || number_of(leaf.value);
        let value = match leaf.op {
            "eq" => leaf.value?.clone(),
            "in" => leaf.value?.as_array()?.first()?.clone(),
            "gt" => number_json(n()? + 1.0)?,
            "lt" => number_json(n()? - 1.0)?,
            "gte" | "lte" => number_json(n()?)?,
            "exists" if leaf.value != Some(&Value::Bool(false)) => json!("x"),
            "starts_with" | "ends_with" | "contains" => leaf.value?.clone(),
            _ => return None,
        };
        if args.insert((*key).to_owned(), value).is_some() {
            return None;
        }
    }
    Some(Value::Object(args))
}

/// A JSON number, written as an integer when it is one.
fn number_json(n: f64) -> Option<Value> {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        #[allow(
            clippy::cast_possible_truncation,
            reason = "integral and within i64 range, checked above"
        )]
        return Some(json!(n as i64));
    }
    serde_json::Number::from_f64(n).map(Value::Number)
}

// ---------------------------------------------------------------------------------------------
// Allow lists

/// Reports allow lists on a field whose schema `enum` they list entirely.
fn check_always_allow(subjects: &[Subject<'_>], tools: &[ToolBinding], out: &mut Vec<Finding>) {
    for s in subjects {
        let p = s.policy;
        if p.action != "allow" || p.allow.is_empty() || p.allow_field.is_empty() {
            continue;
        }
        let Some(tool) = scoped_tool(p, tools) else {
            continue;
        };
        let Some(schema) = tool.input_schema.as_ref().and_then(|x| x.inline.as_ref()) else {
            continue;
        };
        let Some(steps) = arg_steps(&p.allow_field) else {
            continue;
        };
        let Found::Schema(prop) = resolve(&schema.0, &steps) else {
            continue;
        };
        let Some(values) = prop.get("enum").and_then(Value::as_array) else {
            continue;
        };
        let listed: Vec<Key> = p
            .allow
            .iter()
            .filter_map(|a| key_of(&Value::String(a.clone())))
            .collect();
        if values
            .iter()
            .all(|v| key_of(v).is_some_and(|k| listed.contains(&k)))
        {
            let message = format!(
                "allow list of policy {} lists every value the input_schema of tool {} allows \
                 for `{}`; it never denies a call that passes schema validation",
                p.name,
                tool.wire_name(),
                p.allow_field
            );
            out.push(finding(
                FindingKind::AlwaysAllow,
                s.src,
                "spec.allow",
                message,
                None,
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Overlapping approval policies

/// Reports pairs of approval policies with different quorums or routes that both match one
/// call (shown by an example call the policy engine confirms both match): the engine asks for
/// one policy's approvals only.
/// A Cedar policy none of whose `permit`s applies (by its principal, action and resource
/// scopes) to a tool in the policy's scope denies every call of that tool (Cedar's default
/// deny).
fn check_cedar_permits(subjects: &[Subject<'_>], tools: &[ToolBinding], out: &mut Vec<Finding>) {
    for s in subjects.iter().filter(|s| s.policy.cedar.is_some()) {
        let Ok(set) = phrony_policy::PolicySet::compile([def_from_compiled(s.policy, tools)])
        else {
            continue;
        };
        let Some(policy) = set.policies().iter().chain(set.shadow_policies()).next() else {
            continue;
        };
        for tool_ref in policy.cedar_tools_without_permit() {
            let Some(tool) = tools.iter().find(|t| t.reference == tool_ref) else {
                continue;
            };
            let wire = tool.wire_name();
            out.push(finding(
                FindingKind::CedarNoPermit,
                s.src,
                "spec.cedar",
                format!(
                    "no Cedar permit of policy {} applies to tool {wire} ({tool_ref}): every call \
                     of it is denied",
                    s.policy.name
                ),
                Some(json!({"tool": wire, "arguments": {}})),
            ));
        }
    }
}

fn check_overlapping_approvals(
    subjects: &[Subject<'_>],
    tools: &[ToolBinding],
    out: &mut Vec<Finding>,
) {
    let mut approvals: Vec<&Subject<'_>> = subjects
        .iter()
        .filter(|s| {
            is_approval(&s.policy.action) && !is_shadow(s.policy) && s.policy.cedar.is_none()
        })
        .collect();
    // The compiled set's evaluation order.
    approvals
        .sort_by(|a, b| (&a.policy.scope, &a.policy.name).cmp(&(&b.policy.scope, &b.policy.name)));
    for (i, a) in approvals.iter().enumerate() {
        for b in &approvals[i + 1..] {
            let (pa, pb) = (a.policy, b.policy);
            let differs = pa.approvals_required.max(1) != pb.approvals_required.max(1)
                || pa.authority_ref != pb.authority_ref;
            if !differs || !(agent_wide(pa) || agent_wide(pb) || pa.scope == pb.scope) {
                continue;
            }
            let Some(tool) = scoped_tool(pa, tools)
                .or_else(|| scoped_tool(pb, tools))
                .or_else(|| tools.first())
            else {
                continue;
            };
            if let Some(f) = overlap_finding(a, b, tool) {
                out.push(f);
            }
        }
    }
}

/// The finding for approval policies `a` and `b` (in evaluation order), when an example call
/// of `tool` matches both.
fn overlap_finding(a: &Subject<'_>, b: &Subject<'_>, tool: &ToolBinding) -> Option<Finding> {
    let (Value::Object(xa), Value::Object(xb)) = (example_args(a.policy)?, example_args(b.policy)?)
    else {
        return None;
    };
    let mut first = xa.clone();
    first.extend(xb.clone());
    let mut second = xb;
    second.extend(xa);
    let set = phrony_policy::PolicySet::compile([
        def_from_compiled(a.policy, &[]),
        def_from_compiled(b.policy, &[]),
    ])
    .ok()?;
    let wire = tool.wire_name();
    for args in [Value::Object(first), Value::Object(second)] {
        let req = phrony_policy::Request::new(tool.tool_ctx(&wire), &args);
        let explanation = set.explain(&req);
        if explanation.policies.iter().filter(|t| t.matched).count() < 2 {
            continue;
        }
        let winner = explanation.decision.policy()?.name().to_owned();
        let (won, lost) = if winner == a.policy.name {
            (a, b)
        } else {
            (b, a)
        };
        let describe = |p: &CompiledPolicy| {
            let route = if p.authority_ref.is_empty() {
                String::new()
            } else {
                format!(", route {}", p.authority_ref)
            };
            format!("approvals_required {}{route}", p.approvals_required.max(1))
        };
        let message = format!(
            "approval policies {} and {} both match calls like the example; the runtime uses {} \
             ({}) and never the quorum and route of {} ({})",
            a.policy.name,
            b.policy.name,
            won.policy.name,
            describe(won.policy),
            lost.policy.name,
            describe(lost.policy)
        );
        let example = json!({"tool": wire, "arguments": args});
        return Some(finding(
            FindingKind::OverlappingApproval,
            lost.src,
            "spec.decision.type",
            message,
            Some(example),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{Key, Step, arg_steps, closest, key_of, levenshtein};
    use serde_json::json;

    #[test]
    fn paths_split_into_steps_and_context_fields_are_skipped() {
        assert_eq!(
            arg_steps("items[any].price"),
            Some(vec![Step::Key("items"), Step::Spread, Step::Key("price")])
        );
        assert_eq!(
            arg_steps("a[0].b"),
            Some(vec![Step::Key("a"), Step::Index, Step::Key("b")])
        );
        assert_eq!(arg_steps("phrony.principal.role"), None);
        assert_eq!(arg_steps("dispatch.outcome"), None);
    }

    #[test]
    fn typos_are_suggested_only_when_close() {
        assert_eq!(levenshtein("amout", "amount"), 1);
        assert_eq!(closest("amout", &["amount", "currency"]), Some("amount"));
        assert_eq!(closest("zz", &["amount", "id"]), None);
    }

    #[test]
    fn values_compare_like_the_condition_language() {
        assert_eq!(key_of(&json!("500")), Some(Key::Num(500.0)));
        assert_eq!(key_of(&json!(" EUR ")), Some(Key::Text("eur".into())));
        assert_eq!(key_of(&json!([1])), None);
    }
}
