//! Shared output formatting: timestamps and `--output json` documents.

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

/// Prints one line on stdout.
pub(crate) fn line(text: impl std::fmt::Display) -> anyhow::Result<()> {
    writeln!(io::stdout().lock(), "{text}")?;
    Ok(())
}
