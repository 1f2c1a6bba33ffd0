//! Shared helpers for the workspace-level tests.
//!
//! The tests themselves live in `tests/*.rs`: `schema.rs` keeps the authoring JSON Schema in sync
//! with every example, `examples.rs` checks each example's `cases.yaml` against the real policy
//! engine, `lifecycle.rs` drives the real daemon with the real CLI, `sessions.rs` and `tui.rs`
//! drive sessions and approvals through it.
//!
//! - [`daemon`] starts the real `phrony-runtime` on a free port (SQLite or a fresh PostgreSQL
//!   database) for end-to-end tests.
//! - [`cli`] runs the real `phrony` CLI against it and reads what it printed.
//! - [`stub`] writes the tutorial's refund agent on the scripted `stub` model and deploys it.
//! - [`worker`] serves the refund agent's tool on the `Work` stream and records its calls.
//! - [`proxy`] stands between the CLI and the runtime and loses the connection on cue.
//! - [`soak`] is the crash soak (binary `soak`): SIGKILLs the daemon and the worker at commit
//!   points and checks that nothing ran twice and nothing was lost.
//!
//! The generic helpers (worker, proxy, the stub agent's files, throw-away PostgreSQL databases)
//! live in `phrony-test-support`, shared with the other crates' tests; they are re-exported here.

#![allow(
    clippy::disallowed_methods,
    reason = "test support: it finds cargo through the environment cargo sets"
)]

pub mod cli;
pub mod daemon;
pub mod soak;
pub mod stub;

pub use phrony_test_support::{examples_dir, proxy, worker, workspace_root};

use std::path::{Path, PathBuf};

/// The example directories (those holding an `agent.yaml`), sorted by name.
///
/// # Panics
/// When `policies-examples/` cannot be read: the tests cannot run without it.
#[must_use]
pub fn example_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .unwrap_or_else(|err| panic!("read {}: {err}", examples_dir().display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.join("agent.yaml").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// Every file under `dir` (recursively) whose extension is `.yaml` or `.yml`, sorted.
#[must_use]
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&current) else {
            continue;
        };
        for path in entries.filter_map(|entry| entry.ok().map(|e| e.path())) {
            if path.is_dir() {
                pending.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Parses a YAML file into JSON, the data model JSON Schema validates.
///
/// # Errors
/// When the file cannot be read or is not YAML.
pub fn yaml_to_json(path: &Path) -> Result<serde_json::Value, String> {
    let text =
        std::fs::read_to_string(path).map_err(|err| format!("read {}: {err}", path.display()))?;
    serde_yaml::from_str(&text).map_err(|err| format!("parse {}: {err}", path.display()))
}

/// Parses YAML text into JSON, applying `<<` merge keys (nested merges included), which
/// `serde_yaml` leaves as plain keys.
///
/// # Errors
/// When the text is not YAML, or a merge key's value is not a mapping or a list of mappings.
pub fn yaml_with_merges(text: &str) -> Result<serde_json::Value, String> {
    let mut value: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    resolve_merges(&mut value)?;
    serde_yaml::from_value(value).map_err(|e| e.to_string())
}

fn resolve_merges(value: &mut serde_yaml::Value) -> Result<(), String> {
    use serde_yaml::Value;
    match value {
        Value::Mapping(map) => {
            // The merged mappings first, so that merges of merges are resolved.
            for child in map.values_mut() {
                resolve_merges(child)?;
            }
            let sources = match map.remove("<<") {
                None => return Ok(()),
                Some(Value::Mapping(source)) => vec![source],
                Some(Value::Sequence(items)) => items
                    .into_iter()
                    .map(|item| match item {
                        Value::Mapping(source) => Ok(source),
                        _ => Err("a `<<` list must hold mappings".to_owned()),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err("`<<` must be a mapping or a list of mappings".to_owned()),
            };
            for source in sources {
                for (key, child) in source {
                    map.entry(key).or_insert(child);
                }
            }
            Ok(())
        }
        Value::Sequence(items) => items.iter_mut().try_for_each(resolve_merges),
        Value::Tagged(tagged) => resolve_merges(&mut tagged.value),
        _ => Ok(()),
    }
}
