//! Loading manifests for the commands, and reporting their diagnostics the same way everywhere.
//!
//! Every diagnostic goes to stderr as `file:line:col: error|warning: path: message`. When a
//! manifest is rejected, the returned error is the summary line `main` prints last: the problem
//! itself when there is one (`Error: metadata.version: must be valid semver`), else
//! `Error: invalid manifest (N errors)`.

use std::io::{self, Write as _};
use std::path::Path;

use anyhow::anyhow;
use phrony_manifest::{CompiledAgent, Diagnostic, Diagnostics, SecretRequirement};
use phrony_policy::PolicySet;

/// Loads, validates and compiles the agent at `path`, printing its warnings.
pub(crate) fn load_agent(path: &Path) -> anyhow::Result<CompiledAgent> {
    load_compiled(path).map(|compiled| compiled.agent)
}

/// [`load_agent`], keeping the load warnings (already printed) and the policy analysis'
/// findings (not printed).
pub(crate) fn load_compiled(path: &Path) -> anyhow::Result<phrony_manifest::Compiled> {
    match phrony_manifest::load_agent(path) {
        Ok(compiled) => {
            print_diagnostics(&compiled.warnings)?;
            Ok(compiled)
        }
        Err(diags) => Err(rejected(&diags, "manifest")),
    }
}

/// The agent `phrony policies check` decides for: the agent manifest at `path`, or, when `path`
/// is a Bundle, its member named `member` (default: the root), compiled as the bundle compiles
/// it (delegations allowed).
pub(crate) fn load_checked_agent(
    path: &Path,
    member: Option<&str>,
) -> anyhow::Result<CompiledAgent> {
    if phrony_manifest::document_kind(path).as_deref() != Some("Bundle") {
        if let Some(m) = member {
            anyhow::bail!(
                "--member {m:?}: {} is not a Bundle; --member picks a member of a bundle",
                path.display()
            );
        }
        return load_agent(path);
    }
    let validated = phrony_manifest::validate_bundle(path, false)
        .map_err(|diags| rejected(&diags, "bundle"))?;
    print_diagnostics(&validated.bundle.warnings)?;
    let mut members = validated.bundle.members.into_iter();
    let names: Vec<String> = members.clone().map(|m| m.child_name).collect();
    let found = match member {
        None => members.next(),
        Some(m) => members.find(|b| b.child_name == m),
    };
    match found.and_then(|m| m.vendored) {
        Some((_, agent)) => Ok(agent),
        None => anyhow::bail!(
            "bundle {} has no local member {:?} (members: {})",
            path.display(),
            member.unwrap_or("root"),
            names.join(", ")
        ),
    }
}

/// The policy engine of a compiled agent.
pub(crate) fn policy_set(agent: &CompiledAgent, path: &Path) -> anyhow::Result<PolicySet> {
    agent.policy_set().map_err(|errors| {
        // The manifest compiler validates every policy; reaching this is a bug, not bad input.
        anyhow!(
            "internal error: the compiled policies of {} do not load: {errors}",
            path.display()
        )
    })
}

/// Prints every diagnostic on stderr, one per line.
pub(crate) fn print_diagnostics(diags: &[Diagnostic]) -> io::Result<()> {
    let mut stderr = io::stderr().lock();
    for diag in diags {
        writeln!(stderr, "{diag}")?;
    }
    Ok(())
}

/// Prints the policy analysis' findings on stderr, one `file:line:col: warning: …` each (with
/// the example call on the next line when there is one).
pub(crate) fn print_findings(findings: &[phrony_manifest::Finding]) -> io::Result<()> {
    let mut stderr = io::stderr().lock();
    for f in findings {
        writeln!(stderr, "{f}")?;
    }
    Ok(())
}

/// Prints the diagnostics of a rejected `what` (manifest, bundle) and returns the summary error.
pub(crate) fn rejected(diags: &Diagnostics, what: &str) -> anyhow::Error {
    if let Err(err) = print_diagnostics(diags.as_slice()) {
        return err.into();
    }
    let errors: Vec<&Diagnostic> = diags.errors().collect();
    match errors.as_slice() {
        [only] => anyhow!("{}", only.summary()),
        _ => anyhow!("invalid {what} ({} errors)", errors.len()),
    }
}

/// Warns on stderr about every secret whose variable is unset in this environment.
pub(crate) fn warn_unset_secrets<'a>(
    secrets: impl IntoIterator<Item = &'a SecretRequirement>,
) -> io::Result<()> {
    let mut stderr = io::stderr().lock();
    for secret in secrets {
        if secret.is_missing_from_env(|name| std::env::var_os(name)) {
            writeln!(stderr, "warning: {}", secret.unset_message())?;
        }
    }
    Ok(())
}
