//! Sealing session secrets: AES-256-GCM with a random 12-byte nonce and associated data
//! `session_id + "\0" + name`, which binds each ciphertext to its session and name (a row
//! copied to another session or renamed does not decrypt). Pure code: no SQL here; the ledger
//! stores the [`SealedSecret`]s.

use aes_gcm::aead::{Aead, AeadCore, OsRng, Payload};
use aes_gcm::{Aes256Gcm, KeyInit, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use secrecy::SecretSlice;
use secrecy::zeroize::Zeroize as _;

use crate::secrets::{NONCE_LEN, SealedSecret};

/// Why sealing or opening a secret failed. Messages never contain secret material.
#[derive(Debug, thiserror::Error)]
pub enum CipherError {
    /// The key text is not 32 bytes in hex or base64.
    #[error("{message}")]
    InvalidKey {
        /// What is wrong with the key (never the key itself).
        message: String,
    },
    /// Authentication failed: another key, or the ciphertext, nonce, session or name changed.
    #[error(
        "secret {name:?} of session {session_id} cannot be decrypted: the key differs from the \
         one that sealed it, or the stored ciphertext was altered or belongs to another session"
    )]
    Decrypt {
        /// The session.
        session_id: String,
        /// The secret's name.
        name: String,
    },
    /// The secret was sealed with another key version.
    #[error("secret {name:?} was sealed with key version {found}; this key is version {expected}")]
    KeyVersion {
        /// The secret's name.
        name: String,
        /// Its key version.
        found: u32,
        /// This cipher's key version.
        expected: u32,
    },
    /// The AEAD refused to encrypt (the plaintext is too large).
    #[error("secret {name:?} cannot be encrypted (value too large)")]
    Encrypt {
        /// The secret's name.
        name: String,
    },
}

/// AES-256-GCM sealing of session secrets with one master key (key version 1).
#[derive(Clone)]
pub struct SecretCipher {
    cipher: Aes256Gcm,
    key_version: u32,
}

impl std::fmt::Debug for SecretCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretCipher")
            .field("key_version", &self.key_version)
            .finish_non_exhaustive()
    }
}

/// Length of the master key in bytes.
pub const KEY_LEN: usize = 32;

fn aad(session_id: &str, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(session_id.len() + 1 + name.len());
    aad.extend_from_slice(session_id.as_bytes());
    aad.push(0);
    aad.extend_from_slice(name.as_bytes());
    aad
}

impl SecretCipher {
    /// A cipher for a raw 32-byte key (key version 1).
    #[must_use]
    pub fn new(key: &[u8; KEY_LEN]) -> Self {
        Self {
            cipher: Aes256Gcm::new(key.into()),
            key_version: 1,
        }
    }

    /// Parses a key given as text (`RUNTIME_SECRETS_ENCRYPTION_KEY`): 32 bytes as hex
    /// (64 characters), standard base64, or unpadded standard base64. Surrounding whitespace is
    /// ignored.
    ///
    /// # Errors
    /// [`CipherError::InvalidKey`] saying which encodings were tried and how long the decoded
    /// key was (never the key).
    pub fn from_key_text(text: &str) -> Result<Self, CipherError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(CipherError::InvalidKey {
                message: "the secrets encryption key is empty; give 32 bytes as hex (64 \
                          characters) or base64"
                    .to_owned(),
            });
        }
        let hex_ok = text.len() == 2 * KEY_LEN && text.bytes().all(|b| b.is_ascii_hexdigit());
        let mut decoded = if hex_ok {
            hex::decode(text).ok()
        } else {
            STANDARD
                .decode(text)
                .ok()
                .or_else(|| STANDARD_NO_PAD.decode(text).ok())
        };
        let result = match decoded.as_deref() {
            Some(bytes) => match <&[u8; KEY_LEN]>::try_from(bytes) {
                Ok(key) => Ok(Self::new(key)),
                Err(_) => Err(CipherError::InvalidKey {
                    message: format!(
                        "the secrets encryption key decodes to {} bytes; AES-256 needs exactly \
                         {KEY_LEN} (64 hex characters or 44 base64 characters)",
                        bytes.len()
                    ),
                }),
            },
            None => Err(CipherError::InvalidKey {
                message: "the secrets encryption key is neither hex nor base64; give 32 bytes \
                          as 64 hex characters or as base64"
                    .to_owned(),
            }),
        };
        if let Some(bytes) = decoded.as_mut() {
            bytes.zeroize();
        }
        result
    }

    /// The key version written into sealed secrets.
    #[must_use]
    pub fn key_version(&self) -> u32 {
        self.key_version
    }

    /// Encrypts `plaintext` for `session_id` and `name` with a fresh random nonce.
    ///
    /// # Errors
    /// [`CipherError::Encrypt`] only for absurdly large values.
    pub fn seal(
        &self,
        session_id: &str,
        name: &str,
        plaintext: &[u8],
    ) -> Result<SealedSecret, CipherError> {
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let aad = aad(session_id, name);
        let ciphertext = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad: &aad,
                },
            )
            .map_err(|_| CipherError::Encrypt {
                name: name.to_owned(),
            })?;
        Ok(SealedSecret {
            name: name.to_owned(),
            key_version: self.key_version,
            nonce: nonce.to_vec(),
            ciphertext,
        })
    }

    /// Decrypts a secret of `session_id`.
    ///
    /// # Errors
    /// [`CipherError::KeyVersion`] for another key version; [`CipherError::Decrypt`] when
    /// authentication fails (wrong key, altered data, another session or name, bad nonce).
    pub fn open(
        &self,
        session_id: &str,
        secret: &SealedSecret,
    ) -> Result<SecretSlice<u8>, CipherError> {
        if secret.key_version != self.key_version {
            return Err(CipherError::KeyVersion {
                name: secret.name.clone(),
                found: secret.key_version,
                expected: self.key_version,
            });
        }
        let fail = || CipherError::Decrypt {
            session_id: session_id.to_owned(),
            name: secret.name.clone(),
        };
        if secret.nonce.len() != NONCE_LEN {
            return Err(fail());
        }
        let aad = aad(session_id, &secret.name);
        self.cipher
            .decrypt(
                Nonce::from_slice(&secret.nonce),
                Payload {
                    msg: &secret.ciphertext,
                    aad: &aad,
                },
            )
            .map(SecretSlice::from)
            .map_err(|_| fail())
    }
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret as _;

    use super::*;

    const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn cipher() -> SecretCipher {
        SecretCipher::from_key_text(KEY_HEX).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn seal_then_open_round_trips_with_fresh_nonces() {
        let c = cipher();
        let a = c
            .seal("run_a", "openai", b"sk-123")
            .unwrap_or_else(|e| panic!("{e}"));
        let b = c
            .seal("run_a", "openai", b"sk-123")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(a.nonce, b.nonce);
        assert_ne!(a.ciphertext, b.ciphertext);
        assert!(!a.ciphertext.windows(6).any(|w| w == b"sk-123"));
        let opened = c.open("run_a", &a).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opened.expose_secret(), b"sk-123");
    }

    #[test]
    fn ciphertext_is_bound_to_session_and_name() {
        let c = cipher();
        let sealed = c
            .seal("run_a", "openai", b"sk-123")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            c.open("run_b", &sealed),
            Err(CipherError::Decrypt { .. })
        ));
        let mut renamed = sealed.clone();
        renamed.name = "anthropic".into();
        assert!(matches!(
            c.open("run_a", &renamed),
            Err(CipherError::Decrypt { .. })
        ));
        let mut flipped = sealed.clone();
        if let Some(b) = flipped.ciphertext.first_mut() {
            *b ^= 1;
        }
        assert!(matches!(
            c.open("run_a", &flipped),
            Err(CipherError::Decrypt { .. })
        ));
        let other = SecretCipher::new(&[7; KEY_LEN]);
        let err = other.open("run_a", &sealed).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| !e.contains("sk-123")));
        let mut v2 = sealed;
        v2.key_version = 2;
        assert!(matches!(
            c.open("run_a", &v2),
            Err(CipherError::KeyVersion {
                found: 2,
                expected: 1,
                ..
            })
        ));
    }

    #[test]
    fn keys_parse_from_hex_and_both_base64_forms() {
        let raw: Vec<u8> = (0..32).collect();
        let padded = STANDARD.encode(&raw);
        let unpadded = STANDARD_NO_PAD.encode(&raw);
        let sealed = cipher()
            .seal("run_a", "k", b"v")
            .unwrap_or_else(|e| panic!("{e}"));
        for text in [
            KEY_HEX.to_owned(),
            padded,
            unpadded,
            format!("  {KEY_HEX}\n"),
        ] {
            let c = SecretCipher::from_key_text(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(c.open("run_a", &sealed).is_ok(), "{text}");
        }
        let short = STANDARD.encode([1_u8; 16]);
        for (text, needle) in [
            ("", "empty"),
            ("abcd", "decodes to 3 bytes"),
            ("not a key!", "neither hex nor base64"),
            (short.as_str(), "decodes to 16 bytes"),
        ] {
            match SecretCipher::from_key_text(text) {
                Err(CipherError::InvalidKey { message }) => {
                    assert!(message.contains(needle), "{text:?}: {message}");
                }
                other => panic!("{text:?}: expected InvalidKey, got {other:?}"),
            }
        }
    }
}
