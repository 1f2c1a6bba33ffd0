//! `phrony agents diff MANIFEST NS/NAME@VERSION`: what publishing the local manifest would change.
//!
//! Both sides are compiled snapshots, pretty-printed canonically (sorted keys, two-space
//! indent), and compared line by line: a unified diff with three lines of context, the published
//! version as the "from" side. Colour only on a terminal and without `NO_COLOR`. Exit 0 whether
//! or not they differ.

use std::io::{self, IsTerminal as _, Write};
use std::path::PathBuf;

use anyhow::Context as _;
use phrony_manifest::{CompiledAgent, DeclaredEndpoint};
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
        let published_agent = CompiledAgent::from_snapshot_json(published.manifest_json.as_bytes())
            .context("the runtime returned a stored manifest that is not an agent snapshot")?;
        let endpoint_changes = new_secret_destinations(&published_agent, &local);
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
                "secret_endpoint_changes": endpoint_changes
                    .iter()
                    .map(|c| json!({
                        "secret": c.secret,
                        "from_env": c.from_env,
                        "endpoint": c.endpoint.to_string(),
                        "published_endpoints": c.published.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    }))
                    .collect::<Vec<_>>(),
            })),
            Output::Text if identical => render::line(format_args!(
                "No differences. local manifest matches {target}"
            )),
            Output::Text => {
                let color = io::stdout().is_terminal()
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
                let mut out = io::stdout().lock();
                write_unified(&mut out, &diff, &from, &to, color)?;
                for change in &endpoint_changes {
                    writeln!(out, "{}", render::escape(&change.to_string()))?;
                }
                Ok(())
            }
        }
    })
}

/// A secret the local version sends somewhere the published one does not send it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DestinationChange {
    secret: String,
    from_env: String,
    endpoint: DeclaredEndpoint,
    /// Where the published version sends the same variable (empty: nowhere).
    published: Vec<DeclaredEndpoint>,
}

impl std::fmt::Display for DestinationChange {
    /// `secret "openai" (OPENAI_API_KEY) would be sent to B (published version: A)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "secret {:?} ({}) would be sent to {} (published version: ",
            self.secret, self.from_env, self.endpoint
        )?;
        if self.published.is_empty() {
            write!(f, "does not send {})", self.from_env)
        } else {
            let shown: Vec<String> = self.published.iter().map(ToString::to_string).collect();
            write!(f, "{})", shown.join(", "))
        }
    }
}

/// The destinations of `local` that `published` does not have for the same `fromEnv` variable,
/// in their declared form: a provider's runtime default endpoint is the same on both sides
/// (it is the daemon's configuration), so only real differences are listed.
fn new_secret_destinations(
    published: &CompiledAgent,
    local: &CompiledAgent,
) -> Vec<DestinationChange> {
    let before = published.secret_destinations();
    local
        .secret_destinations()
        .into_iter()
        .filter(|d| {
            !before
                .iter()
                .any(|b| b.from_env == d.from_env && b.endpoint == d.endpoint)
        })
        .map(|d| DestinationChange {
            published: before
                .iter()
                .filter(|b| b.from_env == d.from_env)
                .map(|b| b.endpoint.clone())
                .collect(),
            secret: d.secret,
            from_env: d.from_env,
            endpoint: d.endpoint,
        })
        .collect()
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

    fn agent(provider: &str, base_url: &str) -> CompiledAgent {
        serde_json::from_value(json!({
            "apiVersion": "phrony.com/v1",
            "kind": "Agent",
            "metadata": {"name": "a", "namespace": "n", "version": "1.0.0"},
            "secrets": {"openai": {"fromEnv": "OPENAI_API_KEY"}},
            "spec": {
                "purpose": "p",
                "instructions": {"text": "t"},
                "model": {"provider": provider, "name": "m", "base_url": base_url, "secret": "openai"}
            }
        }))
        .unwrap()
    }

    #[test]
    fn only_a_real_change_of_destination_is_summarised() {
        let openai = agent("openai", "");
        let a = agent("openai-compatible", "http://a.example/v1");
        let b = agent("openai-compatible", "http://b.example/v1/");
        assert!(new_secret_destinations(&openai, &openai).is_empty());
        assert!(
            new_secret_destinations(&a, &agent("openai-compatible", "http://a.example/v1/"))
                .is_empty()
        );
        let shown = |p: &CompiledAgent, l: &CompiledAgent| {
            new_secret_destinations(p, l)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            shown(&a, &b),
            [
                "secret \"openai\" (OPENAI_API_KEY) would be sent to http://b.example/v1 (published version: http://a.example/v1)"
            ]
        );
        assert_eq!(
            shown(&openai, &a),
            [
                "secret \"openai\" (OPENAI_API_KEY) would be sent to http://a.example/v1 (published version: provider openai (runtime default endpoint))"
            ]
        );
        // Going back to the runtime's endpoint is a change of destination too.
        assert_eq!(shown(&a, &openai).len(), 1);
        let mut undeclared = b.clone();
        undeclared.secrets.clear();
        assert!(
            new_secret_destinations(&a, &undeclared).is_empty(),
            "nothing is sent"
        );
    }

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
