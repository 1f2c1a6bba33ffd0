//! The runtime's rule for agent namespaces and names, in one place.
//!
//! An agent's `namespace/name` keys its versions, deployments and audit stream
//! (`agent:<namespace>/<name>`) on the runtime, so each part must be non-empty and free of `/`,
//! whitespace and control characters. The ledger refuses anything else
//! (`phrony_ledger::AgentRef::validate` calls [`check_agent_name`]), and the manifest validator
//! applies the same function to `metadata.namespace` and `metadata.name` of agents, bundles and
//! compiled snapshots, so `agents validate` refuses what `publish` would.

use std::fmt;

/// Why a namespace or name cannot identify an agent on the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AgentNameError {
    /// The part is empty.
    #[error("is required")]
    Empty,
    /// The part contains a character the runtime refuses.
    #[error("must not contain {kind} ({} at byte {at})", CharName(*.ch))]
    Forbidden {
        /// What kind of character it is.
        kind: ForbiddenChar,
        /// The first offending character.
        ch: char,
        /// Its byte offset in the part.
        at: usize,
    },
}

/// The kinds of characters refused in agent namespaces and names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForbiddenChar {
    /// `/`, the namespace/name separator.
    Slash,
    /// A whitespace character (space, tab, newline, and Unicode whitespace).
    Whitespace,
    /// A control character (C0, DEL, C1).
    Control,
}

impl fmt::Display for ForbiddenChar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Slash => "'/'",
            Self::Whitespace => "whitespace",
            Self::Control => "control characters",
        })
    }
}

/// A character as messages show it: printable ones quoted, the others as `U+XXXX`.
struct CharName(char);

impl fmt::Display for CharName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        if c.is_control() || c.is_whitespace() {
            write!(f, "U+{:04X}", u32::from(c))
        } else {
            write!(f, "{c:?}")
        }
    }
}

/// Checks one part (namespace or name) of an agent's identity: non-empty, no `/`, no
/// whitespace, no control characters. Reports the first offending character.
///
/// # Errors
/// [`AgentNameError`] saying what is wrong and where.
pub fn check_agent_name(part: &str) -> Result<(), AgentNameError> {
    if part.is_empty() {
        return Err(AgentNameError::Empty);
    }
    for (at, ch) in part.char_indices() {
        // Control first: `\t` and `\n` are both, and "control character" says more.
        let kind = if ch.is_control() {
            ForbiddenChar::Control
        } else if ch.is_whitespace() {
            ForbiddenChar::Whitespace
        } else if ch == '/' {
            ForbiddenChar::Slash
        } else {
            continue;
        };
        return Err(AgentNameError::Forbidden { kind, ch, at });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bad_character_is_named() {
        assert_eq!(check_agent_name("refund-agent"), Ok(()));
        assert_eq!(check_agent_name("support.eu_1"), Ok(()));
        assert_eq!(check_agent_name("é-agent"), Ok(()));
        assert_eq!(check_agent_name(""), Err(AgentNameError::Empty));
        let msg = |s: &str| check_agent_name(s).unwrap_err().to_string();
        assert_eq!(
            msg("refund\u{7}agent"),
            "must not contain control characters (U+0007 at byte 6)"
        );
        assert_eq!(
            msg("a\u{1b}[31m"),
            "must not contain control characters (U+001B at byte 1)"
        );
        assert_eq!(
            msg("a\u{7f}"),
            "must not contain control characters (U+007F at byte 1)"
        );
        assert_eq!(
            msg("a\u{85}"),
            "must not contain control characters (U+0085 at byte 1)"
        );
        assert_eq!(
            msg("a\tb"),
            "must not contain control characters (U+0009 at byte 1)"
        );
        assert_eq!(
            msg("refund agent"),
            "must not contain whitespace (U+0020 at byte 6)"
        );
        assert_eq!(
            msg("a\u{a0}b"),
            "must not contain whitespace (U+00A0 at byte 1)"
        );
        assert_eq!(msg("a/b"), "must not contain '/' ('/' at byte 1)");
    }
}
