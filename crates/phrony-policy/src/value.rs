//! Values seen at evaluation time and expected values prepared at compile time, and the one
//! equality both `eq` and allow lists use.

use std::fmt::{self, Write as _};

use serde_json::Value;

use crate::text::{StackStr, eq_folded, fold, parse_number};

/// A value found at a field path: part of the arguments or of the context.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Actual<'a> {
    /// A JSON value (arguments, session metadata, principal claims).
    Json(&'a Value),
    /// A context string (tool ref, agent name, weekday…).
    Str(&'a str),
    /// A context number (time).
    Num(f64),
}

impl Actual<'_> {
    /// The numeric reading: JSON numbers, and strings that parse as finite numbers.
    pub(crate) fn number(self) -> Option<f64> {
        match self {
            Actual::Json(Value::Number(n)) => n.as_f64().filter(|f| f.is_finite()),
            Actual::Json(Value::String(s)) => parse_number(s),
            Actual::Str(s) => parse_number(s),
            Actual::Num(n) => Some(n),
            Actual::Json(_) => None,
        }
    }

    pub(crate) fn is_null(self) -> bool {
        matches!(self, Actual::Json(Value::Null))
    }

    /// Calls `f` with the string form of a string, number or boolean; `None` for null, lists and
    /// maps.
    pub(crate) fn with_text<R>(self, f: impl FnOnce(&str) -> R) -> Option<R> {
        match self {
            Actual::Json(Value::Null | Value::Array(_) | Value::Object(_)) => None,
            other => Some(other.with_any_text(f)),
        }
    }

    /// Calls `f` with the string form of any value: numbers formatted on the stack, null as
    /// `null`, lists and maps as compact JSON (the only case that allocates).
    pub(crate) fn with_any_text<R>(self, f: impl FnOnce(&str) -> R) -> R {
        match self {
            Actual::Json(Value::String(s)) => f(s),
            Actual::Str(s) => f(s),
            Actual::Json(Value::Bool(b)) => f(if *b { "true" } else { "false" }),
            Actual::Json(Value::Null) => f("null"),
            Actual::Json(Value::Number(n)) => {
                let mut buf = StackStr::new();
                // Writing to a `StackStr` cannot fail.
                let _ = write!(buf, "{n}");
                f(buf.as_str())
            }
            Actual::Num(n) => {
                let mut buf = StackStr::new();
                let _ = write!(buf, "{n}");
                f(buf.as_str())
            }
            Actual::Json(v @ (Value::Array(_) | Value::Object(_))) => f(&v.to_string()),
        }
    }
}

impl fmt::Display for Actual<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Actual::Json(Value::String(s)) => f.write_str(s),
            Actual::Str(s) => f.write_str(s),
            Actual::Json(v) => write!(f, "{v}"),
            Actual::Num(n) => write!(f, "{n}"),
        }
    }
}

/// An expected scalar, prepared once: its numeric reading and its folded string form.
#[derive(Debug, Clone)]
pub(crate) struct Scalar {
    num: Option<f64>,
    /// Trimmed, case-folded string form; `None` for null.
    text: Option<String>,
}

impl Scalar {
    /// Prepares a string, number, boolean or null; `None` for lists and maps.
    pub(crate) fn from_json(v: &Value) -> Option<Self> {
        Some(match v {
            Value::Null => Self {
                num: None,
                text: None,
            },
            Value::Bool(b) => Self {
                num: None,
                text: Some(b.to_string()),
            },
            Value::Number(n) => Self {
                num: n.as_f64().filter(|f| f.is_finite()),
                text: Some(fold(&n.to_string())),
            },
            Value::String(s) => Self::from_str(s),
            Value::Array(_) | Value::Object(_) => return None,
        })
    }

    /// Prepares a string.
    pub(crate) fn from_str(s: &str) -> Self {
        Self {
            num: parse_number(s),
            text: Some(fold(s)),
        }
    }

    /// The folded string form; `None` for null.
    pub(crate) fn text(&self) -> Option<&str> {
        self.text.as_deref()
    }

    /// The numeric reading, if any.
    pub(crate) fn num(&self) -> Option<f64> {
        self.num
    }

    /// The condition language's equality.
    ///
    /// - null equals only null;
    /// - when both sides read as numbers, numeric equality;
    /// - when exactly one side does, not equal;
    /// - otherwise the trimmed string forms, compared case-insensitively (lists and maps never
    ///   equal a scalar).
    pub(crate) fn matches(&self, actual: Actual<'_>) -> bool {
        if self.num.is_none()
            && let Some(text) = &self.text
        {
            // A non-numeric expected value: the actual's numeric reading need not be taken
            // (parsing is the costly part). Were the actual numeric, its folded text could not
            // equal `text` (the folded form of a numeric text still parses: folding maps no
            // character onto a digit, sign, `.` or `e`), so the text comparison is false exactly
            // when the numeric rule says so.
            return actual.with_text(|t| eq_folded(t, text)).unwrap_or(false);
        }
        self.matches_read(actual, actual.number())
    }

    /// [`matches`](Self::matches) given `number = actual.number()`, read once for a list.
    pub(crate) fn matches_read(&self, actual: Actual<'_>, number: Option<f64>) -> bool {
        let Some(text) = &self.text else {
            return actual.is_null();
        };
        match (number, self.num) {
            (Some(a), Some(b)) => a == b,
            (Some(_), None) | (None, Some(_)) => false,
            (None, None) => actual.with_text(|t| eq_folded(t, text)).unwrap_or(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn eq(actual: &Value, expected: &Value) -> bool {
        Scalar::from_json(expected)
            .expect("scalar")
            .matches(Actual::Json(actual))
    }

    #[test]
    fn equality_table() {
        let cases = [
            (json!(250), json!(250), true),
            (json!(250), json!(250.0), true),
            (json!("250"), json!(250), true),
            (json!(" 250 "), json!("250.0"), true),
            (json!(250), json!("abc"), false),
            (json!("EUR"), json!("eur"), true),
            (json!(" eur "), json!("EUR"), true),
            (json!("euro"), json!("eur"), false),
            (json!(true), json!(true), true),
            (json!(true), json!("TRUE"), true),
            (json!(false), json!(true), false),
            (json!(1), json!(true), false),
            (json!(null), json!(null), true),
            (json!("null"), json!(null), false),
            (json!(null), json!("null"), false),
            (json!({"a": 1}), json!("a"), false),
            (json!([1]), json!(1), false),
        ];
        for (actual, expected, want) in cases {
            assert_eq!(eq(&actual, &expected), want, "{actual} eq {expected}");
        }
    }

    #[test]
    fn context_values() {
        let s = Scalar::from_json(&json!("Monday")).unwrap();
        assert!(s.matches(Actual::Str("monday")));
        let n = Scalar::from_json(&json!(13)).unwrap();
        assert!(n.matches(Actual::Num(13.0)));
        assert!(!n.matches(Actual::Str("thirteen")));
    }

    #[test]
    fn text_forms() {
        assert_eq!(Actual::Num(13.0).with_text(str::to_owned).unwrap(), "13");
        assert_eq!(
            Actual::Json(&json!(2.5)).with_text(str::to_owned).unwrap(),
            "2.5"
        );
        assert_eq!(Actual::Json(&json!(null)).with_text(str::to_owned), None);
        assert_eq!(
            Actual::Json(&json!({"k": [1]})).with_any_text(str::to_owned),
            r#"{"k":[1]}"#
        );
        assert_eq!(
            Actual::Json(&json!(null)).with_any_text(str::to_owned),
            "null"
        );
        assert_eq!(
            Actual::Json(&json!(false)).with_any_text(str::to_owned),
            "false"
        );
        assert_eq!(Actual::Json(&json!("EUR")).to_string(), "EUR");
        assert_eq!(Actual::Json(&json!(14000)).to_string(), "14000");
    }
}
