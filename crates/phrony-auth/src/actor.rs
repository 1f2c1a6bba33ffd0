//! Actor names: who made a change or cast a vote, as clients name themselves.
//!
//! An actor name reaches the runtime from a request's `actor` field, the `phrony-actor` header,
//! the runtime's default actor and the CLI's `PHRONY_ACTOR`; it is recorded in the event log and
//! printed by every client. [`Actor::parse`] is the one rule all of them apply:
//!
//! - 1 to [`MAX_ACTOR_CHARS`] Unicode characters;
//! - no leading or trailing whitespace;
//! - every character printable: none of Unicode's control (Cc), format (Cf, which includes the
//!   bidirectional overrides and zero-width characters), private-use (Co) or surrogate (Cs)
//!   characters, nor the line and paragraph separators (Zl, Zp) — see [`is_unprintable`];
//! - not a name the runtime records itself ([`RESERVED_ACTORS`]: `system`, `agent`, `policy`,
//!   `worker`) nor one starting with `system:` (such as the approval timer's `system:timeout`),
//!   compared case-insensitively.
//!
//! Two actors that differ only in case are the same person: the ledger counts them as one voter
//! (`phrony_ledger::same_voter`, Unicode lowercase, the comparison used for reserved names here).
//!
//! The rule lives here, in the IO-free auth crate, so that the client (which checks a name before
//! sending it) and the server edge (which checks it again) share one implementation.

use unicode_general_category::{GeneralCategory, get_general_category};

/// The request metadata header naming the actor of a change whose request message has no
/// `actor` field (e.g. `DeprecateAgentVersion`), or leaves it empty. The client always sends
/// it; the server reads it when the request's own `actor` field is empty.
pub const ACTOR_HEADER: &str = "phrony-actor";

/// The longest actor name, in Unicode characters.
pub const MAX_ACTOR_CHARS: usize = 128;

/// Actor names the runtime records for its own events; no client may use them (in any case).
pub const RESERVED_ACTORS: &[&str] = &["system", "agent", "policy", "worker"];

/// The prefix of the runtime's own qualified actors (`system:timeout`); reserved in any case.
pub const RESERVED_ACTOR_PREFIX: &str = "system:";

/// Why an actor name is refused; the message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActorError {
    /// The name is empty.
    #[error("actor must not be empty")]
    Empty,
    /// The name is longer than [`MAX_ACTOR_CHARS`].
    #[error("actor is {chars} characters long; at most {MAX_ACTOR_CHARS} are allowed")]
    TooLong {
        /// The name's length in characters.
        chars: usize,
    },
    /// The name starts or ends with whitespace.
    #[error("actor {actor:?} must not start or end with whitespace")]
    Whitespace {
        /// The refused name.
        actor: String,
    },
    /// The name contains a control, format or separator character.
    #[error(
        "actor {actor:?} contains the unprintable character {code} at character {position}; \
         actor names must be printable text"
    )]
    Unprintable {
        /// The refused name (debug-escaped when shown).
        actor: String,
        /// The character, as `U+XXXX`.
        code: String,
        /// Its position (1-based, in characters).
        position: usize,
    },
    /// The name is one the runtime records itself.
    #[error("actor {actor:?} is reserved for the runtime (reserved: {}, and names starting with {RESERVED_ACTOR_PREFIX:?})", RESERVED_ACTORS.join(", "))]
    Reserved {
        /// The refused name.
        actor: String,
    },
}

/// A validated actor name (see the module docs), spelled as the actor gave it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Actor(String);

impl Actor {
    /// Checks `name` against every rule of the module docs.
    ///
    /// # Errors
    /// The first rule `name` breaks, as an [`ActorError`] naming it.
    pub fn parse(name: &str) -> Result<Self, ActorError> {
        if name.is_empty() {
            return Err(ActorError::Empty);
        }
        let chars = name.chars().count();
        if chars > MAX_ACTOR_CHARS {
            return Err(ActorError::TooLong { chars });
        }
        if let Some((i, c)) = name.chars().enumerate().find(|(_, c)| is_unprintable(*c)) {
            return Err(ActorError::Unprintable {
                actor: name.to_owned(),
                code: format!("U+{:04X}", u32::from(c)),
                position: i + 1,
            });
        }
        if name.trim() != name {
            return Err(ActorError::Whitespace {
                actor: name.to_owned(),
            });
        }
        let key = name.to_lowercase();
        if RESERVED_ACTORS.contains(&key.as_str()) || key.starts_with(RESERVED_ACTOR_PREFIX) {
            return Err(ActorError::Reserved {
                actor: name.to_owned(),
            });
        }
        Ok(Self(name.to_owned()))
    }

    /// The name as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a `String`.
    #[must_use]
    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `c` must never appear raw in an actor name or in text printed to a terminal:
/// a control (Cc, including ESC and the C1 controls), format (Cf: bidirectional overrides and
/// isolates, zero-width characters, the BOM), private-use (Co) or surrogate (Cs) character, or
/// a line or paragraph separator (Zl, Zp).
#[must_use]
pub fn is_unprintable(c: char) -> bool {
    matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::PrivateUse
            | GeneralCategory::Surrogate
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn ordinary_names_are_accepted_as_spelled() {
        for name in [
            "emad",
            "Émad Ç.",
            "ci-bot@example.com",
            "李雷",
            "a",
            "systemd",
        ] {
            assert_eq!(Actor::parse(name).unwrap().as_str(), name);
        }
        assert!(Actor::parse(&"x".repeat(MAX_ACTOR_CHARS)).is_ok());
    }

    #[test]
    fn each_rule_is_named() {
        assert_eq!(Actor::parse(""), Err(ActorError::Empty));
        assert_eq!(
            Actor::parse(&"é".repeat(MAX_ACTOR_CHARS + 1)),
            Err(ActorError::TooLong {
                chars: MAX_ACTOR_CHARS + 1
            })
        );
        assert!(matches!(
            Actor::parse(" emad"),
            Err(ActorError::Whitespace { .. })
        ));
        assert!(matches!(
            Actor::parse("emad\t"),
            Err(ActorError::Unprintable { .. })
        ));
        let forged = Actor::parse("bob\n[event/approval.decided] approved by ciso").unwrap_err();
        assert!(
            forged.to_string().contains("U+000A at character 4"),
            "{forged}"
        );
        for name in [
            "a\u{1b}[31m",
            "a\u{9b}b",
            "a\u{202e}b",
            "a\u{200b}b",
            "a\u{2028}b",
            "a\u{feff}",
            "a\u{e000}",
        ] {
            assert!(
                matches!(Actor::parse(name), Err(ActorError::Unprintable { .. })),
                "{name:?}"
            );
        }
        for name in [
            "system",
            "SYSTEM",
            "system:timeout",
            "System:anything",
            "policy",
            "Agent",
            "worker",
        ] {
            let e = Actor::parse(name).unwrap_err();
            assert!(matches!(e, ActorError::Reserved { .. }), "{name}");
            assert!(e.to_string().contains("reserved for the runtime"), "{e}");
        }
    }
}
