//! Field paths: parsing (once, at compile time) and resolution against a request.
//!
//! A path is a dot-separated list of keys, each optionally followed by array steps:
//! `customer.tier`, `items[0].sku`, `items[any].price`, `orders[all].lines[any].qty`.
//! Empty segments are skipped (`a..b` is `a.b`). A path whose first key is `phrony` reads the
//! call's context instead of its arguments (see [`Source`]).

use serde_json::Value;

use crate::def::write_ref;
use crate::error::{CompileErrorKind, Diags};
use crate::request::Request;
use crate::slots::{self, Root, SlotRef, Slots};
use crate::text::StackStr;
use crate::value::Actual;

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Seg {
    /// A map key.
    Key(String),
    /// An array index.
    Index(usize),
    /// Some element of an array.
    Any,
    /// Every element of a non-empty array.
    All,
}

/// Longest path accepted, in steps; bounds the recursion of evaluation.
const MAX_STEPS: usize = 64;

/// Parses a path into steps.
pub(crate) fn parse_segments(field: &str) -> Result<Vec<Seg>, String> {
    let mut segs = Vec::new();
    for piece in field.split('.') {
        if piece.is_empty() {
            continue;
        }
        let (key, mut rest) = match piece.find('[') {
            Some(i) => piece.split_at(i),
            None => (piece, ""),
        };
        if key.contains(']') {
            return Err(format!("unexpected `]` in `{piece}`"));
        }
        if !key.is_empty() {
            segs.push(Seg::Key(key.to_owned()));
        }
        while !rest.is_empty() {
            let Some(inner) = rest.strip_prefix('[') else {
                return Err(format!("unexpected `{rest}` after `]` in `{piece}`"));
            };
            let Some(close) = inner.find(']') else {
                return Err(format!("unclosed `[` in `{piece}`"));
            };
            let step = &inner[..close];
            segs.push(match step {
                "any" => Seg::Any,
                "all" => Seg::All,
                _ if !step.is_empty() && step.bytes().all(|b| b.is_ascii_digit()) => Seg::Index(
                    step.parse()
                        .map_err(|_| format!("index `{step}` is too large"))?,
                ),
                _ => {
                    return Err(format!(
                        "`[{step}]` is not an array step; expected an index, `[any]` or `[all]`"
                    ));
                }
            });
            rest = &inner[close + 1..];
        }
    }
    if segs.is_empty() {
        return Err("the path is empty".to_owned());
    }
    if segs.len() > MAX_STEPS {
        return Err(format!("the path has more than {MAX_STEPS} steps"));
    }
    Ok(segs)
}

/// Walks `segs` from `v` and calls `leaf` with what is found (`None` when the path is missing or
/// crosses a value of the wrong kind). `[any]` is true when `leaf` holds for some element,
/// `[all]` when it holds for every element of a non-empty array.
pub(crate) fn walk<'v, F>(segs: &[Seg], v: &'v Value, leaf: &mut F) -> bool
where
    F: FnMut(Option<Actual<'v>>) -> bool,
{
    let Some((first, rest)) = segs.split_first() else {
        return leaf(Some(Actual::Json(v)));
    };
    match first {
        Seg::Key(k) => match v.as_object().and_then(|m| m.get(k)) {
            Some(child) => walk(rest, child, leaf),
            None => leaf(None),
        },
        Seg::Index(i) => match v.as_array().and_then(|a| a.get(*i)) {
            Some(child) => walk(rest, child, leaf),
            None => leaf(None),
        },
        Seg::Any => match v.as_array() {
            Some(items) => items.iter().any(|e| walk(rest, e, leaf)),
            None => leaf(None),
        },
        Seg::All => match v.as_array() {
            Some(items) if !items.is_empty() => items.iter().all(|e| walk(rest, e, leaf)),
            // Nothing can show that every element qualifies: false, like a missing field.
            Some(_) => false,
            None => leaf(None),
        },
    }
}

/// Where a field reads from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source {
    /// The tool arguments.
    Args(Vec<Seg>),
    ToolRef,
    ToolVersion,
    ToolSideEffectClass,
    ToolName,
    AgentRef,
    AgentNamespace,
    AgentName,
    AgentVersion,
    SessionId,
    /// `phrony.session.metadata[.path]`.
    SessionMetadata(Vec<Seg>),
    /// `phrony.principal[.path]`.
    Principal(Vec<Seg>),
    TimeUnix,
    TimeHour,
    TimeWeekday,
}

/// What a `field` string names.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Field {
    /// A value to test with an operator.
    Value(Source),
    /// `phrony.dispatch.trigger`.
    Trigger,
    /// `dispatch.outcome` (shorthand for the trigger, with a `dispatch:` prefix added to values).
    Outcome,
}

impl Field {
    /// Parses a field string, reporting problems at `at`.
    pub(crate) fn parse(field: &str, at: &str, diags: &mut Diags<'_>) -> Option<Field> {
        let segs = match parse_segments(field) {
            Ok(segs) => segs,
            Err(reason) => {
                diags.push(
                    at,
                    CompileErrorKind::BadPath {
                        field: field.to_owned(),
                        reason,
                    },
                );
                return None;
            }
        };
        if let [Seg::Key(a), Seg::Key(b)] = segs.as_slice()
            && a == "dispatch"
            && b == "outcome"
        {
            return Some(Field::Outcome);
        }
        match segs.split_first() {
            Some((Seg::Key(root), rest)) if root == "phrony" => {
                let parsed = context_field(rest);
                if parsed.is_none() {
                    diags.push(
                        at,
                        CompileErrorKind::UnknownContextField {
                            field: field.to_owned(),
                        },
                    );
                }
                parsed
            }
            _ => Some(Field::Value(Source::Args(segs))),
        }
    }
}

fn key(s: &Seg) -> Option<&str> {
    match s {
        Seg::Key(k) => Some(k),
        _ => None,
    }
}

fn context_field(rest: &[Seg]) -> Option<Field> {
    let (first, tail) = rest.split_first()?;
    let group = key(first)?;
    if matches!(group, "session" | "principal") {
        return match (group, tail) {
            ("principal", path) => Some(Field::Value(Source::Principal(path.to_vec()))),
            ("session", [id]) if key(id) == Some("id") => Some(Field::Value(Source::SessionId)),
            ("session", [meta, path @ ..]) if key(meta) == Some("metadata") => {
                Some(Field::Value(Source::SessionMetadata(path.to_vec())))
            }
            _ => None,
        };
    }
    let [leaf] = tail else { return None };
    let source = match (group, key(leaf)?) {
        ("tool", "ref") => Source::ToolRef,
        ("tool", "version") => Source::ToolVersion,
        ("tool", "side_effect_class") => Source::ToolSideEffectClass,
        ("tool", "name") => Source::ToolName,
        ("agent", "ref") => Source::AgentRef,
        ("agent", "namespace") => Source::AgentNamespace,
        ("agent", "name") => Source::AgentName,
        ("agent", "version") => Source::AgentVersion,
        ("time", "unix") => Source::TimeUnix,
        ("time", "hour") => Source::TimeHour,
        ("time", "weekday") => Source::TimeWeekday,
        ("dispatch", "trigger") => return Some(Field::Trigger),
        _ => return None,
    };
    Some(Field::Value(source))
}

const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// UTC hour of day (0–23) of a Unix time.
pub(crate) fn utc_hour(unix: i64) -> i64 {
    unix.rem_euclid(86_400) / 3_600
}

/// UTC weekday name (`monday`…`sunday`) of a Unix time. 1970-01-01 was a Thursday.
pub(crate) fn utc_weekday(unix: i64) -> &'static str {
    let days = unix.div_euclid(86_400);
    // `rem_euclid(7)` is in 0..7, so the index is in bounds.
    WEEKDAYS[(days + 3).rem_euclid(7) as usize]
}

fn present(s: &str) -> Option<Actual<'_>> {
    (!s.is_empty()).then_some(Actual::Str(s))
}

impl Source {
    /// Resolves the source against a request and calls `leaf` with what is found.
    pub(crate) fn resolve<F>(&self, req: &Request<'_>, leaf: &mut F) -> bool
    where
        F: for<'x> FnMut(Option<Actual<'x>>) -> bool,
    {
        match self {
            Source::Args(segs) => walk(segs, req.args, leaf),
            Source::ToolRef => leaf(present(req.tool.r#ref)),
            Source::ToolVersion => leaf(present(req.tool.version)),
            Source::ToolSideEffectClass => leaf(present(req.tool.side_effect_class)),
            Source::ToolName => leaf(present(req.tool.name)),
            Source::AgentRef => match req.agent {
                Some(a) if !a.name.is_empty() => {
                    let mut buf = StackStr::new();
                    // Writing to a `StackStr` cannot fail.
                    let _ = write_ref(&mut buf, a.namespace, a.name, a.version);
                    leaf(Some(Actual::Str(buf.as_str())))
                }
                _ => leaf(None),
            },
            Source::AgentNamespace => leaf(req.agent.and_then(|a| present(a.namespace))),
            Source::AgentName => leaf(req.agent.and_then(|a| present(a.name))),
            Source::AgentVersion => leaf(req.agent.and_then(|a| present(a.version))),
            Source::SessionId => leaf(req.session.and_then(|s| present(s.id))),
            Source::SessionMetadata(segs) => match req.session.and_then(|s| s.metadata) {
                Some(meta) => walk(segs, meta, leaf),
                None => leaf(None),
            },
            Source::Principal(segs) => match req.principal {
                Some(claims) => walk(segs, claims, leaf),
                None => leaf(None),
            },
            Source::TimeUnix => leaf(req.now_unix.map(|t| Actual::Num(t as f64))),
            Source::TimeHour => leaf(req.now_unix.map(|t| Actual::Num(utc_hour(t) as f64))),
            Source::TimeWeekday => leaf(req.now_unix.map(|t| Actual::Str(utc_weekday(t)))),
        }
    }

    /// The root and steps of a path into JSON (arguments, session metadata, principal claims);
    /// `None` for the other context fields.
    pub(crate) fn json_path(&self) -> Option<(Root, &[Seg])> {
        match self {
            Source::Args(segs) => Some((Root::Args, segs)),
            Source::SessionMetadata(segs) => Some((Root::SessionMetadata, segs)),
            Source::Principal(segs) => Some((Root::Principal, segs)),
            _ => None,
        }
    }

    /// Looks the path's plain prefix up through the decision's path slots: the value at the
    /// prefix (`None`: missing) and the steps after it, still to walk. `None` when the leaf has
    /// no slot or the decision lacks it (the path is then resolved directly).
    #[inline]
    pub(crate) fn slotted<'a>(
        &self,
        req: &Request<'a>,
        slot: Option<SlotRef>,
        slots: Slots<'_, 'a>,
    ) -> Option<(Option<&'a Value>, &[Seg])> {
        let slot = slot?;
        let cell = slots.get(usize::try_from(slot.index).ok()?)?;
        let (root, segs) = self.json_path()?;
        let (prefix, rest) = segs.split_at_checked(usize::try_from(slot.plain).ok()?)?;
        Some((slots::resolve(cell, root, prefix, req), rest))
    }

    /// Whether the source reads the call's arguments (every other source is the call's context).
    pub(crate) fn reads_args(&self) -> bool {
        matches!(self, Source::Args(_))
    }

    /// Whether the path has an `[any]` step.
    pub(crate) fn has_any_step(&self) -> bool {
        match self {
            Source::Args(segs) | Source::SessionMetadata(segs) | Source::Principal(segs) => {
                segs.contains(&Seg::Any)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::request::{AgentCtx, SessionCtx, ToolCtx};

    fn k(s: &str) -> Seg {
        Seg::Key(s.to_owned())
    }

    #[test]
    fn parses_path_forms() {
        let ok = [
            ("amount", vec![k("amount")]),
            ("customer.tier", vec![k("customer"), k("tier")]),
            ("a..b.", vec![k("a"), k("b")]),
            ("items[0].sku", vec![k("items"), Seg::Index(0), k("sku")]),
            ("items[any].price", vec![k("items"), Seg::Any, k("price")]),
            ("m[all][2]", vec![k("m"), Seg::All, Seg::Index(2)]),
            ("[any].x", vec![Seg::Any, k("x")]),
        ];
        for (input, want) in ok {
            assert_eq!(parse_segments(input).unwrap(), want, "{input}");
        }
        for bad in [
            "",
            "..",
            "items[",
            "items[x]",
            "items[-1]",
            "items[]",
            "items[0]x",
            "a]b",
            "items[99999999999999999999999]",
        ] {
            assert!(parse_segments(bad).is_err(), "{bad} should not parse");
        }
    }

    fn first_leaf(segs: &[Seg], v: &Value) -> Option<String> {
        let mut seen = None;
        walk(segs, v, &mut |a: Option<Actual<'_>>| {
            seen = a.map(|a| a.to_string());
            true
        });
        seen
    }

    #[test]
    fn walks_maps_and_arrays() {
        let v =
            json!({"customer": {"tier": "gold"}, "items": [{"sku": "A"}, {"sku": "B"}], "n": 3});
        let p = |s: &str| parse_segments(s).unwrap();
        assert_eq!(first_leaf(&p("customer.tier"), &v).as_deref(), Some("gold"));
        assert_eq!(first_leaf(&p("items[1].sku"), &v).as_deref(), Some("B"));
        assert_eq!(first_leaf(&p("items[2].sku"), &v), None);
        assert_eq!(first_leaf(&p("n.x"), &v), None);
        assert_eq!(first_leaf(&p("n[0]"), &v), None);
        assert_eq!(first_leaf(&p("customer[any]"), &v), None);
    }

    #[test]
    fn context_fields_parse_and_resolve() {
        let meta = json!({"channel": "email", "tags": ["vip"]});
        let claims = json!({"role": "Ops", "groups": ["a", "b"]});
        let args = json!({});
        let req = Request::new(
            ToolCtx {
                r#ref: "payments.issue-refund",
                version: "1.0.0",
                side_effect_class: "non_idempotent_write",
                name: "issue_refund",
            },
            &args,
        )
        .with_agent(AgentCtx {
            namespace: "support",
            name: "refund-agent",
            version: "1.2.0",
        })
        .with_session(SessionCtx {
            id: "s-1",
            metadata: Some(&meta),
        })
        .with_principal(&claims)
        // 2024-01-06T15:30:00Z, a Saturday.
        .at(1_704_555_000);
        let cases = [
            ("phrony.tool.ref", Some("payments.issue-refund")),
            ("phrony.tool.version", Some("1.0.0")),
            (
                "phrony.tool.side_effect_class",
                Some("non_idempotent_write"),
            ),
            ("phrony.tool.name", Some("issue_refund")),
            ("phrony.agent.ref", Some("support/refund-agent@1.2.0")),
            ("phrony.agent.namespace", Some("support")),
            ("phrony.agent.name", Some("refund-agent")),
            ("phrony.agent.version", Some("1.2.0")),
            ("phrony.session.id", Some("s-1")),
            ("phrony.session.metadata.channel", Some("email")),
            ("phrony.session.metadata.tags[0]", Some("vip")),
            ("phrony.session.metadata.missing", None),
            ("phrony.principal.role", Some("Ops")),
            ("phrony.principal.groups[1]", Some("b")),
            ("phrony.time.unix", Some("1704555000")),
            ("phrony.time.hour", Some("15")),
            ("phrony.time.weekday", Some("saturday")),
        ];
        for (field, want) in cases {
            let mut diags = Diags::new("p", 0);
            let Some(Field::Value(source)) = Field::parse(field, "conditions.field", &mut diags)
            else {
                panic!("{field} did not parse: {:?}", diags.list);
            };
            let mut seen = None;
            source.resolve(&req, &mut |a: Option<Actual<'_>>| {
                seen = a.map(|a| a.to_string());
                true
            });
            assert_eq!(seen.as_deref(), want, "{field}");
        }
        // Without context every context field is missing.
        let bare = Request::new(ToolCtx::default(), &args);
        for field in [
            "phrony.tool.ref",
            "phrony.agent.ref",
            "phrony.session.id",
            "phrony.time.hour",
        ] {
            let mut diags = Diags::new("p", 0);
            let Some(Field::Value(source)) = Field::parse(field, "f", &mut diags) else {
                panic!("{field}");
            };
            assert!(source.resolve(&bare, &mut |a: Option<Actual<'_>>| a.is_none()));
        }
    }

    #[test]
    fn special_and_unknown_fields() {
        let mut diags = Diags::new("p", 0);
        assert_eq!(
            Field::parse("phrony.dispatch.trigger", "f", &mut diags),
            Some(Field::Trigger)
        );
        assert_eq!(
            Field::parse("dispatch.outcome", "f", &mut diags),
            Some(Field::Outcome)
        );
        assert!(diags.list.is_empty());
        for bad in [
            "phrony",
            "phrony.tool",
            "phrony.tool.owner",
            "phrony.tool.ref.x",
            "phrony.session",
            "phrony.session.user",
            "phrony.time.minute",
            "phrony.dispatch.outcome",
            "phrony[0]",
        ] {
            let mut diags = Diags::new("p", 0);
            assert_eq!(
                Field::parse(bad, "conditions.field", &mut diags),
                None,
                "{bad}"
            );
            assert!(
                matches!(
                    diags.list[0].kind,
                    CompileErrorKind::UnknownContextField { .. }
                ),
                "{bad}: {:?}",
                diags.list
            );
            assert_eq!(diags.list[0].path, "conditions.field");
        }
    }

    #[test]
    fn calendar_arithmetic() {
        assert_eq!(utc_weekday(0), "thursday");
        assert_eq!(utc_hour(0), 0);
        assert_eq!(utc_weekday(-1), "wednesday");
        assert_eq!(utc_hour(-1), 23);
        // 2000-03-01T00:00:00Z was a Wednesday.
        assert_eq!(utc_weekday(951_868_800), "wednesday");
        assert_eq!(utc_hour(951_868_800 + 7_200), 2);
    }
}
