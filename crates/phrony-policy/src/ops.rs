//! Operators: their compiled form and their test against a value found at a path.

use regex::Regex;
use serde_json::Value;

use crate::error::{CompileErrorKind, Diags};
use crate::text::{contains_folded, ends_with_folded, fold, parse_number, starts_with_folded};
use crate::value::{Actual, Scalar};

/// A compiled operator with its prepared value.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Eq(Scalar),
    Neq(Scalar),
    Gt(f64),
    Gte(f64),
    Lt(f64),
    Lte(f64),
    In(Vec<Scalar>),
    NotIn(Vec<Scalar>),
    Matches(Regex),
    Exists(bool),
    Contains(Scalar),
    StartsWith(String),
    EndsWith(String),
}

/// Operator names, canonical, with their aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpName {
    Eq,
    Neq,
    Gt,
    Gte,
    Lt,
    Lte,
    In,
    NotIn,
    Matches,
    Exists,
    Contains,
    StartsWith,
    EndsWith,
}

impl OpName {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "eq" | "==" => OpName::Eq,
            "neq" | "!=" => OpName::Neq,
            "gt" | ">" => OpName::Gt,
            "gte" | ">=" => OpName::Gte,
            "lt" | "<" => OpName::Lt,
            "lte" | "<=" => OpName::Lte,
            "in" => OpName::In,
            "not_in" => OpName::NotIn,
            "matches" => OpName::Matches,
            "exists" => OpName::Exists,
            "contains" => OpName::Contains,
            "starts_with" => OpName::StartsWith,
            "ends_with" => OpName::EndsWith,
            _ => return None,
        })
    }
}

/// `actual` equals an element of `list` (its numeric reading taken once).
pub(crate) fn listed(list: &[Scalar], actual: Actual<'_>) -> bool {
    let number = actual.number();
    list.iter().any(|s| s.matches_read(actual, number))
}

impl Op {
    /// Compiles operator `name` (as written, for messages) with `value`, reporting problems at
    /// `at` (the path of the node's `value`).
    pub(crate) fn compile(
        kind: OpName,
        name: &str,
        value: Option<&Value>,
        at: &str,
        diags: &mut Diags<'_>,
    ) -> Option<Op> {
        let op = || name.to_owned();
        if kind == OpName::Exists {
            return match value {
                None => Some(Op::Exists(true)),
                Some(Value::Bool(b)) => Some(Op::Exists(*b)),
                Some(_) => {
                    diags.push(at, CompileErrorKind::ValueNotBool);
                    None
                }
            };
        }
        let Some(value) = value else {
            diags.push(at, CompileErrorKind::MissingValue { op: op() });
            return None;
        };
        let scalar = |diags: &mut Diags<'_>, v: &Value, at: &str| {
            let s = Scalar::from_json(v);
            if s.is_none() {
                diags.push(at, CompileErrorKind::ValueNotScalar { op: op() });
            }
            s
        };
        let string = |diags: &mut Diags<'_>| match value {
            Value::String(s) => Some(s.as_str()),
            _ => {
                diags.push(at, CompileErrorKind::ValueNotString { op: op() });
                None
            }
        };
        let needle = |diags: &mut Diags<'_>, s: &str| {
            let folded = fold(s);
            if folded.is_empty() {
                diags.push(at, CompileErrorKind::EmptyNeedle { op: op() });
                return None;
            }
            Some(folded)
        };
        match kind {
            OpName::Eq => scalar(diags, value, at).map(Op::Eq),
            OpName::Neq => scalar(diags, value, at).map(Op::Neq),
            OpName::Gt | OpName::Gte | OpName::Lt | OpName::Lte => {
                let n = match value {
                    Value::Number(n) => n.as_f64().filter(|f| f.is_finite()),
                    Value::String(s) => parse_number(s),
                    _ => None,
                };
                let Some(n) = n else {
                    diags.push(
                        at,
                        CompileErrorKind::ValueNotNumeric {
                            op: op(),
                            value: value.to_string(),
                        },
                    );
                    return None;
                };
                Some(match kind {
                    OpName::Gt => Op::Gt(n),
                    OpName::Gte => Op::Gte(n),
                    OpName::Lt => Op::Lt(n),
                    _ => Op::Lte(n),
                })
            }
            OpName::In | OpName::NotIn => {
                let Value::Array(items) = value else {
                    diags.push(at, CompileErrorKind::ValueNotList { op: op() });
                    return None;
                };
                if items.is_empty() {
                    diags.push(at, CompileErrorKind::EmptyList { op: op() });
                    return None;
                }
                let before = diags.list.len();
                let list: Vec<Scalar> = items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, v)| scalar(diags, v, &format!("{at}[{i}]")))
                    .collect();
                if diags.list.len() != before {
                    return None;
                }
                Some(if kind == OpName::In {
                    Op::In(list)
                } else {
                    Op::NotIn(list)
                })
            }
            OpName::Matches => {
                let pattern = string(diags)?;
                match Regex::new(pattern) {
                    Ok(re) => Some(Op::Matches(re)),
                    Err(e) => {
                        diags.push(
                            at,
                            CompileErrorKind::InvalidRegex {
                                pattern: pattern.to_owned(),
                                error: e.to_string(),
                            },
                        );
                        None
                    }
                }
            }
            OpName::Contains => {
                let s = scalar(diags, value, at)?;
                if let Value::String(text) = value {
                    needle(diags, text)?;
                }
                Some(Op::Contains(s))
            }
            OpName::StartsWith => {
                let s = string(diags)?;
                needle(diags, s).map(Op::StartsWith)
            }
            OpName::EndsWith => {
                let s = string(diags)?;
                needle(diags, s).map(Op::EndsWith)
            }
            // Handled before the value check above.
            OpName::Exists => None,
        }
    }

    /// The values of an equality operator (`eq`, `neq`, `in`, `not_in`).
    pub(crate) fn equality_values(&self) -> Option<&[Scalar]> {
        match self {
            Op::Eq(value) | Op::Neq(value) => Some(std::slice::from_ref(value)),
            Op::In(values) | Op::NotIn(values) => Some(values),
            _ => None,
        }
    }

    /// [`test`](Self::test) on a JSON value found at the path. Takes the value by pointer, so a
    /// slotted leaf (the common case) passes it in a register instead of through memory.
    pub(crate) fn test_json(&self, value: &Value) -> bool {
        self.test(Some(Actual::Json(value)))
    }

    /// Tests the value found at the path (`None`: the path is missing). A missing path is false
    /// for every operator except `exists: false`.
    #[inline(always)]
    pub(crate) fn test(&self, actual: Option<Actual<'_>>) -> bool {
        let Some(a) = actual else {
            return matches!(self, Op::Exists(false));
        };
        match self {
            Op::Exists(want) => *want,
            Op::Eq(s) => s.matches(a),
            Op::Neq(s) => !s.matches(a),
            Op::Gt(n) => a.number().is_some_and(|x| x > *n),
            Op::Gte(n) => a.number().is_some_and(|x| x >= *n),
            Op::Lt(n) => a.number().is_some_and(|x| x < *n),
            Op::Lte(n) => a.number().is_some_and(|x| x <= *n),
            Op::In(list) => listed(list, a),
            Op::NotIn(list) => !listed(list, a),
            Op::Matches(re) => a.with_any_text(|t| re.is_match(t)),
            Op::Contains(s) => match a {
                Actual::Json(Value::Array(items)) => {
                    items.iter().any(|e| s.matches(Actual::Json(e)))
                }
                _ => match s.text() {
                    Some(needle) => a.with_text(|t| contains_folded(t, needle)).unwrap_or(false),
                    None => false,
                },
            },
            Op::StartsWith(p) => a.with_text(|t| starts_with_folded(t, p)).unwrap_or(false),
            Op::EndsWith(p) => a.with_text(|t| ends_with_folded(t, p)).unwrap_or(false),
        }
    }
}
