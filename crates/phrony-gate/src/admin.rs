//! The admin side of the gate: the admin key that guards `/v1/admin/*`, and the approver name
//! every admin decision carries into the audit log.
//!
//! Flags mode has no configuration file to hold an admin key, and a well-known default would
//! let anyone on the machine approve escalations. [`generate_admin_key`] makes a random one for
//! each run (the binary prints it once); an operator may choose one instead, checked by
//! [`check_admin_key`].
//!
//! An admin decision (approve or reject an escalation) names the person deciding: an
//! [`ApproverName`] is at most [`MAX_APPROVER_NAME`] characters of printable text, so it can be
//! shown in a terminal or a log without hiding or rewriting what is around it.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::error::ApiError;
use crate::keys::KeyError;

/// The shortest admin key accepted.
pub const MIN_ADMIN_KEY: usize = 8;

/// The longest admin key accepted.
pub const MAX_ADMIN_KEY: usize = 256;

/// The prefix of generated admin keys.
pub const ADMIN_KEY_PREFIX: &str = "rgnt_admin_";

/// The longest approver name, in characters.
pub const MAX_APPROVER_NAME: usize = 128;

/// A fresh random admin key: [`ADMIN_KEY_PREFIX`] and 32 bytes from the system RNG, base64url.
///
/// # Errors
/// [`KeyError::Crypto`] when the system RNG fails.
pub fn generate_admin_key() -> Result<String, KeyError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| KeyError::Crypto(format!("generating an admin key: {e}")))?;
    Ok(format!(
        "{ADMIN_KEY_PREFIX}{}",
        URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// Checks an admin key chosen by an operator: [`MIN_ADMIN_KEY`] to [`MAX_ADMIN_KEY`] visible
/// ASCII characters (it travels in an `Authorization` header).
///
/// # Errors
/// A message naming what is wrong (never the key itself).
pub fn check_admin_key(key: &str) -> Result<(), String> {
    let len = key.chars().count();
    if !(MIN_ADMIN_KEY..=MAX_ADMIN_KEY).contains(&len) {
        return Err(format!(
            "must have {MIN_ADMIN_KEY} to {MAX_ADMIN_KEY} characters, has {len}"
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("must be visible ASCII (no spaces or control characters)".into());
    }
    Ok(())
}

/// The name of the person approving or rejecting an escalation, as recorded in the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApproverName(String);

impl ApproverName {
    /// Parses the `approver` field of an admin decision: trimmed, 1 to [`MAX_APPROVER_NAME`]
    /// characters, none of them a control, line-separator or invisible formatting character
    /// (bidirectional overrides, zero-width characters, soft hyphen).
    ///
    /// # Errors
    /// HTTP 400 naming the field and the problem.
    pub fn parse(value: &str) -> Result<Self, ApiError> {
        let name = value.trim();
        if name.is_empty() {
            return Err(ApiError::bad_request(
                "`approver` must not be empty: name the person deciding",
            ));
        }
        let len = name.chars().count();
        if len > MAX_APPROVER_NAME {
            return Err(ApiError::bad_request(format!(
                "`approver` must have at most {MAX_APPROVER_NAME} characters, has {len}"
            )));
        }
        if let Some(c) = name.chars().find(|c| !printable(*c)) {
            return Err(ApiError::bad_request(format!(
                "`approver` must be printable text; it contains U+{:04X}",
                u32::from(c)
            )));
        }
        Ok(Self(name.to_owned()))
    }

    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ApproverName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `c` shows as itself: not a control character, not a line or paragraph separator,
/// not an invisible formatting character that reorders or hides text.
fn printable(c: char) -> bool {
    !(c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_admin_keys_are_random_and_acceptable() {
        let a = generate_admin_key().unwrap();
        let b = generate_admin_key().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(ADMIN_KEY_PREFIX), "{a}");
        assert_eq!(a.len(), ADMIN_KEY_PREFIX.len() + 43);
        check_admin_key(&a).unwrap();
        assert!(check_admin_key("short").is_err());
        assert!(check_admin_key("has a space").is_err());
        assert!(check_admin_key(&"k".repeat(MAX_ADMIN_KEY + 1)).is_err());
        let err = check_admin_key("tab\tinside-it").unwrap_err();
        assert!(!err.contains("tab"), "the key is not echoed: {err}");
    }

    #[test]
    fn approver_names_are_printable_and_bounded() {
        assert_eq!(
            ApproverName::parse("  Bob Manager <bob@bank>  ")
                .unwrap()
                .as_str(),
            "Bob Manager <bob@bank>"
        );
        assert_eq!(
            ApproverName::parse("Zoë Ødegård").unwrap().as_str(),
            "Zoë Ødegård"
        );
        for bad in [
            "",
            "   ",
            "bob\u{1b}[31m",
            "bob\nroot",
            "bob\u{202e}nimda",
            "a\u{200b}b",
        ] {
            let err = ApproverName::parse(bad).unwrap_err();
            assert_eq!(err.status, 400, "{bad:?}");
            assert!(err.detail.contains("`approver`"), "{}", err.detail);
        }
        let long = "x".repeat(MAX_APPROVER_NAME + 1);
        assert!(
            ApproverName::parse(&long)
                .unwrap_err()
                .detail
                .contains("at most 128")
        );
        assert!(ApproverName::parse(&"x".repeat(MAX_APPROVER_NAME)).is_ok());
    }
}
