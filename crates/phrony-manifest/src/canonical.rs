//! Canonical JSON: the bytes the reference runtime hashes (§1.9, §1.6).
//!
//! Compact, struct fields in declaration order, map keys sorted, `<`, `>`, `&`, U+2028 and U+2029
//! escaped as `\u003c`-style sequences, and floats printed like Go's `encoding/json` (`1` for
//! `1.0`, `1e+21`, `1e-7`). This is a [`serde_json::ser::Formatter`] plus a value wrapper that
//! sorts object keys itself, so the result does not depend on whether serde_json's
//! `preserve_order` feature is on.

use std::fmt;
use std::io;

use serde::de::{Deserialize, Deserializer};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use sha2::{Digest, Sha256};

/// Formats a float the way Go's `encoding/json` does.
pub(crate) fn go_float(v: f64) -> String {
    if v == 0.0 {
        // Go prints -0 as "-0".
        return if v.is_sign_negative() {
            "-0".to_owned()
        } else {
            "0".to_owned()
        };
    }
    let abs = v.abs();
    if (1e-6..1e21).contains(&abs) {
        // Shortest round-trip digits in plain notation; integral values have no ".0".
        return format!("{v}");
    }
    // Exponent form: Rust gives `1e21` / `1.5e-7`; Go gives `1e+21` / `1.5e-07`, then cleans
    // `e-07` to `e-7`. So: add the `+` sign and keep the (at least one digit) exponent.
    let s = format!("{v:e}");
    match s.split_once('e') {
        Some((mantissa, exp)) if !exp.starts_with('-') => {
            let exp = if exp.len() < 2 {
                format!("0{exp}")
            } else {
                exp.to_owned()
            };
            format!("{mantissa}e+{exp}")
        }
        _ => s,
    }
}

/// The Go-compatible formatter.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GoFormatter;

impl serde_json::ser::Formatter for GoFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(go_float(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        w.write_all(go_float(f64::from(value)).as_bytes())
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let esc = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            w.write_all(&fragment.as_bytes()[start..i])?;
            w.write_all(esc.as_bytes())?;
            start = i + c.len_utf8();
        }
        w.write_all(&fragment.as_bytes()[start..])
    }
}

/// Serializes `value` as canonical JSON.
pub(crate) fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::with_capacity(1024);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    value.serialize(&mut ser)?;
    Ok(out)
}

/// Hex sha256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A free-form JSON value (inline schemas, conditions, runtime maps) whose objects serialize
/// with sorted keys, like a Go `map[string]any`. Build it with `From` (and read it with serde):
/// both give the value its canonical shape, so a value equals its own written-and-read copy.
#[derive(Clone, PartialEq, Default)]
pub struct Json(pub serde_json::Value);

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl From<serde_json::Value> for Json {
    /// The value in its canonical shape (see [`normalize`]).
    fn from(v: serde_json::Value) -> Self {
        Self(normalize(v))
    }
}

struct Sorted<'a>(&'a serde_json::Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                let mut m = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    m.serialize_entry(k, &Sorted(v))?;
                }
                m.end()
            }
            serde_json::Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(&Sorted(v))?;
                }
                seq.end()
            }
            other => other.serialize(s),
        }
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Sorted(&self.0).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Json {
    /// Reads a value in its canonical shape (see [`normalize`]), so that reading what
    /// [`to_vec`] wrote gives back an equal value: the canonical form is a fixed point.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(d).map(|v| Json(normalize(v)))
    }
}

/// The canonical shape of a free-form value: a float with an integral value that fits an
/// integer becomes that integer (the reference runtime reads every JSON number as a Go
/// `float64`, so `50`, `50.0` and `50.00` are one number, and [`go_float`] writes all three as
/// `50`, which reads back as an integer), and object keys are in sorted order (they are written
/// sorted; this keeps an in-memory value equal to its re-read whatever map type serde_json uses).
pub(crate) fn normalize(v: serde_json::Value) -> serde_json::Value {
    use serde_json::{Number, Value};
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 => {
                // An integral f64 inside these bounds converts exactly (2^64 and -2^63 are exact
                // in f64; `as` would saturate outside them).
                if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                    Value::Number(Number::from(f as u64))
                } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                    Value::Number(Number::from(f as i64))
                } else {
                    Value::Number(n)
                }
            }
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(normalize).collect()),
        Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, normalize(v)))
                    .collect(),
            )
        }
        other => other,
    }
}

/// Canonical JSON of a free-form value (sorted keys, Go escaping and floats).
#[cfg(test)]
pub(crate) fn value_to_vec(v: &serde_json::Value) -> Result<Vec<u8>, serde_json::Error> {
    to_vec(&Sorted(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_print_like_go() {
        let cases = [
            (1.0, "1"),
            (1000.0, "1000"),
            (250.5, "250.5"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1.5e300, "1.5e+300"),
            (0.000001, "0.000001"),
            (1.5e-7, "1.5e-7"),
            (1e-10, "1e-10"),
            (0.0, "0"),
        ];
        for (v, want) in cases {
            assert_eq!(go_float(v), want, "{v}");
        }
    }

    #[test]
    fn integral_floats_read_as_integers_and_the_written_form_is_a_fixed_point() {
        let read = |text: &str| serde_json::from_str::<Json>(text).unwrap();
        assert_eq!(read("50.00"), Json(json!(50)));
        assert_eq!(read("-3.0"), Json(json!(-3)));
        assert_eq!(read("-0.0"), Json(json!(0)));
        assert_eq!(read("1.5"), Json(json!(1.5)));
        // Out of the integer ranges: stays a float, written and read back alike.
        for text in [
            "18446744073709551616.0",
            "1e20",
            "-9223372036854775809.0",
            "18446744073709551615",
            "-9223372036854775808.0",
            "1.5e-7",
            "{\"b\":[2.50,{\"z\":1,\"a\":7.0}],\"a\":1e300}",
        ] {
            let first = read(text);
            let written = to_vec(&first).unwrap();
            let second: Json = serde_json::from_slice(&written).unwrap();
            assert_eq!(second, first, "{text}");
            assert_eq!(to_vec(&second).unwrap(), written, "{text}");
        }
        assert_eq!(read("-9223372036854775808.0"), Json(json!(i64::MIN)));
        assert_eq!(
            to_vec(&read("18446744073709551616.0")).unwrap(),
            b"18446744073709552000"
        );
    }

    #[test]
    fn escapes_html_characters_and_line_separators() {
        let v = json!({"b": "a<b>&c\u{2028}\n\"", "a": [1, 2.0, {"z": null, "y": true}]});
        let out = String::from_utf8(value_to_vec(&v).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"a":[1,2,{"y":true,"z":null}],"b":"a\u003cb\u003e\u0026c\u2028\n\""}"#
        );
    }
}
