//! Server-side re-validation of a published snapshot.
//!
//! The reference runtime stores whatever compiled JSON a client sends (§14.1 item 15). We accept
//! only a snapshot our compiler could have produced:
//!
//! 1. it parses as a compiled agent (known fields only, `apiVersion`/`kind`, the
//!    `phrony.com/policies-compiled` annotation);
//! 2. it has the structural invariants of compiled output (identity, a supported model, inline
//!    prompt and schemas, unambiguous tool names);
//! 3. its policies compile with `phrony-policy` (what dispatch will evaluate);
//! 4. it is byte-for-byte in canonical form: re-serialising the parsed snapshot gives exactly the
//!    bytes that were sent. Anything else (reordered keys, whitespace, a hand edit that left the
//!    form non-canonical) could not have come from the compiler.
//!
//! The content hash is recomputed on the reference canonical form; the client's notion of the
//! hash is never trusted.

use phrony_manifest::{CompiledAgent, SnapshotError};

/// A snapshot that passed every check.
#[derive(Debug)]
pub(crate) struct VerifiedSnapshot {
    /// The parsed snapshot.
    pub(crate) agent: CompiledAgent,
    /// The canonical snapshot text to store (identical to what was sent).
    pub(crate) snapshot_json: String,
    /// Hex SHA-256 of the reference canonical form.
    pub(crate) content_hash: String,
}

/// Why a snapshot was refused. The `Display` text is the gRPC message (Appendix A wording).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SnapshotRejection {
    /// `PublishRequest.manifest` is empty.
    #[error("manifest is required")]
    Missing,
    /// Not JSON, or not the shape of a compiled agent.
    #[error("parse manifest: {0}")]
    Parse(String),
    /// A compiled agent that fails validation or is not in canonical form.
    #[error("invalid manifest: {0}")]
    Invalid(String),
}

/// Checks a snapshot received by Publish; see the module docs.
pub(crate) fn verify(bytes: &[u8]) -> Result<VerifiedSnapshot, SnapshotRejection> {
    if bytes.is_empty() {
        return Err(SnapshotRejection::Missing);
    }
    let agent = CompiledAgent::from_snapshot_json(bytes).map_err(|e| match e {
        SnapshotError::Json(e) => SnapshotRejection::Parse(e.to_string()),
        SnapshotError::NotCompiled(why) => SnapshotRejection::Invalid(why),
    })?;
    validate_compiled(&agent)?;
    agent
        .policy_set()
        .map_err(|e| SnapshotRejection::Invalid(format!("policies: {e}")))?;

    let canonical = agent.snapshot_json();
    if canonical != bytes {
        return Err(SnapshotRejection::Invalid(non_canonical_message(
            bytes, &canonical,
        )));
    }
    let snapshot_json = String::from_utf8(canonical).map_err(|e| {
        // Canonical JSON is produced by serde_json from Rust strings, so this cannot happen.
        SnapshotRejection::Parse(format!("snapshot is not UTF-8: {e}"))
    })?;
    let content_hash = agent.content_hash();
    Ok(VerifiedSnapshot {
        agent,
        snapshot_json,
        content_hash,
    })
}

/// Structural invariants every compiled snapshot has, whatever YAML it came from.
///
/// `phrony-manifest` validates authoring documents (with file positions) but has no validation
/// entry point for an already compiled snapshot yet; these are the checks that matter for
/// running one: identity, a supported model, inline prompt and schemas (compilation resolves
/// every `ref`), and unambiguous tool wire names. Policy rules are checked by compiling them
/// with `phrony-policy` (see [`verify`]).
fn validate_compiled(agent: &CompiledAgent) -> Result<(), SnapshotRejection> {
    let mut problems = Vec::new();
    let m = &agent.metadata;
    for (path, value) in [
        ("metadata.namespace", &m.namespace),
        ("metadata.name", &m.name),
    ] {
        if value.trim().is_empty() {
            problems.push(format!("{path}: is required"));
        }
    }
    if !phrony_manifest::is_lenient_semver(&m.version) {
        problems.push(format!(
            "metadata.version: {:?} is not a semantic version",
            m.version
        ));
    }
    let model = &agent.spec.model;
    if !phrony_manifest::PROVIDERS.contains(&model.provider.as_str()) {
        problems.push(format!(
            "spec.model.provider: unsupported provider {:?}; must be one of {}",
            model.provider,
            phrony_manifest::PROVIDERS.join(", ")
        ));
    }
    if model.name.trim().is_empty() {
        problems.push("spec.model.name: is required".to_owned());
    }
    let instructions = &agent.spec.instructions;
    if instructions.text.trim().is_empty() {
        problems.push("spec.instructions.text: is required in a compiled snapshot".to_owned());
    }
    if !instructions.reference.is_empty() || !instructions.version.is_empty() {
        problems.push("spec.instructions: ref/version are resolved by compilation".to_owned());
    }
    let mut wire_names = std::collections::HashSet::new();
    for (i, tool) in agent.spec.tools.iter().enumerate() {
        if tool.reference.trim().is_empty() {
            problems.push(format!("spec.tools[{i}].ref: is required"));
        }
        if !wire_names.insert(tool.wire_name()) {
            problems.push(format!(
                "spec.tools[{i}]: duplicate tool name {:?}",
                tool.wire_name()
            ));
        }
        if let Some(schema) = &tool.input_schema {
            check_inline(
                schema,
                &format!("spec.tools[{i}].input_schema"),
                &mut problems,
            );
        }
    }
    if let Some(schema) = agent.output.as_ref().and_then(|o| o.schema.as_ref()) {
        check_inline(schema, "output.schema", &mut problems);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(SnapshotRejection::Invalid(problems.join("; ")))
    }
}

fn check_inline(schema: &phrony_manifest::Schema, path: &str, problems: &mut Vec<String>) {
    if !schema.reference.is_empty() || !schema.version.is_empty() {
        problems.push(format!("{path}: ref/version are resolved by compilation"));
    } else if schema.inline.is_none() {
        problems.push(format!(
            "{path}: inline schema is required in a compiled snapshot"
        ));
    }
}

/// Says where the received bytes first depart from the canonical form.
fn non_canonical_message(sent: &[u8], canonical: &[u8]) -> String {
    let at = sent
        .iter()
        .zip(canonical)
        .take_while(|(a, b)| a == b)
        .count();
    let context = |bytes: &[u8]| {
        let end = (at + 24).min(bytes.len());
        String::from_utf8_lossy(&bytes[at..end]).into_owned()
    };
    format!(
        "snapshot is not in canonical form, so it was not produced by the phrony compiler \
         (first difference at byte {at}: got {:?}, expected {:?}); publish the compiler's output \
         unchanged",
        context(sent),
        context(canonical),
    )
}
