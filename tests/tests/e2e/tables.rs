//! CLI tables as insta snapshots: what changes from run to run (ids, content hashes,
//! timestamps) is replaced by placeholders; ids and hashes are numbered, so a snapshot still
//! says which cells hold the same id.

use std::collections::HashMap;

use regex::Regex;
use tests::cli::table;

/// `stdout`'s table, one row per line with its cells joined by ` | `: ids and hashes replaced by
/// `[session1]`, `[id1]`, `[hash1]`, … in order of first appearance (the same value gets the same
/// placeholder), timestamps by `[ts]` (two events may or may not fall in the same second).
/// Column alignment is checked apart, by `assert_aligned`.
///
/// # Panics
/// When a built-in pattern does not compile (a bug here).
#[must_use]
pub(crate) fn redacted(stdout: &str) -> String {
    let kinds = [
        // A session id (`run_<uuid>`) before a bare UUID, so it keeps its own name.
        (
            "session",
            r"run_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        ),
        (
            "id",
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        ),
        ("hash", r"(sha256:)?[0-9a-f]{64}"),
        (
            "ts",
            r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?",
        ),
    ];
    let mut seen: HashMap<(&str, String), usize> = HashMap::new();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    let mut out = String::new();
    for row in table(stdout) {
        let mut line = row.join(" | ");
        for (kind, pattern) in kinds {
            let re = Regex::new(pattern).expect("a redaction pattern");
            line = re
                .replace_all(&line, |c: &regex::Captures<'_>| {
                    if kind == "ts" {
                        return "[ts]".to_owned();
                    }
                    let n = *seen.entry((kind, c[0].to_owned())).or_insert_with(|| {
                        let next = counts.entry(kind).or_default();
                        *next += 1;
                        *next
                    });
                    format!("[{kind}{n}]")
                })
                .into_owned();
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[test]
fn the_same_id_gets_the_same_placeholder() {
    let stdout = "ID                                    SESSION_ID                                UPDATED_AT\n\
                  0b9c4a52-2a55-4d3c-9d36-0c1e6f1c9a10  run_6b1f4a52-2a55-4d3c-9d36-0c1e6f1c9a10  2026-12-02T07:01:02.123Z\n\
                  1c9c4a52-2a55-4d3c-9d36-0c1e6f1c9a10  run_6b1f4a52-2a55-4d3c-9d36-0c1e6f1c9a10  2026-12-02T07:01:03Z\n";
    assert_eq!(
        redacted(stdout),
        "ID | SESSION_ID | UPDATED_AT\n\
         [id1] | [session1] | [ts]\n\
         [id2] | [session1] | [ts]\n"
    );
}
