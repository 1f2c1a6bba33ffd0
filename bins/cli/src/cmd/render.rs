//! Shared output formatting: timestamps, `--output json` documents, and [`escape`], which every
//! runtime-supplied text goes through before it reaches a terminal line.

use std::borrow::Cow;
use std::io::{self, Write as _};

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

/// RFC 3339, UTC, whole seconds: `2025-01-31T09:30:00Z`.
pub(crate) fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// [`time`] for JSON: `null` when unset.
pub(crate) fn json_time(t: Option<DateTime<Utc>>) -> Value {
    t.map_or(Value::Null, |t| Value::String(time(t)))
}

/// What kind of JSON value `value` is, for error messages: `null`, `a boolean`, `an array`…
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Text from the runtime (names, reasons, comments, summaries, model output) made safe to print
/// on one line: every unprintable character ([`phrony_client::is_unprintable`]: controls such as
/// newline and ESC, bidirectional overrides, zero-width and separator characters) is shown as
/// an escape (`\n`, `\r`, `\t`, `\u{1b}`, `\u{202e}`), so no value can start a line of its own,
/// forge a record or send an escape sequence to the terminal. Printable text is unchanged.
pub(crate) fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(phrony_client::is_unprintable) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if phrony_client::is_unprintable(c) => {
                out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Writes `text` as one line, [`escape`]d.
pub(crate) fn write_line(out: &mut impl io::Write, text: &str) -> io::Result<()> {
    writeln!(out, "{}", escape(text))
}

/// Prints one JSON document (two-space indent) on stdout.
pub(crate) fn json(value: &Value) -> anyhow::Result<()> {
    let mut stdout = io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, value)?;
    writeln!(stdout)?;
    Ok(())
}

/// After one page of a listing: when more `what` match, says on stderr how to get them.
pub(crate) fn next_page_hint(what: &str, token: Option<&str>) -> io::Result<()> {
    match token {
        Some(token) => writeln!(
            io::stderr().lock(),
            "more {what} match: add --page-token {token}"
        ),
        None => Ok(()),
    }
}

/// Prints one line on stdout, [`escape`]d.
pub(crate) fn line(text: impl std::fmt::Display) -> anyhow::Result<()> {
    write_line(&mut io::stdout().lock(), &text.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unprintable_characters_are_shown_as_escapes() {
        assert_eq!(
            escape("bob\n2025-01-31T09:30:00Z [event/approval.decided] approved by ciso"),
            "bob\\n2025-01-31T09:30:00Z [event/approval.decided] approved by ciso"
        );
        assert_eq!(
            escape("\u{1b}[31mred\u{1b}]0;title\u{7}\r\t"),
            "\\u{1b}[31mred\\u{1b}]0;title\\u{7}\\r\\t"
        );
        assert_eq!(
            escape("a\u{202e}b\u{2028}c\u{9b}d\u{200b}"),
            "a\\u{202e}b\\u{2028}c\\u{9b}d\\u{200b}"
        );
        assert!(matches!(escape("€400 — ünïcode ✓ C:\\x"), Cow::Borrowed(_)));
    }
}
