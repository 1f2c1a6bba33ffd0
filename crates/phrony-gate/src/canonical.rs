//! Canonical JSON byte-identical to Python's
//! `json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`.
//!
//! The receipt verifier recomputes `args_hash` in Python, so our bytes must match its bytes:
//! keys sorted by code point, no whitespace, non-ASCII emitted raw, integers as integers and
//! floats in Python's `repr` form (`400.0`, `1e-05`, `1e+16`).
//!
//! Limitation: integers outside the 64-bit range are parsed by `serde_json` as floats, so they
//! hash as Python floats would; such values do not occur in the Decision API's requests.

use std::fmt::Write as _;

use hmac::{Hmac, Mac};
use serde_json::{Number, Value};
use sha2::{Digest as _, Sha256};

/// The canonical JSON text of `value` (see the module docs).
#[must_use]
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

/// Lower-case hex SHA-256 of `bytes`.
#[must_use]
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Lower-case hex HMAC-SHA256 of `message` under `key`.
#[must_use]
pub fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC-SHA256 accepts keys of any length");
    mac.update(message);
    hex::encode(mac.finalize().into_bytes())
}

/// `args_hash`: SHA-256 (hex) of the canonical JSON of `{tool, action, resource, args}`.
#[must_use]
pub fn args_hash(tool: &str, action: &str, resource: Option<&str>, args: &Value) -> String {
    let binding = serde_json::json!({
        "tool": tool,
        "action": action,
        "resource": resource,
        "args": args,
    });
    sha256_hex(canonical_json(&binding).as_bytes())
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // UTF-8 byte order equals code point order, which is what Python sorts by.
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_value(out, &map[key]);
            }
            out.push('}');
        }
    }
}

fn write_string(out: &mut String, s: &str) {
    // serde_json escapes exactly the set Python escapes with ensure_ascii=False:
    // `"`, `\`, the short escapes \b \f \n \r \t, and other C0 controls as lower-case \u00XX.
    // Serialising a &str cannot fail.
    match serde_json::to_string(s) {
        Ok(text) => out.push_str(&text),
        Err(_) => out.push_str("\"\""),
    }
}

fn write_number(out: &mut String, n: &Number) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        out.push_str(&python_float_repr(f));
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed notation when the
/// decimal exponent is in `[-4, 16)` (with a trailing `.0` for integral values) and in
/// scientific notation otherwise (`1e-05`, `1.5e+16`).
#[must_use]
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    // Rust's `{:e}` prints the shortest round-trip digits: "1.2345e3", "1e-5", "-4e2".
    let sci = format!("{f:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    // `decpt` is where the decimal point sits relative to the digit string (Python's dtoa).
    let decpt = exponent + 1;
    let mut out = String::from(sign);
    if !(-4 < decpt && decpt <= 16) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exponent < 0 { '-' } else { '+' },
            exponent.abs()
        );
    } else if decpt <= 0 {
        out.push_str("0.");
        for _ in 0..(-decpt) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let point = usize::try_from(decpt).unwrap_or(0);
        if digits.len() <= point {
            out.push_str(&digits);
            for _ in digits.len()..point {
                out.push('0');
            }
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point]);
            out.push('.');
            out.push_str(&digits[point..]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn floats_follow_python_repr() {
        let cases = [
            (400.0, "400.0"),
            (1e-5, "1e-05"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123_456_789.125, "123456789.125"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (-0.0, "-0.0"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (12.0, "12.0"),
            (0.5, "0.5"),
        ];
        for (value, want) in cases {
            assert_eq!(python_float_repr(value), want, "{value}");
        }
    }

    #[test]
    fn canonical_form_sorts_keys_and_keeps_unicode_raw() {
        let v: Value =
            serde_json::from_str(r#"{"b":1,"a":[1.0,2,"ü\n\u0001"],"é":null,"Z":true}"#).unwrap();
        assert_eq!(
            canonical_json(&v),
            "{\"Z\":true,\"a\":[1.0,2,\"ü\\n\\u0001\"],\"b\":1,\"é\":null}"
        );
    }

    #[test]
    fn args_hash_matches_python() {
        // python3 -c 'import json,hashlib; print(hashlib.sha256(json.dumps({"tool":"payments",
        //   "action":"refund.create","resource":"charges/ch_1","args":{"amount":50.0,"memo":"café"}},
        //   sort_keys=True,separators=(",",":"),ensure_ascii=False).encode()).hexdigest())'
        let h = args_hash(
            "payments",
            "refund.create",
            Some("charges/ch_1"),
            &json!({"amount": 50.0, "memo": "café"}),
        );
        assert_eq!(
            h,
            "6ee09c0c17a5a9515ec4a1cff3e3a50df2bc214bbee269ea49e625bba16b1a79"
        );
    }
}
