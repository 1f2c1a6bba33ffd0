//! Condition trees: strict compilation and evaluation.

use serde_json::{Map, Value};

use crate::error::{CompileErrorKind, Diags, type_name};
use crate::ops::{Op, OpName};
use crate::path::{Field, Source};
use crate::request::{Request, Trigger};

/// A compiled condition node.
#[derive(Debug, Clone)]
pub(crate) enum Cond {
    All(Vec<Cond>),
    Any(Vec<Cond>),
    Not(Box<Cond>),
    Leaf { source: Source, op: Op },
    Trigger { trigger: Trigger, negate: bool },
}

/// What a condition is evaluated against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'r, 'a> {
    pub(crate) req: &'r Request<'a>,
    /// The dispatch-failure trigger; `None` before dispatch.
    pub(crate) trigger: Option<Trigger>,
}

impl Cond {
    pub(crate) fn eval(&self, ctx: &Ctx<'_, '_>) -> bool {
        match self {
            Cond::All(children) => children.iter().all(|c| c.eval(ctx)),
            Cond::Any(children) => children.iter().any(|c| c.eval(ctx)),
            Cond::Not(child) => !child.eval(ctx),
            Cond::Leaf { source, op } => source.resolve(ctx.req, &mut |a| op.test(a)),
            // No trigger (normal pre-dispatch evaluation): false for eq and neq alike.
            Cond::Trigger { trigger, negate } => {
                ctx.trigger.is_some_and(|t| (t == *trigger) != *negate)
            }
        }
    }
}

/// The result of compiling a policy's `conditions`.
#[derive(Debug)]
pub(crate) enum Compiled {
    /// No conditions (absent, `null` or `{}`): every call in scope matches.
    None,
    /// A condition tree.
    Tree(Cond),
    /// Errors were reported.
    Invalid,
}

/// Compiles a policy's `conditions` value; problems are reported under the path `conditions`.
pub(crate) fn compile(conditions: Option<&Value>, diags: &mut Diags<'_>) -> Compiled {
    match conditions {
        None | Some(Value::Null) => Compiled::None,
        Some(Value::Object(m)) if m.is_empty() => Compiled::None,
        Some(v) => match compile_node(v, "conditions", 1, diags) {
            Some(c) => Compiled::Tree(c),
            None => Compiled::Invalid,
        },
    }
}

const KINDS: [&str; 4] = ["all", "any", "not", "field"];

/// Deepest condition nesting accepted; bounds the recursion of compilation and evaluation.
pub(crate) const MAX_DEPTH: usize = 64;

fn compile_node(v: &Value, at: &str, depth: usize, diags: &mut Diags<'_>) -> Option<Cond> {
    if depth > MAX_DEPTH {
        diags.push(at, CompileErrorKind::TooDeep { limit: MAX_DEPTH });
        return None;
    }
    let Value::Object(m) = v else {
        diags.push(
            at,
            CompileErrorKind::NodeNotMap {
                found: type_name(v),
            },
        );
        return None;
    };
    let kinds: Vec<&str> = KINDS.into_iter().filter(|k| m.contains_key(*k)).collect();
    let leaf_like = kinds.is_empty() || kinds.contains(&"field");
    let mut ok = true;
    for key in m.keys() {
        let known = KINDS.contains(&key.as_str()) || (leaf_like && (key == "op" || key == "value"));
        if !known {
            ok = false;
            diags.push(
                format!("{at}.{key}"),
                CompileErrorKind::UnknownKey {
                    key: key.clone(),
                    expected: if leaf_like {
                        "field, op and value (or one of all, any, not)"
                    } else {
                        "only one of all, any, not or field (op and value go beside field)"
                    },
                },
            );
        }
    }
    match kinds.as_slice() {
        [] => {
            diags.push(at, CompileErrorKind::EmptyNode);
            None
        }
        [kind] => {
            let node = match *kind {
                "all" | "any" => compile_list(m, kind, at, depth, diags),
                "not" => compile_node(&m["not"], &format!("{at}.not"), depth + 1, diags)
                    .map(|c| Cond::Not(Box::new(c))),
                _ => compile_leaf(m, at, diags),
            };
            node.filter(|_| ok)
        }
        _ => {
            diags.push(
                at,
                CompileErrorKind::AmbiguousNode {
                    keys: kinds.iter().map(|k| (*k).to_owned()).collect(),
                },
            );
            None
        }
    }
}

fn compile_list(
    m: &Map<String, Value>,
    kind: &str,
    at: &str,
    depth: usize,
    diags: &mut Diags<'_>,
) -> Option<Cond> {
    let key: &'static str = if kind == "all" { "all" } else { "any" };
    let at_key = format!("{at}.{key}");
    let Value::Array(items) = &m[key] else {
        diags.push(at_key, CompileErrorKind::NotAList { key });
        return None;
    };
    if key == "any" && items.is_empty() {
        diags.push(at_key, CompileErrorKind::EmptyAny);
        return None;
    }
    let mut children = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        match compile_node(item, &format!("{at_key}[{i}]"), depth + 1, diags) {
            Some(c) => children.push(c),
            None => ok = false,
        }
    }
    ok.then(|| {
        if key == "all" {
            Cond::All(children)
        } else {
            Cond::Any(children)
        }
    })
}

fn compile_leaf(m: &Map<String, Value>, at: &str, diags: &mut Diags<'_>) -> Option<Cond> {
    let field_at = format!("{at}.field");
    let op_at = format!("{at}.op");
    let value_at = format!("{at}.value");
    let field = match &m["field"] {
        Value::String(s) if !s.trim().is_empty() => Field::parse(s.trim(), &field_at, diags),
        _ => {
            diags.push(&*field_at, CompileErrorKind::FieldNotString);
            None
        }
    };
    let op_name = match m.get("op") {
        None => "eq",
        Some(Value::String(s)) => s.trim(),
        Some(_) => {
            diags.push(&*op_at, CompileErrorKind::OpNotString);
            return None;
        }
    };
    let Some(op_kind) = OpName::parse(op_name) else {
        diags.push(
            &*op_at,
            CompileErrorKind::UnknownOp {
                op: op_name.to_owned(),
            },
        );
        return None;
    };
    let value = m.get("value");
    let Some(field) = field else {
        // The field was reported; still check the value so every problem shows at once.
        Op::compile(op_kind, op_name, value, &value_at, diags);
        return None;
    };
    match field {
        Field::Value(source) => Op::compile(op_kind, op_name, value, &value_at, diags)
            .map(|op| Cond::Leaf { source, op }),
        f @ (Field::Trigger | Field::Outcome) => {
            let field_name = if f == Field::Trigger {
                "phrony.dispatch.trigger"
            } else {
                "dispatch.outcome"
            };
            let negate = match op_kind {
                OpName::Eq => false,
                OpName::Neq => true,
                _ => {
                    diags.push(
                        op_at,
                        CompileErrorKind::TriggerOp {
                            field: field_name.to_owned(),
                            op: op_name.to_owned(),
                        },
                    );
                    return None;
                }
            };
            let Some(Value::String(raw)) = value else {
                diags.push(
                    value_at,
                    CompileErrorKind::ValueNotString {
                        op: op_name.to_owned(),
                    },
                );
                return None;
            };
            let wire = match (&f, raw.trim()) {
                (Field::Outcome, v) if !v.contains(':') => format!("dispatch:{v}"),
                (_, v) => v.to_owned(),
            };
            match wire.parse::<Trigger>() {
                Ok(trigger) => Some(Cond::Trigger { trigger, negate }),
                Err(_) => {
                    diags.push(
                        value_at,
                        CompileErrorKind::UnknownTrigger { value: raw.clone() },
                    );
                    None
                }
            }
        }
    }
}
