//! Agent references on the command line: `namespace/name[@version]`, with the reference CLI's
//! error messages.

use std::fmt;

use anyhow::bail;
use phrony_client::AgentName;

/// A parsed `namespace/name[@version]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentArg {
    /// The agent.
    pub(crate) agent: AgentName,
    /// The version after `@`, when given.
    pub(crate) version: Option<String>,
}

impl fmt::Display for AgentArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.agent)?;
        if let Some(version) = &self.version {
            write!(f, "@{version}")?;
        }
        Ok(())
    }
}

/// `namespace/name@version`, the version required.
pub(crate) fn versioned(input: &str) -> anyhow::Result<(AgentName, String)> {
    let parsed = parse(input)?;
    match parsed.version {
        Some(version) => Ok((parsed.agent, version)),
        None => bail!("agent reference must include @version, got {input:?}"),
    }
}

/// `namespace/name`, for commands about the agent as a whole.
pub(crate) fn unversioned(input: &str, hint: &str) -> anyhow::Result<AgentName> {
    let parsed = parse(input)?;
    if parsed.version.is_some() {
        bail!("agent reference must not include @version here, got {input:?}{hint}");
    }
    Ok(parsed.agent)
}

/// `namespace/name[@version]`.
pub(crate) fn parse(input: &str) -> anyhow::Result<AgentArg> {
    let (path, version) = match input.split_once('@') {
        Some((path, version)) => (path, Some(version)),
        None => (input, None),
    };
    if version.is_some_and(str::is_empty) {
        bail!("agent version must not be empty after @ in {input:?}");
    }
    // The runtime's rule (no '/', whitespace or control characters), not an approximation.
    let part_ok = |s: &str| phrony_manifest::check_agent_name(s).is_ok();
    let Some((namespace, name)) = path
        .split_once('/')
        .filter(|(ns, n)| part_ok(ns) && part_ok(n))
    else {
        bail!("agent must be namespace/name, got {input:?}");
    };
    if let Some(v) = version
        && (v.contains('@') || v.chars().any(char::is_whitespace))
    {
        bail!("agent version {v:?} is not a version label, in {input:?}");
    }
    Ok(AgentArg {
        agent: AgentName::new(namespace, name),
        version: version.map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    fn error(result: anyhow::Result<impl fmt::Debug>) -> String {
        format!("{:#}", result.unwrap_err())
    }

    #[test]
    fn parses_namespace_name_and_version() {
        let parsed = parse("support/refund-agent@0.1.0").unwrap();
        assert_eq!(parsed.agent, AgentName::new("support", "refund-agent"));
        assert_eq!(parsed.version.as_deref(), Some("0.1.0"));
        assert_eq!(parsed.to_string(), "support/refund-agent@0.1.0");
        assert_eq!(parse("a/b").unwrap().version, None);
        // A bundle version may be its lock hash.
        let (bundle, version) = versioned("support/refund-desk@sha256:0a1b").unwrap();
        assert_eq!(bundle, AgentName::new("support", "refund-desk"));
        assert_eq!(version, "sha256:0a1b");
    }

    #[test]
    fn errors_read_like_the_reference_cli() {
        assert_eq!(
            error(parse("x")),
            r#"agent must be namespace/name, got "x""#
        );
        for bad in [
            "/x",
            "x/",
            "a/b/c",
            "a b/c",
            "@1.0.0",
            "a\u{7}/b",
            "a/\u{1b}[2J",
        ] {
            assert_eq!(
                error(parse(bad)),
                format!("agent must be namespace/name, got {bad:?}")
            );
        }
        assert_eq!(
            error(parse("a/b@")),
            r#"agent version must not be empty after @ in "a/b@""#
        );
        assert_eq!(
            error(versioned("a/b")),
            r#"agent reference must include @version, got "a/b""#
        );
        assert_eq!(
            error(unversioned("a/b@1.0.0", "; use --to VERSION")),
            r#"agent reference must not include @version here, got "a/b@1.0.0"; use --to VERSION"#
        );
        assert!(error(parse("a/b@1@2")).contains("is not a version label"));
    }
}
