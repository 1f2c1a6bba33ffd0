//! The tool integrity allowlist (`RUNTIME_TOOL_ALLOWLIST`).
//!
//! ```yaml
//! entries:
//!   - agent: demo/payment-agent           # namespace/name of the calling agent
//!     tool: payments.process-payment      # dispatch ref, not the wire name
//!     version: 1.0.0                      # blank → "default"
//!     contract_version: "2"               # optional; must equal the worker's advertised one
//!     workload_identities: [playground/local]
//!     image_digests: [sha256:playground-dev]
//! ```
//!
//! With a non-empty allowlist every worker dispatch is checked when a handler slot is leased:
//! the `(agent, tool, version)` entry must exist, and the worker's workload identity, image
//! digest and (when required) contract version must be listed. Comparisons ignore case; an
//! empty worker value never matches. Identities are self-asserted by workers.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use phrony_manifest::YamlInputError;

use serde::Deserialize;

use crate::types::DEFAULT_VERSION;

/// Which integrity rule a dispatch violated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IntegrityKind {
    /// No entry for the `(agent, tool, version)`.
    Agent,
    /// The worker's workload identity is not listed.
    WorkloadIdentity,
    /// The worker's image digest is not listed.
    ImageDigest,
    /// The worker's contract version differs from the required one.
    ContractVersion,
}

impl IntegrityKind {
    /// The ledger `error_code`: `agent`, `workload_identity`, `image_digest` or
    /// `contract_version`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::WorkloadIdentity => "workload_identity",
            Self::ImageDigest => "image_digest",
            Self::ContractVersion => "contract_version",
        }
    }
}

impl fmt::Display for IntegrityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One integrity violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityViolation {
    /// The rule.
    pub kind: IntegrityKind,
    /// A sentence naming the offending value.
    pub detail: String,
}

/// A tool allowlist file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AllowlistError {
    /// The file could not be read, or is larger than
    /// [`MAX_YAML_BYTES`](phrony_manifest::MAX_YAML_BYTES) (8 MiB), or is not UTF-8.
    #[error("read tool allowlist {}: {error}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        error: YamlInputError,
    },
    /// The YAML is refused before it is parsed: a syntax error, or an alias (aliases are not
    /// supported in any phrony YAML input, see [`phrony_manifest::check_yaml`]).
    #[error("parse tool allowlist: {error}")]
    Refused {
        /// What is wrong, with the line and column.
        error: YamlInputError,
    },
    /// The YAML is malformed or has unknown fields (the message carries the line and column).
    #[error("parse tool allowlist: {error}")]
    Parse {
        /// The YAML error.
        error: serde_yaml::Error,
    },
    /// A required field is missing or empty.
    #[error("tool allowlist entries[{index}]: {field} is required")]
    MissingField {
        /// Entry position.
        index: usize,
        /// The field.
        field: &'static str,
    },
    /// `agent` is not `namespace/name`.
    #[error("tool allowlist entries[{index}]: agent \"{agent}\" must be namespace/name")]
    BadAgent {
        /// Entry position.
        index: usize,
        /// The value.
        agent: String,
    },
    /// Two entries share `(agent, tool, version)`.
    #[error(
        "tool allowlist entries[{index}] duplicates entries[{first}] (agent {agent}, tool {tool}@{version})"
    )]
    Duplicate {
        /// The duplicate's position.
        index: usize,
        /// The first entry's position.
        first: usize,
        /// Agent.
        agent: String,
        /// Tool.
        tool: String,
        /// Version.
        version: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    entries: Vec<RawEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    #[serde(default)]
    agent: String,
    #[serde(default)]
    tool: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    contract_version: String,
    #[serde(default)]
    workload_identities: Vec<String>,
    #[serde(default)]
    image_digests: Vec<String>,
}

#[derive(Debug, Clone)]
struct Entry {
    contract_version: Option<String>,
    workload_identities: Vec<String>,
    image_digests: Vec<String>,
}

/// The worker side of an integrity check.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerClaims<'a> {
    pub(crate) workload_identity: &'a str,
    pub(crate) image_digest: &'a str,
    pub(crate) contract_version: &'a str,
}

/// A loaded tool integrity allowlist.
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    /// Keyed by lower-cased `(agent, tool, version)`.
    entries: HashMap<(String, String, String), Entry>,
}

impl Allowlist {
    /// Reads and parses an allowlist file.
    pub fn load(path: &Path) -> Result<Self, AllowlistError> {
        let text = phrony_manifest::read_text_file(path).map_err(|error| AllowlistError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Self::from_yaml_str(&text)
    }

    /// Parses allowlist YAML (no aliases, at most 8 MiB). An empty document is an empty
    /// allowlist.
    pub fn from_yaml_str(text: &str) -> Result<Self, AllowlistError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        phrony_manifest::check_yaml(text).map_err(|error| AllowlistError::Refused { error })?;
        let raw: RawFile =
            serde_yaml::from_str(text).map_err(|error| AllowlistError::Parse { error })?;
        let mut entries = HashMap::with_capacity(raw.entries.len());
        let mut positions: HashMap<(String, String, String), usize> = HashMap::new();
        for (index, entry) in raw.entries.into_iter().enumerate() {
            let agent = entry.agent.trim();
            let tool = entry.tool.trim();
            if agent.is_empty() {
                return Err(AllowlistError::MissingField {
                    index,
                    field: "agent",
                });
            }
            if tool.is_empty() {
                return Err(AllowlistError::MissingField {
                    index,
                    field: "tool",
                });
            }
            match agent.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {}
                _ => {
                    return Err(AllowlistError::BadAgent {
                        index,
                        agent: agent.to_owned(),
                    });
                }
            }
            let version = match entry.version.trim() {
                "" => DEFAULT_VERSION,
                v => v,
            };
            if entry
                .workload_identities
                .iter()
                .all(|v| v.trim().is_empty())
            {
                return Err(AllowlistError::MissingField {
                    index,
                    field: "workload_identities",
                });
            }
            if entry.image_digests.iter().all(|v| v.trim().is_empty()) {
                return Err(AllowlistError::MissingField {
                    index,
                    field: "image_digests",
                });
            }
            let key = (
                agent.to_lowercase(),
                tool.to_lowercase(),
                version.to_lowercase(),
            );
            if let Some(&first) = positions.get(&key) {
                return Err(AllowlistError::Duplicate {
                    index,
                    first,
                    agent: agent.to_owned(),
                    tool: tool.to_owned(),
                    version: version.to_owned(),
                });
            }
            positions.insert(key.clone(), index);
            let contract = entry.contract_version.trim();
            entries.insert(
                key,
                Entry {
                    contract_version: (!contract.is_empty()).then(|| contract.to_lowercase()),
                    workload_identities: normalise(entry.workload_identities),
                    image_digests: normalise(entry.image_digests),
                },
            );
        }
        Ok(Self { entries })
    }

    /// Whether the allowlist has no entries (then nothing is checked).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The number of entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Checks one dispatch of `agent` (`namespace/name`) to `tool@version` on a worker.
    /// An empty allowlist allows everything.
    pub(crate) fn check(
        &self,
        agent: &str,
        tool: &str,
        version: &str,
        worker: WorkerClaims<'_>,
    ) -> Result<(), IntegrityViolation> {
        if self.entries.is_empty() {
            return Ok(());
        }
        let version = if version.is_empty() {
            DEFAULT_VERSION
        } else {
            version
        };
        let key = (
            agent.to_lowercase(),
            tool.to_lowercase(),
            version.to_lowercase(),
        );
        let Some(entry) = self.entries.get(&key) else {
            return Err(IntegrityViolation {
                kind: IntegrityKind::Agent,
                detail: format!("agent \"{agent}\" is not on the tool allowlist"),
            });
        };
        if !listed(&entry.workload_identities, worker.workload_identity) {
            return Err(IntegrityViolation {
                kind: IntegrityKind::WorkloadIdentity,
                detail: format!(
                    "workload identity \"{}\" is not approved",
                    worker.workload_identity
                ),
            });
        }
        if !listed(&entry.image_digests, worker.image_digest) {
            return Err(IntegrityViolation {
                kind: IntegrityKind::ImageDigest,
                detail: format!("image digest \"{}\" is not approved", worker.image_digest),
            });
        }
        if let Some(required) = &entry.contract_version
            && (worker.contract_version.is_empty()
                || worker.contract_version.to_lowercase() != *required)
        {
            return Err(IntegrityViolation {
                kind: IntegrityKind::ContractVersion,
                detail: format!(
                    "contract version \"{}\" does not match the required \"{required}\"",
                    worker.contract_version
                ),
            });
        }
        Ok(())
    }
}

fn normalise(values: Vec<String>) -> Vec<String> {
    values
        .into_iter()
        .map(|v| v.trim().to_lowercase())
        .filter(|v| !v.is_empty())
        .collect()
}

fn listed(approved: &[String], value: &str) -> bool {
    !value.is_empty() && approved.iter().any(|a| *a == value.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
entries:
  - agent: demo/payment-agent
    tool: payments.process-payment
    version: 1.0.0
    contract_version: "2"
    workload_identities: [playground/local]
    image_digests: [sha256:playground-dev]
  - agent: demo/payment-agent
    tool: orders.lookup
    workload_identities: [playground/local]
    image_digests: [sha256:playground-dev]
"#;

    fn claims<'a>(identity: &'a str, digest: &'a str, contract: &'a str) -> WorkerClaims<'a> {
        WorkerClaims {
            workload_identity: identity,
            image_digest: digest,
            contract_version: contract,
        }
    }

    #[test]
    fn every_rule_is_checked_case_insensitively() {
        let list = Allowlist::from_yaml_str(FILE).unwrap();
        assert_eq!(list.len(), 2);
        let ok = claims("Playground/Local", "SHA256:playground-dev", "2");
        list.check(
            "Demo/Payment-Agent",
            "payments.process-payment",
            "1.0.0",
            ok,
        )
        .unwrap();
        // A blank version is "default".
        list.check("demo/payment-agent", "orders.lookup", "", ok)
            .unwrap();
        list.check("demo/payment-agent", "orders.lookup", "default", ok)
            .unwrap();

        let kind = |agent, version, c| {
            list.check(agent, "payments.process-payment", version, c)
                .unwrap_err()
                .kind
        };
        assert_eq!(kind("demo/other", "1.0.0", ok), IntegrityKind::Agent);
        assert_eq!(
            kind("demo/payment-agent", "1.0.1", ok),
            IntegrityKind::Agent
        );
        let bad_identity = claims("prod/other", "sha256:playground-dev", "2");
        assert_eq!(
            kind("demo/payment-agent", "1.0.0", bad_identity),
            IntegrityKind::WorkloadIdentity
        );
        let no_identity = claims("", "sha256:playground-dev", "2");
        assert_eq!(
            kind("demo/payment-agent", "1.0.0", no_identity),
            IntegrityKind::WorkloadIdentity
        );
        let bad_digest = claims("playground/local", "sha256:evil", "2");
        assert_eq!(
            kind("demo/payment-agent", "1.0.0", bad_digest),
            IntegrityKind::ImageDigest
        );
        let bad_contract = claims("playground/local", "sha256:playground-dev", "3");
        assert_eq!(
            kind("demo/payment-agent", "1.0.0", bad_contract),
            IntegrityKind::ContractVersion
        );
        let no_contract = claims("playground/local", "sha256:playground-dev", "");
        assert_eq!(
            kind("demo/payment-agent", "1.0.0", no_contract),
            IntegrityKind::ContractVersion
        );
        // No contract requirement → any contract version.
        list.check(
            "demo/payment-agent",
            "orders.lookup",
            "default",
            bad_contract,
        )
        .unwrap();

        let err = list
            .check(
                "demo/payment-agent",
                "payments.process-payment",
                "1.0.0",
                bad_digest,
            )
            .unwrap_err();
        assert_eq!(err.detail, "image digest \"sha256:evil\" is not approved");
    }

    #[test]
    fn empty_allowlist_allows_everything() {
        for text in ["", "  \n", "entries: []\n"] {
            let list = Allowlist::from_yaml_str(text).unwrap();
            assert!(list.is_empty());
            list.check("a/b", "t", "v", claims("", "", "")).unwrap();
        }
    }

    #[test]
    fn load_errors_name_the_problem() {
        let err = |text: &str| Allowlist::from_yaml_str(text).unwrap_err().to_string();
        assert_eq!(
            err("entries:\n  - tool: t\n    workload_identities: [a]\n    image_digests: [b]\n"),
            "tool allowlist entries[0]: agent is required"
        );
        assert_eq!(
            err("entries:\n  - agent: a/b\n    workload_identities: [a]\n    image_digests: [b]\n"),
            "tool allowlist entries[0]: tool is required"
        );
        assert_eq!(
            err(
                "entries:\n  - agent: ab\n    tool: t\n    workload_identities: [a]\n    image_digests: [b]\n"
            ),
            "tool allowlist entries[0]: agent \"ab\" must be namespace/name"
        );
        assert_eq!(
            err("entries:\n  - agent: a/b\n    tool: t\n    image_digests: [b]\n"),
            "tool allowlist entries[0]: workload_identities is required"
        );
        assert_eq!(
            err("entries:\n  - agent: a/b\n    tool: t\n    workload_identities: [a]\n"),
            "tool allowlist entries[0]: image_digests is required"
        );
        let dup = "entries:\n  - {agent: a/b, tool: t, workload_identities: [a], image_digests: [b]}\n  - {agent: A/B, tool: T, version: default, workload_identities: [a], image_digests: [b]}\n";
        assert_eq!(
            err(dup),
            "tool allowlist entries[1] duplicates entries[0] (agent A/B, tool T@default)"
        );
        let unknown = err("entries:\n  - agent: a/b\n    tool: t\n    identities: [x]\n");
        assert!(
            unknown.starts_with("parse tool allowlist: entries[0]: unknown field `identities`"),
            "{unknown}"
        );
        assert!(unknown.contains("line 4"), "{unknown}");
        let not_a_list = err("entries: nope\n");
        assert!(
            not_a_list.starts_with("parse tool allowlist: entries: invalid type"),
            "{not_a_list}"
        );
    }

    #[test]
    fn aliases_are_refused_before_they_are_expanded() {
        // A valid allowlist for serde_yaml, which would expand the alias.
        let text = "entries:\n  - agent: a/b\n    tool: t\n    workload_identities: &ids [w]\n    \
                    image_digests: [d]\n  - agent: a/c\n    tool: t\n    \
                    workload_identities: *ids\n    image_digests: [d]\n";
        let err = Allowlist::from_yaml_str(text).unwrap_err().to_string();
        assert_eq!(
            err,
            "parse tool allowlist: line 8 column 26: YAML aliases are not supported (*ids refers \
             to an anchor); write the value out in full"
        );
    }

    #[test]
    fn load_reads_a_file_and_names_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("allowlist.yaml");
        std::fs::write(&path, FILE).unwrap();
        assert_eq!(Allowlist::load(&path).unwrap().len(), 2);
        let missing = dir.path().join("missing.yaml");
        let err = Allowlist::load(&missing).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("read tool allowlist {}: ", missing.display())),
            "{err}"
        );
    }
}
