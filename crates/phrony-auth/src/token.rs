//! API token secrets: their format, generation from caller-supplied randomness, and the hash
//! the token store keeps instead of the secret.
//!
//! A secret is `phr_` followed by 43 characters of unpadded base64url: 32 random bytes. The
//! store keeps only [`hash_secret`] (hex SHA-256 of the whole secret), so a copy of the
//! database does not hold any usable credential. The crate does no IO: the caller draws the
//! 32 bytes from the operating system's generator and hands them to [`TokenSecret::from_random`].

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};

/// Every token secret starts with this (it tells a token from a JWT, and secret scanners can
/// look for it).
pub const TOKEN_PREFIX: &str = "phr_";

/// How many random bytes a secret carries.
pub const TOKEN_RANDOM_BYTES: usize = 32;

/// Characters after [`TOKEN_PREFIX`]: 32 bytes in unpadded base64url.
const ENCODED_LEN: usize = 43;

/// A token secret. Its `Debug` form does not show the secret; [`TokenSecret::expose`] does.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSecret(String);

/// Text that is not a token secret; the message says what is wrong (never the text itself).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a Phrony API token: {reason} (expected phr_ followed by 43 base64url characters)")]
pub struct BadTokenSecret {
    /// What is wrong.
    pub reason: &'static str,
}

impl TokenSecret {
    /// The secret made of `random` (draw it from the operating system's generator).
    #[must_use]
    pub fn from_random(random: [u8; TOKEN_RANDOM_BYTES]) -> Self {
        Self(format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(random)))
    }

    /// Reads a secret as a client sent it.
    ///
    /// # Errors
    /// [`BadTokenSecret`] when `text` lacks the prefix, has the wrong length, or carries a
    /// character outside base64url or a non-canonical final character.
    pub fn parse(text: &str) -> Result<Self, BadTokenSecret> {
        let Some(encoded) = text.strip_prefix(TOKEN_PREFIX) else {
            return Err(BadTokenSecret {
                reason: "it does not start with phr_",
            });
        };
        if encoded.len() != ENCODED_LEN {
            return Err(BadTokenSecret {
                reason: "it has the wrong length",
            });
        }
        if !encoded
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(BadTokenSecret {
                reason: "it contains a character outside base64url",
            });
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(encoded)
            .map_err(|_| BadTokenSecret {
                reason: "it is not canonical base64url",
            })?;
        if bytes.len() != TOKEN_RANDOM_BYTES {
            return Err(BadTokenSecret {
                reason: "it does not encode 32 bytes",
            });
        }
        Ok(Self(text.to_owned()))
    }

    /// The secret itself, to print once or send as a bearer token.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What the token store keeps: [`hash_secret`] of this secret.
    #[must_use]
    pub fn hash(&self) -> String {
        hash_secret(&self.0)
    }
}

impl fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenSecret(phr_…)")
    }
}

/// The hex SHA-256 of `secret` (64 lowercase hex digits): what the token store keeps and looks
/// tokens up by. A secret of 256 random bits needs no salt or slow hash.
#[must_use]
pub fn hash_secret(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn generated_secrets_have_the_documented_shape_and_parse_back() {
        let secret = TokenSecret::from_random([7; 32]);
        assert!(secret.expose().starts_with("phr_"));
        assert_eq!(secret.expose().len(), 4 + 43);
        assert_eq!(TokenSecret::parse(secret.expose()).unwrap(), secret);
        assert_ne!(
            TokenSecret::from_random([8; 32]).expose(),
            secret.expose(),
            "different randomness, different secret"
        );
        assert!(!format!("{secret:?}").contains(&secret.expose()[4..]));
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        let good = TokenSecret::from_random([1; 32]).expose().to_owned();
        let cases: [(String, &str); 5] = [
            ("eyJhbGciOi.x.y".into(), "start with phr_"),
            ("phr_short".into(), "wrong length"),
            (format!("{good}A"), "wrong length"),
            (format!("phr_{}", "+".repeat(43)), "outside base64url"),
            // The last character carries 2 unused bits; a non-zero value is not canonical.
            (format!("{}B", &good[..good.len() - 1]), "canonical"),
        ];
        for (text, reason) in cases {
            let err = TokenSecret::parse(&text).unwrap_err();
            assert!(err.to_string().contains(reason), "{text:?}: {err}");
            assert!(
                !err.to_string().contains(&text),
                "the message never echoes the text"
            );
        }
    }

    #[test]
    fn the_hash_is_hex_sha256_of_the_whole_secret() {
        // sha256("abc")
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let s = TokenSecret::from_random([2; 32]);
        assert_eq!(s.hash(), hash_secret(s.expose()));
        assert_eq!(s.hash().len(), 64);
    }
}
