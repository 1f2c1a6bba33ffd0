//! Condition trees: strict compilation and evaluation.

use regex::RegexSet;
use serde_json::{Map, Value};

use crate::error::{CompileErrorKind, Diags, type_name};
use crate::gate::Gates;
use crate::history::{self, HistoryLeaf, HistoryQuery};
use crate::ops::{Op, OpName};
use crate::path::{Field, Source, walk};
use crate::request::{Request, Trigger};
use crate::slots::{PathTable, SlotRef, Slots, plain_len, regex_may_match};
use crate::value::Scalar;

/// A compiled condition node.
#[derive(Debug, Clone)]
pub(crate) enum Cond {
    All(Vec<Cond>),
    Any(Vec<Cond>),
    Not(Box<Cond>),
    /// `slot`: where the decision caches the path's plain prefix (set by [`Cond::intern`]).
    /// `keys`: for an `eq`, `neq`, `in` or `not_in` on a whole slot, the ids of its values in
    /// the slot's key table (set by [`Cond::assign_keys`]; see `gate.rs`).
    Leaf {
        source: Source,
        op: Op,
        slot: Option<SlotRef>,
        keys: Option<Box<[u32]>>,
    },
    Trigger {
        trigger: Trigger,
        negate: bool,
    },
    /// A `history` leaf: an aggregate of earlier calls given as facts on the request.
    History(Box<HistoryLeaf>),
}

/// What a condition is evaluated against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'r, 'a> {
    pub(crate) req: &'r Request<'a>,
    /// The dispatch-failure trigger; `None` before dispatch.
    pub(crate) trigger: Option<Trigger>,
    /// The decision's path slots (empty: every path is resolved directly).
    pub(crate) slots: Slots<'r, 'a>,
    /// The set's `matches` filters, by slot (empty: none).
    pub(crate) filters: &'r [Option<RegexSet>],
    /// The set's key tables (`None`: equalities compare values).
    pub(crate) gates: Option<&'r Gates>,
}

impl<'r, 'a> Ctx<'r, 'a> {
    /// A context that resolves every path directly: no slots, filters or key tables (the
    /// linear scan, and questions asked outside a decision such as tool visibility).
    pub(crate) fn unindexed(req: &'r Request<'a>, trigger: Option<Trigger>) -> Self {
        Self {
            req,
            trigger,
            slots: &[],
            filters: &[],
            gates: None,
        }
    }
}

impl Cond {
    pub(crate) fn eval(&self, ctx: &Ctx<'_, '_>) -> bool {
        match self {
            Cond::All(children) => children.iter().all(|c| c.eval(ctx)),
            Cond::Any(children) => children.iter().any(|c| c.eval(ctx)),
            Cond::Not(child) => !child.eval(ctx),
            Cond::Leaf {
                source,
                op,
                slot,
                keys,
            } => match source.slotted(ctx.req, *slot, ctx.slots) {
                Some((Some(value), [])) => {
                    if let (Op::Matches(_), Some(slot)) = (op, slot)
                        && !regex_may_match(ctx.filters, ctx.slots, slot.index, value)
                    {
                        return false;
                    }
                    if let (Some(keys), Some(slot), Some(gates)) = (keys, slot, ctx.gates)
                        && let Some(id) = gates.leaf_key(slot.index, ctx.slots, value)
                    {
                        let listed = keys.contains(&id);
                        return if matches!(op, Op::Neq(_) | Op::NotIn(_)) {
                            !listed
                        } else {
                            listed
                        };
                    }
                    op.test_json(value)
                }
                Some((Some(value), rest)) => walk(rest, value, &mut |a| op.test(a)),
                Some((None, _)) => op.test(None),
                None => source.resolve(ctx.req, &mut |a| op.test(a)),
            },
            // No trigger (normal pre-dispatch evaluation): false for eq and neq alike.
            Cond::Trigger { trigger, negate } => {
                ctx.trigger.is_some_and(|t| (t == *trigger) != *negate)
            }
            Cond::History(leaf) => leaf.eval(ctx.req),
        }
    }

    /// Gives every history leaf the index of its queries in `table`, adding new ones; `false`
    /// when the table would exceed [`history::MAX_HISTORY_QUERIES`].
    pub(crate) fn intern_history(&mut self, table: &mut Vec<HistoryQuery>) -> bool {
        match self {
            Cond::All(children) | Cond::Any(children) => {
                children.iter_mut().all(|c| c.intern_history(table))
            }
            Cond::Not(child) => child.intern_history(table),
            Cond::History(leaf) => leaf.sides_mut().all(|side| history::intern(side, table)),
            Cond::Leaf { .. } | Cond::Trigger { .. } => true,
        }
    }

    /// Whether the condition has a history leaf.
    pub(crate) fn reads_history(&self) -> bool {
        match self {
            Cond::All(children) | Cond::Any(children) => children.iter().any(Cond::reads_history),
            Cond::Not(child) => child.reads_history(),
            Cond::History(_) => true,
            Cond::Leaf { .. } | Cond::Trigger { .. } => false,
        }
    }

    /// Gives every leaf whose path starts with key or index steps the slot of that prefix.
    pub(crate) fn intern(&mut self, table: &mut PathTable) {
        match self {
            Cond::All(children) | Cond::Any(children) => {
                children.iter_mut().for_each(|c| c.intern(table));
            }
            Cond::Not(child) => child.intern(table),
            Cond::Leaf { source, slot, .. } => {
                *slot = source.json_path().and_then(|(root, segs)| {
                    let plain = plain_len(segs);
                    if plain == 0 {
                        return None;
                    }
                    Some(SlotRef {
                        index: table.intern(root, segs.get(..plain)?)?,
                        plain: u32::try_from(plain).ok()?,
                    })
                });
            }
            Cond::Trigger { .. } | Cond::History(_) => {}
        }
    }

    /// Calls `f` with the slot and values of every `eq`, `neq`, `in` and `not_in` leaf on a whole
    /// slot: the values the slot's key table must hold.
    pub(crate) fn keyed_values<'c>(&'c self, f: &mut impl FnMut(u32, &'c [Scalar])) {
        match self {
            Cond::All(children) | Cond::Any(children) => {
                children.iter().for_each(|c| c.keyed_values(f));
            }
            Cond::Not(child) => child.keyed_values(f),
            Cond::Leaf {
                source, op, slot, ..
            } => {
                if let Some(index) = whole_slot(source, *slot)
                    && let Some(values) = op.equality_values()
                {
                    f(index, values);
                }
            }
            Cond::Trigger { .. } | Cond::History(_) => {}
        }
    }

    /// Gives every leaf [`keyed_values`](Self::keyed_values) reported the ids of its values.
    pub(crate) fn assign_keys(&mut self, gates: &Gates) {
        match self {
            Cond::All(children) | Cond::Any(children) => {
                children.iter_mut().for_each(|c| c.assign_keys(gates));
            }
            Cond::Not(child) => child.assign_keys(gates),
            Cond::Leaf {
                source,
                op,
                slot,
                keys,
            } => {
                *keys = whole_slot(source, *slot)
                    .zip(op.equality_values())
                    .and_then(|(index, values)| gates.ids(index, values));
            }
            Cond::Trigger { .. } | Cond::History(_) => {}
        }
    }

    /// Calls `f` with the slot and pattern of every `matches` leaf that tests its slot's value
    /// itself (no steps after the prefix): the leaves a slot's regex filter can answer for.
    pub(crate) fn slotted_patterns<'c>(&'c self, f: &mut impl FnMut(u32, &'c str)) {
        match self {
            Cond::All(children) | Cond::Any(children) => {
                children.iter().for_each(|c| c.slotted_patterns(f));
            }
            Cond::Not(child) => child.slotted_patterns(f),
            Cond::Leaf {
                source,
                op: Op::Matches(re),
                slot,
                ..
            } => {
                if let Some(index) = whole_slot(source, *slot) {
                    f(index, re.as_str());
                }
            }
            Cond::Leaf { .. } | Cond::Trigger { .. } | Cond::History(_) => {}
        }
    }

    /// Whether the condition reads the dispatch-failure trigger anywhere (`phrony.dispatch.trigger`
    /// or `dispatch.outcome`, under any `all`, `any` or `not`).
    pub(crate) fn reads_trigger(&self) -> bool {
        match self {
            Cond::All(children) | Cond::Any(children) => children.iter().any(Cond::reads_trigger),
            Cond::Not(child) => child.reads_trigger(),
            Cond::Leaf { .. } | Cond::History(_) => false,
            Cond::Trigger { .. } => true,
        }
    }

    /// Whether the condition reads the call's arguments anywhere (a leaf on a path that does not
    /// start with `phrony.`, under any `all`, `any` or `not`). A condition that does not is
    /// decided by the call's context alone.
    pub(crate) fn reads_args(&self) -> bool {
        match self {
            Cond::All(children) | Cond::Any(children) => children.iter().any(Cond::reads_args),
            Cond::Not(child) => child.reads_args(),
            Cond::Leaf { source, .. } => source.reads_args(),
            // A history leaf depends on the call (its group, its amount): never decided by the
            // context alone, so it never hides a tool.
            Cond::History(_) => true,
            Cond::Trigger { .. } => false,
        }
    }

    /// An equality this condition cannot hold without: a leaf `eq` or `in` on a path that is its
    /// own slot (no `[any]`/`[all]` step), reached from the root through `all` nodes only. The
    /// condition is false unless the slot's value equals one of the returned values.
    pub(crate) fn gate(&self) -> Option<(u32, &[Scalar])> {
        match self {
            Cond::All(children) => children.iter().find_map(Cond::gate),
            Cond::Leaf {
                source, op, slot, ..
            } => {
                let index = whole_slot(source, *slot)?;
                match op {
                    Op::Eq(value) => Some((index, std::slice::from_ref(value))),
                    Op::In(values) => Some((index, values)),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// The slot number of a leaf whose whole path is its slot's prefix (no steps after it).
fn whole_slot(source: &Source, slot: Option<SlotRef>) -> Option<u32> {
    let slot = slot?;
    let (_, segs) = source.json_path()?;
    (usize::try_from(slot.plain).ok()? == segs.len()).then_some(slot.index)
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
/// `tool` is the policy's scope tool (`tool:<ref>`), the default `calls` of its history leaves.
pub(crate) fn compile(
    conditions: Option<&Value>,
    tool: Option<&str>,
    diags: &mut Diags<'_>,
) -> Compiled {
    match conditions {
        None | Some(Value::Null) => Compiled::None,
        Some(Value::Object(m)) if m.is_empty() => Compiled::None,
        Some(v) => match compile_node(v, "conditions", 1, tool, diags) {
            Some(c) => Compiled::Tree(c),
            None => Compiled::Invalid,
        },
    }
}

const KINDS: [&str; 5] = ["all", "any", "not", "field", "history"];

/// Deepest condition nesting accepted; bounds the recursion of compilation and evaluation.
pub(crate) const MAX_DEPTH: usize = 64;

fn compile_node(
    v: &Value,
    at: &str,
    depth: usize,
    tool: Option<&str>,
    diags: &mut Diags<'_>,
) -> Option<Cond> {
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
    let leaf_like = kinds.is_empty() || kinds.contains(&"field") || kinds.contains(&"history");
    let history_like = kinds.contains(&"history");
    let mut ok = true;
    for key in m.keys() {
        let known = KINDS.contains(&key.as_str())
            || (leaf_like && (key == "op" || key == "value"))
            || (history_like && key == "value_from");
        if !known {
            ok = false;
            diags.push(
                format!("{at}.{key}"),
                CompileErrorKind::UnknownKey {
                    key: key.clone(),
                    expected: if leaf_like {
                        "field (or history), op and value (or one of all, any, not)"
                    } else {
                        "only one of all, any, not, field or history (op and value go beside field)"
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
                "all" | "any" => compile_list(m, kind, at, depth, tool, diags),
                "not" => compile_node(&m["not"], &format!("{at}.not"), depth + 1, tool, diags)
                    .map(|c| Cond::Not(Box::new(c))),
                "history" => history::compile_leaf(m, at, tool, diags)
                    .map(|leaf| Cond::History(Box::new(leaf))),
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
    tool: Option<&str>,
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
        match compile_node(item, &format!("{at_key}[{i}]"), depth + 1, tool, diags) {
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

/// The `op` of a leaf at `op_at` (`eq` when absent): one rule for field and history leaves.
pub(crate) fn parse_op<'m>(
    m: &'m Map<String, Value>,
    op_at: &str,
    diags: &mut Diags<'_>,
) -> Option<(OpName, &'m str)> {
    let op_name = match m.get("op") {
        None => "eq",
        Some(Value::String(s)) => s.trim(),
        Some(_) => {
            diags.push(op_at, CompileErrorKind::OpNotString);
            return None;
        }
    };
    let parsed = OpName::parse(op_name);
    if parsed.is_none() {
        diags.push(
            op_at,
            CompileErrorKind::UnknownOp {
                op: op_name.to_owned(),
            },
        );
    }
    parsed.map(|kind| (kind, op_name))
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
    let (op_kind, op_name) = parse_op(m, &op_at, diags)?;
    let value = m.get("value");
    let Some(field) = field else {
        // The field was reported; still check the value so every problem shows at once.
        Op::compile(op_kind, op_name, value, &value_at, diags);
        return None;
    };
    match field {
        Field::Value(source) => {
            Op::compile(op_kind, op_name, value, &value_at, diags).map(|op| Cond::Leaf {
                source,
                op,
                slot: None,
                keys: None,
            })
        }
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
