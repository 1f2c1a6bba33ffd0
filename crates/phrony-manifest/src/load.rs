//! The agent pipeline: read, parse, check forbidden constructs, validate, compile (§1.9 steps
//! 1–6), collecting every diagnostic on the way.

use std::path::Path;

use crate::analysis::Finding;
use crate::compile::compile_agent;
use crate::diag::{Diagnostic, Diagnostics};
use crate::doc::{UnknownKeys, load_source, parse_typed, probe_kind};
use crate::model::agent::AgentDoc;
use crate::model::compiled::CompiledAgent;
use crate::validate::validate_agent;

/// A successfully compiled agent and the warnings found on the way.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The compiled snapshot.
    pub agent: CompiledAgent,
    /// Warnings (unknown keys, tools without a Tool document, policies that never apply, …).
    pub warnings: Vec<Diagnostic>,
    /// The policy analysis' warnings ([`Finding`]): conditions that can never match the tool's
    /// input schema or never hold, policies that never decide, allow lists that allow
    /// everything. Kept apart from `warnings`, which every load prints.
    pub findings: Vec<Finding>,
}

/// Loads, validates and compiles the authoring Agent at `path` (standalone: `spec.agents` is
/// refused, delegation needs a Bundle).
///
/// Every problem of every file involved (the agent, its `tools/` and `policies/` documents,
/// referenced prompts, schemas and the stub script) is reported at once.
pub fn load_agent(path: impl AsRef<Path>) -> Result<Compiled, Diagnostics> {
    load_agent_with(path.as_ref(), false)
}

/// The `kind` of the document at `path` (`Agent`, `Bundle`, `Tool`, `Policy`), when the file
/// reads as bounded YAML and has one; `None` otherwise (the loaders then report what is wrong).
#[must_use]
pub fn document_kind(path: impl AsRef<Path>) -> Option<String> {
    let text = crate::yaml_input::read_yaml_file(path.as_ref()).ok()?;
    #[derive(serde::Deserialize)]
    struct Kind {
        kind: String,
    }
    serde_yaml::from_str::<Kind>(&text).ok().map(|k| k.kind)
}

/// The pipeline; `in_bundle` allows `spec.agents`.
pub(crate) fn load_agent_with(path: &Path, in_bundle: bool) -> Result<Compiled, Diagnostics> {
    let mut out = Vec::new();
    let agent = run(path, in_bundle, &mut out);
    crate::diag::sort_diagnostics(&mut out);
    match agent {
        Some((agent, findings)) if !out.iter().any(Diagnostic::is_error) => Ok(Compiled {
            agent,
            warnings: out,
            findings,
        }),
        _ => {
            if !out.iter().any(Diagnostic::is_error) {
                out.push(Diagnostic::file_error(
                    path,
                    "",
                    "the agent could not be compiled",
                ));
            }
            Err(Diagnostics::new(out))
        }
    }
}

fn run(
    path: &Path,
    in_bundle: bool,
    out: &mut Vec<Diagnostic>,
) -> Option<(CompiledAgent, Vec<Finding>)> {
    let src = load_source(path, out)?;
    match probe_kind(&src).as_deref() {
        Some("Bundle") => {
            src.diags(out).error(
                "kind",
                "bundle manifest: use phrony bundles validate instead",
            );
            return None;
        }
        Some("") => {
            if !crate::doc::is_empty_document(&src) {
                src.diags(out).error("kind", "is required (missing kind)");
                return None;
            }
        }
        Some("Agent") | None => {}
        Some("Tool" | "Policy") => {
            src.diags(out).error("kind", "must be Agent");
            return None;
        }
        Some(other) => {
            src.diags(out)
                .error("kind", format!("unsupported kind {other:?}; must be Agent"));
            return None;
        }
    }
    let doc: AgentDoc = parse_typed(&src, UnknownKeys::Warn, out)?;
    validate_agent(&doc, path, in_bundle, &mut src.diags(out));
    Some(compile_agent(&doc, &src, path, out))
}
