//! Server-side re-validation of a published snapshot.
//!
//! The reference runtime stores whatever compiled JSON a client sends (§14.1 item 15). We accept
//! only a snapshot our compiler could have produced:
//!
//! 1. it parses as a compiled agent (known fields only, `apiVersion`/`kind`, the
//!    `phrony.com/policies-compiled` annotation);
//! 2. it passes [`CompiledAgent::validate`]: the authoring rules that still apply to compiled
//!    output, the compiled-only checks of the reference (policy shape, allow-list scopes, pinned
//!    delegations), inline prompt and valid inline schemas, policies that load into
//!    `phrony-policy`;
//! 3. it is byte-for-byte in canonical form: re-serialising the parsed snapshot gives exactly the
//!    bytes that were sent. Anything else (reordered keys, whitespace, a hand edit that left the
//!    form non-canonical) could not have come from the compiler.
//!
//! The content hash is recomputed on the reference canonical form; the client's notion of the
//! hash is never trusted.

use phrony_manifest::{CompiledAgent, Diagnostics, SnapshotError};

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
    /// A compiled agent that fails validation or is not in canonical form: `<path>: <message>`
    /// for one problem, `(N errors):` and one indented line per problem for several.
    #[error("invalid manifest{0}")]
    Invalid(Problems),
}

/// The problems of a refused snapshot, formatted for the gRPC message.
#[derive(Debug)]
pub(crate) struct Problems(Vec<String>);

impl Problems {
    fn one(problem: String) -> Self {
        Self(vec![problem])
    }

    fn of(diags: &Diagnostics) -> Self {
        Self(
            diags
                .errors()
                .map(phrony_manifest::Diagnostic::summary)
                .collect(),
        )
    }
}

impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, ": {one}"),
            many => {
                write!(f, " ({} errors):", many.len())?;
                for problem in many {
                    write!(f, "\n  {problem}")?;
                }
                Ok(())
            }
        }
    }
}

/// Checks a snapshot received by Publish; see the module docs.
pub(crate) fn verify(bytes: &[u8]) -> Result<VerifiedSnapshot, SnapshotRejection> {
    if bytes.is_empty() {
        return Err(SnapshotRejection::Missing);
    }
    let agent = CompiledAgent::from_snapshot_json(bytes).map_err(|e| match e {
        SnapshotError::Json(e) => SnapshotRejection::Parse(e.to_string()),
        SnapshotError::NotCompiled(why) => SnapshotRejection::Invalid(Problems::one(why)),
    })?;
    agent
        .validate()
        .map_err(|diags| SnapshotRejection::Invalid(Problems::of(&diags)))?;

    let canonical = agent.snapshot_json();
    if canonical != bytes {
        return Err(SnapshotRejection::Invalid(Problems::one(
            non_canonical_message(bytes, &canonical),
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
