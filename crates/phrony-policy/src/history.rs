//! History-aware conditions: aggregates over earlier calls, given to the engine as facts.
//!
//! The crate stays pure: it never reads a ledger. A `history` leaf names a [`HistoryQuery`]
//! (which calls, in which scope, grouped by which arguments, over which window, which aggregate
//! of which value); [`PolicySet::history_queries`](crate::PolicySet::history_queries) lists the
//! distinct queries of a set, and the caller (the runtime reads them from the ledger's indexed
//! state) answers each with a [`HistoryFact`] in [`HistoryFacts`], by query index, on the
//! [`Request`]. The queries also say what a call contributes (its group key,
//! [`HistoryQuery::group_key`], and amount, [`HistoryQuery::amount`]) so the caller can reserve it.
//!
//! # Fail-closed
//!
//! A history leaf **holds** (evaluates to true) when it cannot be answered: no facts on the
//! request, no fact for its query, an argument named by `same` missing from the call, a `last`
//! with no earlier value (nothing was looked up), a `value_from` that has no value, or this
//! call's own amount missing or not a number while `include_current` adds it. Written as the
//! condition of a `deny` or `require_approval` policy (the way caps and prerequisites are
//! written: "deny when the sum exceeds…", "deny when no `verify_payee` exists") that is the
//! safe answer; under a `not` or in an `allow` policy it is the opposite, which the manifest's
//! analysis warns about.
//!
//! # What is counted
//!
//! `count`, `sum` and `max` count the earlier calls that are **reserved** (allowed and not yet
//! finished, or waiting for an approval, or of an indeterminate outcome) or **committed**
//! (succeeded): caps are never exceeded by calls in flight. `last` and `exists` see only
//! committed (succeeded) calls: a prerequisite is met only by a call that happened.

use std::fmt::{self, Write as _};

use serde_json::{Map, Value};

use crate::error::{CompileErrorKind, Diags, type_name};
use crate::ops::{Op, OpName};
use crate::request::{Request, ToolCtx};
use crate::value::Actual;

/// The most distinct history queries one policy set may hold.
pub const MAX_HISTORY_QUERIES: usize = 64;

/// The longest `within` window: 366 days.
pub const MAX_HISTORY_WINDOW_SECS: u64 = 366 * 86_400;

/// Which earlier calls a history query looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HistoryScope {
    /// The calls of this session.
    Session,
    /// The calls of every session of this agent (`namespace/name`, any version).
    Agent,
    /// The calls of every session of every agent.
    Everyone,
}

impl HistoryScope {
    /// The YAML form: `session`, `agent` or `everyone`.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryScope::Session => "session",
            HistoryScope::Agent => "agent",
            HistoryScope::Everyone => "everyone",
        }
    }
}

/// What a history query computes over the earlier calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Aggregate {
    /// How many (reserved or committed).
    Count,
    /// The sum of `of` (reserved or committed).
    Sum,
    /// The largest `of` (reserved or committed).
    Max,
    /// `of` of the latest committed call.
    Last,
    /// Whether a committed call exists.
    Exists,
}

impl Aggregate {
    /// The YAML form.
    pub fn as_str(self) -> &'static str {
        match self {
            Aggregate::Count => "count",
            Aggregate::Sum => "sum",
            Aggregate::Max => "max",
            Aggregate::Last => "last",
            Aggregate::Exists => "exists",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "count" => Aggregate::Count,
            "sum" => Aggregate::Sum,
            "max" => Aggregate::Max,
            "last" => Aggregate::Last,
            "exists" => Aggregate::Exists,
            _ => return None,
        })
    }

    /// Whether reserved (in-flight) calls count: `count`, `sum` and `max`.
    pub fn counts_reserved(self) -> bool {
        matches!(self, Aggregate::Count | Aggregate::Sum | Aggregate::Max)
    }
}

/// One distinct question about earlier calls, shared by every leaf that asks it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HistoryQuery {
    key: String,
    calls: String,
    scope: HistoryScope,
    same: Vec<Vec<String>>,
    same_text: Vec<String>,
    within_secs: Option<u64>,
    aggregate: Aggregate,
    of_args: Option<Vec<String>>,
    of_result: Option<Vec<String>>,
    of_text: Option<String>,
}

impl HistoryQuery {
    /// The stable key of the query: equal queries (in any policy, any set) have equal keys, so
    /// the ledger's indexed state is shared by them. `calls|in|same,…|within|aggregate|of`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The tool whose calls are looked at, as written (wire name or dispatch ref).
    pub fn calls(&self) -> &str {
        &self.calls
    }

    /// The scope of the earlier calls.
    pub fn scope(&self) -> HistoryScope {
        self.scope
    }

    /// The argument paths of `same`, as written.
    pub fn same(&self) -> &[String] {
        &self.same_text
    }

    /// The window, in seconds (`None`: all time).
    pub fn within_secs(&self) -> Option<u64> {
        self.within_secs
    }

    /// The aggregate.
    pub fn aggregate(&self) -> Aggregate {
        self.aggregate
    }

    /// `of` as written (`amount`, `result.total`), if any.
    pub fn of(&self) -> Option<&str> {
        self.of_text.as_deref()
    }

    /// The path inside a call's **result** (`of: result.<path>`), dot-joined, whose value the
    /// call contributes once it succeeded.
    pub fn result_path(&self) -> Option<String> {
        self.of_result.as_ref().map(|p| p.join("."))
    }

    /// Whether a call of `tool` is one this query looks at (its dispatch ref or its wire name
    /// is `calls`).
    pub fn matches_tool(&self, tool: &ToolCtx<'_>) -> bool {
        !self.calls.is_empty() && (self.calls == tool.r#ref || self.calls == tool.name)
    }

    /// The group key of a call with these arguments: the values at the `same` paths (strings as
    /// JSON strings, numbers in their shortest form so `250` and `250.0` agree), joined by
    /// U+001F; `""` without `same`. `None` when a `same` argument is missing or null.
    pub fn group_key(&self, args: &Value) -> Option<String> {
        let mut key = String::new();
        for (i, path) in self.same.iter().enumerate() {
            let value = lookup(args, path)?;
            if i > 0 {
                key.push('\u{1f}');
            }
            match value {
                Value::Null => return None,
                Value::Number(n) => match n.as_f64() {
                    Some(f) => {
                        let _ = write!(key, "{f}");
                    }
                    None => {
                        let _ = write!(key, "{n}");
                    }
                },
                other => {
                    let _ = write!(key, "{other}");
                }
            }
        }
        Some(key)
    }

    /// The amount a call with these arguments contributes: the number at `of` (an argument
    /// path). `None` for `count` and `exists`, for `of: result.…` (known when the call
    /// succeeds), and when the argument is missing or not a number.
    pub fn amount(&self, args: &Value) -> Option<f64> {
        let path = self.of_args.as_ref()?;
        number(lookup(args, path)?)
    }
}

impl fmt::Display for HistoryQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({}", self.aggregate.as_str(), self.calls)?;
        if let Some(of) = &self.of_text {
            write!(f, ".{of}")?;
        }
        write!(f, " in {}", self.scope.as_str())?;
        if !self.same_text.is_empty() {
            write!(f, " same {}", self.same_text.join(","))?;
        }
        if let Some(w) = self.within_secs {
            write!(f, " within {w}s")?;
        }
        f.write_char(')')
    }
}

/// The answer to one history query for one call: the earlier calls in its scope, group and
/// window, **not** counting the call being decided.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HistoryFact {
    /// Calls reserved or committed.
    pub count: u64,
    /// Sum of their amounts.
    pub sum: f64,
    /// Largest amount, if any.
    pub max: Option<f64>,
    /// Calls committed (succeeded).
    pub committed: u64,
    /// Amount of the latest committed call that has one.
    pub last: Option<f64>,
}

/// The facts of one request, by query index ([`PolicySet::history_queries`](crate::PolicySet::history_queries)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryFacts {
    facts: Vec<Option<HistoryFact>>,
}

impl HistoryFacts {
    /// Facts for `n` queries, none known yet.
    pub fn new(n: usize) -> Self {
        Self {
            facts: vec![None; n],
        }
    }

    /// Sets the fact of query `index` (ignored when out of range).
    pub fn set(&mut self, index: usize, fact: HistoryFact) {
        if let Some(slot) = self.facts.get_mut(index) {
            *slot = Some(fact);
        }
    }

    /// The fact of query `index`, if known.
    pub fn get(&self, index: usize) -> Option<&HistoryFact> {
        self.facts.get(index).and_then(Option::as_ref)
    }

    /// The number of query slots.
    pub fn len(&self) -> usize {
        self.facts.len()
    }

    /// Whether there are no query slots.
    pub fn is_empty(&self) -> bool {
        self.facts.is_empty()
    }
}

fn lookup<'v>(mut value: &'v Value, path: &[String]) -> Option<&'v Value> {
    for seg in path {
        value = match value {
            Value::Object(m) => m.get(seg.as_str())?,
            Value::Array(items) => items.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(value)
}

fn number(v: &Value) -> Option<f64> {
    Actual::Json(v).number()
}

/// One side of a history comparison.
#[derive(Debug, Clone)]
pub(crate) struct Side {
    pub(crate) query: HistoryQuery,
    /// Index into the set's query table (set by interning).
    pub(crate) index: u32,
    include_current: bool,
}

/// The value of one side of a history comparison for one request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Answer {
    Num(f64),
    Bool(bool),
}

impl Side {
    /// The aggregate the side computes (types a Cedar policy's named history fact).
    #[cfg_attr(
        not(feature = "cedar"),
        expect(dead_code, reason = "read by the Cedar documents only")
    )]
    pub(crate) fn aggregate(&self) -> Aggregate {
        self.query.aggregate
    }

    /// The side's value for `req`; `None` when it cannot be answered (see the module docs).
    pub(crate) fn answer(&self, req: &Request<'_>) -> Option<Answer> {
        let fact = req.history?.get(usize::try_from(self.index).ok()?)?;
        let current = self.include_current && self.query.matches_tool(&req.tool);
        let q = &self.query;
        Some(match q.aggregate {
            Aggregate::Exists => Answer::Bool(fact.committed > 0),
            Aggregate::Last => Answer::Num(fact.last?),
            Aggregate::Count => {
                #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
                let n = fact.count as f64;
                Answer::Num(n + if current { 1.0 } else { 0.0 })
            }
            Aggregate::Sum => {
                let own = if current && q.of_args.is_some() {
                    q.amount(req.args)?
                } else {
                    0.0
                };
                Answer::Num(fact.sum + own)
            }
            Aggregate::Max => {
                let own = if current && q.of_args.is_some() {
                    Some(q.amount(req.args)?)
                } else {
                    None
                };
                Answer::Num(match (fact.max, own) {
                    (Some(a), Some(b)) => a.max(b),
                    (Some(a), None) | (None, Some(a)) => a,
                    (None, None) => return None,
                })
            }
        })
    }
}

/// A compiled `history` leaf.
#[derive(Debug, Clone)]
pub(crate) struct HistoryLeaf {
    pub(crate) lhs: Side,
    cmp: Cmp,
}

#[derive(Debug, Clone)]
enum Cmp {
    Value(Op),
    From(NumCmp, Side),
}

#[derive(Debug, Clone, Copy)]
enum NumCmp {
    Eq,
    Neq,
    Gt,
    Gte,
    Lt,
    Lte,
}

impl HistoryLeaf {
    /// True when the comparison holds, or when it cannot be answered (fail-closed, see the
    /// module docs).
    pub(crate) fn eval(&self, req: &Request<'_>) -> bool {
        let Some(lhs) = self.lhs.answer(req) else {
            return true;
        };
        match &self.cmp {
            Cmp::Value(op) => match lhs {
                Answer::Num(x) => op.test(Some(Actual::Num(x))),
                Answer::Bool(b) => op.test(Some(Actual::Json(&Value::Bool(b)))),
            },
            Cmp::From(cmp, side) => {
                let (Answer::Num(a), Some(Answer::Num(b))) = (lhs, side.answer(req)) else {
                    return true;
                };
                match cmp {
                    NumCmp::Eq => a == b,
                    NumCmp::Neq => a != b,
                    NumCmp::Gt => a > b,
                    NumCmp::Gte => a >= b,
                    NumCmp::Lt => a < b,
                    NumCmp::Lte => a <= b,
                }
            }
        }
    }

    /// The sides of the leaf, for interning.
    pub(crate) fn sides_mut(&mut self) -> impl Iterator<Item = &mut Side> {
        let rhs = match &mut self.cmp {
            Cmp::From(_, side) => Some(side),
            Cmp::Value(_) => None,
        };
        std::iter::once(&mut self.lhs).chain(rhs)
    }
}

/// Interns `side`'s query into `table`; `false` when the table is full.
pub(crate) fn intern(side: &mut Side, table: &mut Vec<HistoryQuery>) -> bool {
    if let Some(i) = table.iter().position(|q| q.key == side.query.key) {
        side.index = u32::try_from(i).unwrap_or(u32::MAX);
        return true;
    }
    if table.len() >= MAX_HISTORY_QUERIES {
        return false;
    }
    side.index = u32::try_from(table.len()).unwrap_or(u32::MAX);
    table.push(side.query.clone());
    true
}

const HISTORY_KEYS: [&str; 7] = [
    "calls",
    "in",
    "same",
    "within",
    "aggregate",
    "of",
    "include_current",
];

fn bad(diags: &mut Diags<'_>, at: impl Into<String>, reason: impl Into<String>) {
    diags.push(
        at,
        CompileErrorKind::BadHistory {
            reason: reason.into(),
        },
    );
}

/// Parses a window: a positive integer and a unit `s`, `m`, `h` or `d` (`90s`, `15m`, `24h`, `7d`).
pub fn parse_window(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.len().saturating_sub(1);
    let (digits, unit) = (t.get(..split).unwrap_or(""), t.get(split..).unwrap_or(""));
    let mult: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "`within: {text}` must be a number and a unit s, m, h or d (e.g. 24h)"
            ));
        }
    };
    let n: u64 = digits
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("`within: {text}` must start with a whole number above 0"))?;
    let secs = n
        .checked_mul(mult)
        .filter(|s| *s <= MAX_HISTORY_WINDOW_SECS)
        .ok_or_else(|| format!("`within: {text}` is longer than the maximum of 366d"))?;
    Ok(secs)
}

fn parse_path(text: &str) -> Option<Vec<String>> {
    let segs: Vec<String> = text.split('.').map(|s| s.trim().to_owned()).collect();
    segs.iter().all(|s| !s.is_empty()).then_some(segs)
}

/// Compiles the map under `history` (at `at`, e.g. `conditions.history`).
#[allow(
    clippy::too_many_lines,
    reason = "one block per key of a history query, in the order they are documented; every \
              problem is reported before returning"
)]
pub(crate) fn compile_side(
    v: &Value,
    at: &str,
    default_tool: Option<&str>,
    diags: &mut Diags<'_>,
) -> Option<Side> {
    let Value::Object(m) = v else {
        bad(
            diags,
            at,
            format!(
                "`history` must be a map of calls, in, same, within, aggregate, of and include_current, found {}",
                type_name(v)
            ),
        );
        return None;
    };
    let before = diags.list.len();
    for key in m.keys() {
        if !HISTORY_KEYS.contains(&key.as_str()) {
            bad(
                diags,
                format!("{at}.{key}"),
                format!(
                    "unknown key `{key}` in a history query; expected calls, in, same, within, aggregate, of or include_current"
                ),
            );
        }
    }
    let text = |key: &str, diags: &mut Diags<'_>| -> Option<String> {
        match m.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
            Some(other) => {
                bad(
                    diags,
                    format!("{at}.{key}"),
                    format!(
                        "`{key}` must be a non-empty string, found {}",
                        type_name(other)
                    ),
                );
                None
            }
        }
    };
    let calls = match text("calls", diags) {
        Some(c) => c,
        None => match default_tool {
            Some(t) => t.to_owned(),
            None => {
                if !m.contains_key("calls") {
                    bad(
                        diags,
                        format!("{at}.calls"),
                        "`calls` is required in a policy that is not scoped to one tool",
                    );
                }
                String::new()
            }
        },
    };
    let scope = match text("in", diags).as_deref() {
        None | Some("session") => HistoryScope::Session,
        Some("agent") => HistoryScope::Agent,
        Some("everyone") => HistoryScope::Everyone,
        Some(other) => {
            bad(
                diags,
                format!("{at}.in"),
                format!("unknown history scope `{other}`; expected session, agent or everyone"),
            );
            HistoryScope::Session
        }
    };
    let mut same = Vec::new();
    let mut same_text = Vec::new();
    let same_items: Vec<&Value> = match m.get("same") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.iter().collect(),
        Some(s @ Value::String(_)) => vec![s],
        Some(other) => {
            bad(
                diags,
                format!("{at}.same"),
                format!(
                    "`same` must be a list of argument paths, found {}",
                    type_name(other)
                ),
            );
            Vec::new()
        }
    };
    for (i, item) in same_items.into_iter().enumerate() {
        match item
            .as_str()
            .map(str::trim)
            .and_then(|s| Some((s, parse_path(s)?)))
        {
            Some((s, path)) if !s.starts_with("result.") && !s.starts_with("phrony.") => {
                same_text.push(s.to_owned());
                same.push(path);
            }
            _ => bad(
                diags,
                format!("{at}.same[{i}]"),
                format!(
                    "`same[{i}]` must be an argument path such as `customer_id` or `order.id`, found {item}"
                ),
            ),
        }
    }
    let within_secs = text("within", diags).and_then(|w| match parse_window(&w) {
        Ok(secs) => Some(secs),
        Err(message) => {
            bad(diags, format!("{at}.within"), message);
            None
        }
    });
    let aggregate = match text("aggregate", diags) {
        None => {
            if !m.contains_key("aggregate") {
                bad(
                    diags,
                    format!("{at}.aggregate"),
                    "`aggregate` is required: count, sum, max, last or exists",
                );
            }
            None
        }
        Some(a) => {
            let parsed = Aggregate::parse(&a);
            if parsed.is_none() {
                bad(
                    diags,
                    format!("{at}.aggregate"),
                    format!("unknown aggregate `{a}`; expected count, sum, max, last or exists"),
                );
            }
            parsed
        }
    };
    let of_text = text("of", diags);
    let (mut of_args, mut of_result) = (None, None);
    if let Some(of) = &of_text {
        match of.strip_prefix("result.") {
            Some(rest) => match parse_path(rest) {
                Some(p) => of_result = Some(p),
                None => bad(
                    diags,
                    format!("{at}.of"),
                    format!("invalid result path `{of}`"),
                ),
            },
            None if of.starts_with("phrony.") => bad(
                diags,
                format!("{at}.of"),
                format!("`of: {of}` must be an argument path or `result.<path>`"),
            ),
            None => match parse_path(of) {
                Some(p) => of_args = Some(p),
                None => bad(
                    diags,
                    format!("{at}.of"),
                    format!("invalid argument path `{of}`"),
                ),
            },
        }
    }
    let include_current = match m.get("include_current") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            bad(
                diags,
                format!("{at}.include_current"),
                format!(
                    "`include_current` must be true or false, found {}",
                    type_name(other)
                ),
            );
            None
        }
    };
    if let Some(agg) = aggregate {
        match agg {
            Aggregate::Sum | Aggregate::Max | Aggregate::Last if of_text.is_none() => bad(
                diags,
                format!("{at}.of"),
                format!(
                    "`aggregate: {}` needs `of`: the argument path (or `result.<path>`) to aggregate",
                    agg.as_str()
                ),
            ),
            Aggregate::Count | Aggregate::Exists if of_text.is_some() => bad(
                diags,
                format!("{at}.of"),
                format!("`aggregate: {}` takes no `of`", agg.as_str()),
            ),
            _ => {}
        }
        if matches!(agg, Aggregate::Last | Aggregate::Exists) && include_current == Some(true) {
            bad(
                diags,
                format!("{at}.include_current"),
                "`include_current` applies only to count, sum and max",
            );
        }
    }
    let aggregate = aggregate?;
    if diags.list.len() != before {
        return None;
    }
    let key = format!(
        "{calls}|{}|{}|{}|{}|{}",
        scope.as_str(),
        same_text.join(","),
        within_secs.map(|w| w.to_string()).unwrap_or_default(),
        aggregate.as_str(),
        of_text.as_deref().unwrap_or("")
    );
    Some(Side {
        query: HistoryQuery {
            key,
            calls,
            scope,
            same,
            same_text,
            within_secs,
            aggregate,
            of_args,
            of_result,
            of_text,
        },
        index: u32::MAX,
        include_current: include_current.unwrap_or(aggregate.counts_reserved()),
    })
}

/// Compiles the named history facts of a Cedar policy (`cedar_history`): each name a Cedar
/// identifier, each value a history query map.
pub(crate) fn compile_named(
    named: &std::collections::BTreeMap<String, Value>,
    default_tool: Option<&str>,
    diags: &mut Diags<'_>,
) -> Vec<(String, Side)> {
    let mut out = Vec::with_capacity(named.len());
    for (name, v) in named {
        let at = format!("cedar_history.{name}");
        let mut chars = name.chars();
        let ident = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident {
            bad(
                diags,
                at,
                format!(
                    "`{name}` is not a Cedar identifier (letters, digits and `_`, not starting \
                     with a digit): Cedar reads it as `context.history.{name}`"
                ),
            );
            continue;
        }
        if let Some(side) = compile_side(v, &at, default_tool, diags) {
            out.push((name.clone(), side));
        }
    }
    out
}

/// Compiles a leaf node `{history: {...}, op, value | value_from}` at `at`.
pub(crate) fn compile_leaf(
    m: &Map<String, Value>,
    at: &str,
    default_tool: Option<&str>,
    diags: &mut Diags<'_>,
) -> Option<HistoryLeaf> {
    let lhs = compile_side(&m["history"], &format!("{at}.history"), default_tool, diags);
    let op_at = format!("{at}.op");
    let (kind, op_name) = crate::condition::parse_op(m, &op_at, diags)?;
    let num = match kind {
        OpName::Eq => NumCmp::Eq,
        OpName::Neq => NumCmp::Neq,
        OpName::Gt => NumCmp::Gt,
        OpName::Gte => NumCmp::Gte,
        OpName::Lt => NumCmp::Lt,
        OpName::Lte => NumCmp::Lte,
        _ => {
            bad(
                diags,
                op_at,
                format!(
                    "a history condition compares with eq, neq, gt, gte, lt or lte, not `{op_name}`"
                ),
            );
            return None;
        }
    };
    let exists = lhs
        .as_ref()
        .is_some_and(|s| s.query.aggregate == Aggregate::Exists);
    let cmp = match (m.get("value"), m.get("value_from")) {
        (Some(_), Some(_)) => {
            bad(
                diags,
                format!("{at}.value_from"),
                "give `value` or `value_from`, not both",
            );
            return None;
        }
        (None, None) => {
            bad(
                diags,
                format!("{at}.value"),
                "a history condition needs `value` (a number, or true/false for exists) or `value_from: {history: …}`",
            );
            return None;
        }
        (Some(value), None) => {
            let fits = if exists {
                value.is_boolean() && matches!(num, NumCmp::Eq | NumCmp::Neq)
            } else {
                number(value).is_some()
            };
            if !fits {
                bad(
                    diags,
                    format!("{at}.value"),
                    if exists {
                        format!(
                            "`aggregate: exists` compares with eq or neq against true or false, found {value}"
                        )
                    } else {
                        format!("a history aggregate compares with a number, found {value}")
                    },
                );
                return None;
            }
            Cmp::Value(Op::compile(
                kind,
                op_name,
                Some(value),
                &format!("{at}.value"),
                diags,
            )?)
        }
        (None, Some(from)) => {
            let from_at = format!("{at}.value_from");
            let inner = match from {
                Value::Object(f) if f.len() == 1 && f.contains_key("history") => &f["history"],
                other => {
                    bad(
                        diags,
                        from_at,
                        format!(
                            "`value_from` must be a map with one key, `history`, found {other}"
                        ),
                    );
                    return None;
                }
            };
            let side = compile_side(inner, &format!("{from_at}.history"), default_tool, diags)?;
            if exists || side.query.aggregate == Aggregate::Exists {
                bad(
                    diags,
                    from_at,
                    "`value_from` compares two numeric aggregates (count, sum, max or last), not exists",
                );
                return None;
            }
            Cmp::From(num, side)
        }
    };
    Some(HistoryLeaf { lhs: lhs?, cmp })
}

/// One earlier call, for computing facts in memory ([`HistoryFacts::from_calls`]): what
/// `phrony policies check --history` and the examples' `cases.yaml` describe.
#[derive(Debug, Clone, Copy)]
pub struct EarlierCall<'a> {
    /// Its tool.
    pub tool: ToolCtx<'a>,
    /// Its arguments.
    pub args: &'a Value,
    /// Its result, when it succeeded.
    pub result: Option<&'a Value>,
    /// Its session id.
    pub session: &'a str,
    /// Its agent `namespace/name`.
    pub agent: &'a str,
    /// When it was decided (Unix seconds); `None`: inside every window.
    pub at_unix: Option<i64>,
    /// `true`: it succeeded (committed); `false`: still reserved (in flight, waiting for an
    /// approval, or of unknown outcome).
    pub committed: bool,
}

impl HistoryFacts {
    /// The facts of `req` computed from a list of earlier calls, with the semantics of the
    /// runtime's ledger index: `count`/`sum`/`max` over reserved and committed calls, `last`
    /// (the latest by `at_unix`, then list order) and `exists` over committed ones, scope and
    /// group and window as the queries say. A query whose `same` arguments `req` lacks gets no
    /// fact (its leaves fail closed).
    pub fn from_calls(
        set: &crate::PolicySet,
        req: &Request<'_>,
        earlier: &[EarlierCall<'_>],
    ) -> Self {
        let queries = set.history_queries();
        let mut facts = Self::new(queries.len());
        let agent = req
            .agent
            .map(|a| format!("{}/{}", a.namespace, a.name))
            .unwrap_or_default();
        let session = req.session.map(|s| s.id).unwrap_or_default();
        for (index, q) in queries.iter().enumerate() {
            let Some(group) = q.group_key(req.args) else {
                continue;
            };
            let mut fact = HistoryFact::default();
            let mut last_at = i64::MIN;
            for call in earlier {
                let in_scope = match q.scope {
                    HistoryScope::Session => call.session == session,
                    HistoryScope::Agent => call.agent == agent,
                    HistoryScope::Everyone => true,
                };
                let in_window = match (q.within_secs, call.at_unix, req.now_unix) {
                    (Some(w), Some(at), Some(now)) => {
                        at >= now.saturating_sub(i64::try_from(w).unwrap_or(i64::MAX))
                    }
                    _ => true,
                };
                if !in_scope
                    || !in_window
                    || !q.matches_tool(&call.tool)
                    || q.group_key(call.args).as_deref() != Some(group.as_str())
                {
                    continue;
                }
                let amount = match (&q.of_args, &q.of_result) {
                    (Some(_), _) => q.amount(call.args),
                    (None, Some(path)) if call.committed => {
                        call.result.and_then(|r| lookup(r, path)).and_then(number)
                    }
                    _ => None,
                };
                fact.count += 1;
                fact.sum += amount.unwrap_or(0.0);
                if let Some(a) = amount {
                    fact.max = Some(fact.max.map_or(a, |m| m.max(a)));
                }
                if call.committed {
                    fact.committed += 1;
                    let at = call.at_unix.unwrap_or(i64::MIN);
                    if amount.is_some() && at >= last_at {
                        last_at = at;
                        fact.last = amount;
                    }
                }
            }
            facts.set(index, fact);
        }
        facts
    }
}
