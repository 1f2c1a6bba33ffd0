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
/// with sorted keys, like a Go `map[string]any`.
#[derive(Clone, PartialEq, Default)]
pub struct Json(pub serde_json::Value);

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl From<serde_json::Value> for Json {
    fn from(v: serde_json::Value) -> Self {
        Self(v)
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
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(d).map(Json)
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
    fn escapes_html_characters_and_line_separators() {
        let v = json!({"b": "a<b>&c\u{2028}\n\"", "a": [1, 2.0, {"z": null, "y": true}]});
        let out = String::from_utf8(value_to_vec(&v).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"a":[1,2,{"y":true,"z":null}],"b":"a\u003cb\u003e\u0026c\u2028\n\""}"#
        );
    }
}
