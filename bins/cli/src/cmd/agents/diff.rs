//! `phrony agents diff MANIFEST NS/NAME@VERSION`: what publishing the local manifest would change.
//!
//! Both sides are compiled snapshots, pretty-printed canonically (sorted keys, two-space
//! indent), and compared line by line: a unified diff with three lines of context, the published
//! version as the "from" side. Colour only on a terminal and without `NO_COLOR`. Exit 0 whether
//! or not they differ.

use std::io::{self, IsTerminal as _, Write};
use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::{Map, Value, json};
use similar::{ChangeTag, TextDiff};

use crate::cmd::{Global, Output, agent_ref, manifest, remote, render};

/// Lines of unchanged context around each change.
const CONTEXT_LINES: usize = 3;

/// Arguments of `phrony agents diff`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Local agent manifest (agent.yaml).
    manifest: PathBuf,
    /// The published version to compare with: namespace/name@version.
    agent: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints the unified diff, or `No differences. local manifest matches ns/name@v`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let (agent, version) = agent_ref::versioned(&args.agent)?;
    let local = manifest::load_agent(&args.manifest)?;
    let local_text = canonical_text(&local.snapshot_json())
        .context("internal error: the local snapshot is not JSON")?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let published = client
            .get_agent_version(&agent, &version)
            .await
            .map_err(remote::fails("diff"))?;
        let published_text = canonical_text(published.manifest_json.as_bytes())
            .context("the runtime returned a stored manifest that is not JSON")?;
        let target = format!("{agent}@{version}");
        let from = format!("{target} (published)");
        let to = format!("{} (local)", args.manifest.display());
        let diff = TextDiff::from_lines(&published_text, &local_text);
        let identical = diff
            .ops()
            .iter()
            .all(|op| op.tag() == similar::DiffTag::Equal);
        match args.output {
            Output::Json => render::json(&json!({
                "agent": target,
                "manifest": args.manifest.display().to_string(),
                "identical": identical,
                "diff": diff
                    .unified_diff()
                    .context_radius(CONTEXT_LINES)
                    .header(&from, &to)
                    .to_string(),
            })),
            Output::Text if identical => render::line(format_args!(
                "No differences. local manifest matches {target}"
            )),
            Output::Text => {
                let color = io::stdout().is_terminal()
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
                write_unified(&mut io::stdout().lock(), &diff, &from, &to, color)?;
                Ok(())
            }
        }
    })
}

/// A JSON document pretty-printed with sorted keys and a two-space indent, ending in a newline.
fn canonical_text(json: &[u8]) -> serde_json::Result<String> {
    let value: Value = serde_json::from_slice(json)?;
    let mut text = serde_json::to_string_pretty(&sorted(value))?;
    text.push('\n');
    Ok(text)
}

/// `value` with every object's keys in sorted order (whatever map type serde_json is built with).
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sorted(v)))
                    .collect::<Map<_, _>>(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const CYAN: &str = "\x1b[36m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

/// Writes the unified diff, colouring headers, hunk ranges, removals and additions if asked.
fn write_unified(
    out: &mut impl Write,
    diff: &TextDiff<'_, '_, str>,
    from: &str,
    to: &str,
    color: bool,
) -> io::Result<()> {
    let paint = |code: &'static str| if color { code } else { "" };
    let reset = paint(RESET);
    writeln!(out, "{}--- {from}{reset}", paint(BOLD))?;
    writeln!(out, "{}+++ {to}{reset}", paint(BOLD))?;
    let mut unified = diff.unified_diff();
    unified.context_radius(CONTEXT_LINES);
    for hunk in unified.iter_hunks() {
        writeln!(out, "{}{}{reset}", paint(CYAN), hunk.header())?;
        for change in hunk.iter_changes() {
            let (sign, code) = match change.tag() {
                ChangeTag::Delete => ('-', paint(RED)),
                ChangeTag::Insert => ('+', paint(GREEN)),
                ChangeTag::Equal => (' ', ""),
            };
            let text = change.value().trim_end_matches('\n');
            let end = if code.is_empty() { "" } else { reset };
            writeln!(out, "{code}{sign}{text}{end}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn canonical_text_sorts_keys_and_indents_two_spaces() {
        let text = canonical_text(br#"{"b":1,"a":{"d":[1,{"z":0,"y":0}],"c":null}}"#).unwrap();
        assert_eq!(
            text,
            "{\n  \"a\": {\n    \"c\": null,\n    \"d\": [\n      1,\n      {\n        \"y\": 0,\n        \"z\": 0\n      }\n    ]\n  },\n  \"b\": 1\n}\n"
        );
    }

    #[test]
    fn unified_diff_has_three_lines_of_context_and_colour_only_when_asked() {
        let old: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        let new = old.replace("line 5\n", "line five\n");
        let diff = TextDiff::from_lines(&old, &new);
        let mut plain = Vec::new();
        write_unified(&mut plain, &diff, "a", "b", false).unwrap();
        assert_eq!(
            String::from_utf8(plain).unwrap(),
            "--- a\n+++ b\n@@ -2,7 +2,7 @@\n line 2\n line 3\n line 4\n-line 5\n+line five\n line 6\n line 7\n line 8\n"
        );
        let mut colored = Vec::new();
        write_unified(&mut colored, &diff, "a", "b", true).unwrap();
        let colored = String::from_utf8(colored).unwrap();
        assert!(colored.contains("\x1b[31m-line 5\x1b[0m"), "{colored:?}");
        assert!(colored.contains("\x1b[32m+line five\x1b[0m"), "{colored:?}");
    }
}
