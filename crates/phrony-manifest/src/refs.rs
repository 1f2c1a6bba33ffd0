//! References: CLI agent refs (`namespace/name@version`), delegation refs (`./path.yaml` or
//! `namespace.name@version`) and tool refs with version constraints (`namespace.name@^1.0`).
//!
//! # Tool version constraints
//!
//! The reference runtime turns every constraint into "at least" (so `@<2.0` meant `>= 2.0`, and
//! `@1.0.0` was not a pin; §14.1 item 5). Here constraints mean what semver says, using the
//! `semver` crate's requirement syntax:
//!
//! - a bare version is an exact pin: `@1.0.0` matches only `1.0.0`; a partial bare version pins
//!   the parts given (`@1.2` matches `1.2.x`, `@1` matches `1.x.y`). A leading `v` is allowed.
//! - `^1.2` (compatible), `~1.2` (patch updates), `>=1.2, <2`, `<2.0.0`, `=1.0.0` and `*` mean what
//!   they mean in Cargo.
//!
//! The Tool document's `metadata.version` may be a lenient label (`1.2` is read as `1.2.0`).

use std::fmt;
use std::path::PathBuf;

use crate::model::common::{derive_wire_name, is_lenient_semver, lenient_semver};
use crate::resolve::{RefError, safe_relative};

/// A CLI agent reference: `namespace/name` with an optional `@version`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AgentRef {
    /// Agent namespace.
    pub namespace: String,
    /// Agent name.
    pub name: String,
    /// A semver label or a `sha256:<hex>` bundle lock hash.
    pub version: Option<String>,
}

impl fmt::Display for AgentRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if let Some(v) = &self.version {
            write!(f, "@{v}")?;
        }
        Ok(())
    }
}

/// A malformed [`AgentRef`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("agent ref {input:?} {reason}")]
pub struct AgentRefError {
    input: String,
    reason: &'static str,
}

/// Parses `namespace/name[@version]`, where the version is a semver label (`0.1.0`, `v1`) or a
/// bundle lock hash (`sha256:` and 64 hex digits).
pub fn parse_agent_ref(input: &str) -> Result<AgentRef, AgentRefError> {
    let err = |reason| AgentRefError {
        input: input.to_owned(),
        reason,
    };
    let (path, version) = match input.split_once('@') {
        Some((p, v)) => (p, Some(v)),
        None => (input, None),
    };
    let (namespace, name) = path
        .split_once('/')
        .ok_or_else(|| err("must be namespace/name[@version]"))?;
    // The runtime's rule for agent namespaces and names, and no '@' (the version separator).
    let part_ok = |s: &str| crate::names::check_agent_name(s).is_ok() && !s.contains('@');
    if !part_ok(namespace) || !part_ok(name) {
        return Err(err("must be namespace/name[@version]"));
    }
    if let Some(v) = version {
        let lock_hash = v
            .strip_prefix("sha256:")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
        if !lock_hash && !is_lenient_semver(v) {
            return Err(err(
                "has a version that is neither semver nor a sha256: lock hash",
            ));
        }
    }
    Ok(AgentRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        version: version.map(str::to_owned),
    })
}

/// A delegation target in `spec.agents[i].ref` (§1.18).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DelegationRef {
    /// A bundle-relative YAML file (normalized).
    Local(PathBuf),
    /// A published agent `namespace.name`, pinned or late-bound.
    External {
        namespace: String,
        name: String,
        version: Option<String>,
    },
}

impl DelegationRef {
    /// The default wire name: the file stem, or `namespace.name` sanitized.
    pub(crate) fn default_wire_name(&self) -> String {
        match self {
            Self::Local(p) => derive_wire_name(
                &p.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            Self::External {
                namespace, name, ..
            } => derive_wire_name(&format!("{namespace}.{name}")),
        }
    }
}

/// Why a delegation ref is invalid (messages of §1.11).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DelegationRefError {
    #[error("is required")]
    Empty,
    #[error("ref {0:?} must be a local path (./...) or namespace.name[@version]")]
    Malformed(String),
    #[error("must be bundle-relative")]
    Absolute,
    #[error("must resolve inside bundle root")]
    Escapes,
    #[error("version must be valid semver (for example namespace.name@1.2.0)")]
    BadVersion,
}

/// Parses a delegation ref. Local when it starts with `./` or `../`, contains `/` or `\`, or
/// ends in `.yaml`/`.yml`; otherwise `namespace.name[@version]`.
pub(crate) fn parse_delegation_ref(input: &str) -> Result<DelegationRef, DelegationRefError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DelegationRefError::Empty);
    }
    let local = s.starts_with("./")
        || s.starts_with("../")
        || s.contains(['/', '\\'])
        || s.ends_with(".yaml")
        || s.ends_with(".yml");
    if local {
        return match safe_relative(s) {
            Ok(p) => Ok(DelegationRef::Local(p)),
            Err(RefError::Absolute) => Err(DelegationRefError::Absolute),
            Err(_) => Err(DelegationRefError::Escapes),
        };
    }
    let (id, version) = match s.split_once('@') {
        Some((id, v)) => (id, Some(v)),
        None => (s, None),
    };
    let (namespace, name) = id
        .split_once('.')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !id.chars().any(char::is_whitespace))
        .ok_or_else(|| DelegationRefError::Malformed(input.to_owned()))?;
    if let Some(v) = version
        && !is_lenient_semver(v)
    {
        return Err(DelegationRefError::BadVersion);
    }
    Ok(DelegationRef::External {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        version: version.map(str::to_owned),
    })
}

/// A tool ref `namespace.name` with an optional `@constraint`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolRef<'a> {
    pub(crate) id: &'a str,
    pub(crate) constraint: Option<&'a str>,
}

pub(crate) fn parse_tool_ref(input: &str) -> ToolRef<'_> {
    match input.split_once('@') {
        Some((id, c)) => ToolRef {
            id: id.trim(),
            constraint: Some(c.trim()),
        },
        None => ToolRef {
            id: input.trim(),
            constraint: None,
        },
    }
}

/// Parses a constraint with the semantics in the module docs.
pub(crate) fn parse_constraint(c: &str) -> Result<semver::VersionReq, String> {
    let invalid = || format!("invalid semver constraint {c:?}");
    let c = c.trim();
    if c.is_empty() {
        return Err(invalid());
    }
    let bare = c.strip_prefix('v').unwrap_or(c);
    let text = if bare.starts_with(|ch: char| ch.is_ascii_digit()) {
        format!("={bare}")
    } else {
        c.to_owned()
    };
    semver::VersionReq::parse(&text).map_err(|_| invalid())
}

/// Checks a Tool document's version against a binding's constraint. Messages follow §1.10.
pub(crate) fn check_constraint(tool: &str, version: &str, constraint: &str) -> Result<(), String> {
    let req = parse_constraint(constraint)?;
    if version.trim().is_empty() {
        return Err(format!("tool {tool:?} has no metadata.version"));
    }
    let v = lenient_semver(version)
        .ok_or_else(|| format!("tool {tool:?} metadata.version {version:?} is not valid semver"))?;
    if req.matches(&v) {
        Ok(())
    } else {
        Err(format!(
            "tool {tool:?} version {version:?} does not satisfy constraint {constraint:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraints_mean_what_semver_says() {
        let ok = |v, c| check_constraint("t.x", v, c).is_ok();
        assert!(ok("1.0.0", "1.0.0"));
        assert!(!ok("1.0.1", "1.0.0"), "a bare version is an exact pin");
        assert!(ok("1.2.7", "1.2") && !ok("1.3.0", "1.2"));
        assert!(ok("1.9.0", "v1") && !ok("2.0.0", "1"));
        assert!(ok("1.4.0", "^1.0") && !ok("2.0.0", "^1.0"));
        assert!(ok("1.2.9", "~1.2") && !ok("1.3.0", "~1.2"));
        assert!(
            ok("1.5.0", "<2.0.0") && !ok("2.0.0", "<2.0.0"),
            "< is not >= (§14.1)"
        );
        assert!(ok("1.5.0", ">=1.2, <2") && !ok("1.1.0", ">=1.2, <2"));
        assert!(ok("1.2", "=1.2.0"), "lenient tool versions");
        assert_eq!(
            check_constraint("t.x", "2.0.0", "^1.0").unwrap_err(),
            r#"tool "t.x" version "2.0.0" does not satisfy constraint "^1.0""#
        );
        assert_eq!(
            check_constraint("t.x", "1.0.0", "^^1").unwrap_err(),
            r#"invalid semver constraint "^^1""#
        );
        assert_eq!(
            check_constraint("t.x", "", "1").unwrap_err(),
            r#"tool "t.x" has no metadata.version"#
        );
        assert_eq!(
            check_constraint("t.x", "one", "1").unwrap_err(),
            r#"tool "t.x" metadata.version "one" is not valid semver"#
        );
    }

    #[test]
    fn delegation_refs() {
        assert_eq!(
            parse_delegation_ref("./specialists/payment.yaml"),
            Ok(DelegationRef::Local(PathBuf::from(
                "specialists/payment.yaml"
            )))
        );
        assert_eq!(
            parse_delegation_ref("payment.yaml"),
            Ok(DelegationRef::Local("payment.yaml".into()))
        );
        assert_eq!(
            parse_delegation_ref("/abs/a.yaml"),
            Err(DelegationRefError::Absolute)
        );
        assert_eq!(
            parse_delegation_ref("../a.yaml"),
            Err(DelegationRefError::Escapes)
        );
        assert_eq!(
            parse_delegation_ref("demo.advisor@1.2.0"),
            Ok(DelegationRef::External {
                namespace: "demo".into(),
                name: "advisor".into(),
                version: Some("1.2.0".into())
            })
        );
        assert_eq!(
            parse_delegation_ref("demo.advisor@x"),
            Err(DelegationRefError::BadVersion)
        );
        assert_eq!(
            parse_delegation_ref("advisor").unwrap_err().to_string(),
            r#"ref "advisor" must be a local path (./...) or namespace.name[@version]"#
        );
        assert_eq!(
            parse_delegation_ref("./specialists/payment.yaml")
                .unwrap()
                .default_wire_name(),
            "payment"
        );
    }

    #[test]
    fn cli_agent_refs() {
        let r = parse_agent_ref("support/refund-agent@0.1.0").unwrap();
        assert_eq!(
            (r.namespace.as_str(), r.name.as_str()),
            ("support", "refund-agent")
        );
        assert_eq!(r.to_string(), "support/refund-agent@0.1.0");
        assert_eq!(
            parse_agent_ref("support/refund-agent").unwrap().version,
            None
        );
        let hash = format!("demo/desk@sha256:{}", "a".repeat(64));
        assert!(parse_agent_ref(&hash).is_ok());
        for bad in [
            "support", "/x", "a/b/c", "a/b@", "a/b@nope", "a /b", "a/b\u{7}",
        ] {
            assert!(parse_agent_ref(bad).is_err(), "{bad}");
        }
    }
}
