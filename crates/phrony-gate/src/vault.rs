//! The credential vault of the routing routes: provider secrets sealed at rest.
//!
//! The vault file (`routing.vault.file`, JSON) holds one entry per secret name, each sealed
//! with AES-256-GCM by [`phrony_ledger::SecretCipher`], the runtime's session-secret cipher: a
//! random 12-byte nonce and the associated data `"mock-gate-vault/<org id>" + "\0" + <name>`,
//! so an entry copied under another name or into another organisation's vault does not open.
//! The key is never in the configuration: it comes from the environment variable
//! [`VAULT_KEY_ENV`] (read by `mock-gate` into [`VaultSettings::key`]) or from
//! `routing.vault.key_file` (32 bytes as hex or base64, the same
//! text form as `RUNTIME_SECRETS_ENCRYPTION_KEY`).
//!
//! Opened secrets are [`SecretString`]s: their `Debug` is redacted, and no error of this module
//! carries secret material (only names, paths and sizes).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use phrony_ledger::{SealedSecret, SecretCipher};
use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize};

/// The environment variable holding the vault key (32 bytes, hex or base64).
pub const VAULT_KEY_ENV: &str = "MOCK_GATE_VAULT_KEY";
/// The largest vault file read.
pub const MAX_VAULT_BYTES: u64 = 1024 * 1024;
/// The longest secret accepted (bytes).
pub const MAX_SECRET_BYTES: usize = 8 * 1024;

/// Errors opening or writing the vault. They never contain secret material.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    /// No key: neither the environment variable nor a key file.
    #[error(
        "no vault key: set {VAULT_KEY_ENV} or routing.vault.key_file (32 bytes as hex or base64)"
    )]
    NoKey,
    /// The key text is invalid.
    #[error("vault key {origin}: {error}")]
    Key {
        /// Where the key came from (the variable or the file).
        origin: String,
        /// What is wrong (never the key).
        error: phrony_ledger::CipherError,
    },
    /// A file cannot be read or written.
    #[error("vault {path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The IO error.
        error: std::io::Error,
    },
    /// The vault file is not a vault.
    #[error("vault {path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A secret named by the configuration is not in the vault.
    #[error("vault {path}: no secret `{name}` (add it with `mock-gate vault put --name {name}`)")]
    Missing {
        /// The file.
        path: PathBuf,
        /// The secret's name.
        name: String,
    },
    /// A secret does not decrypt (another key, or altered).
    #[error("vault {path}: {error}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The cipher's error (names the secret, never its value).
        error: phrony_ledger::CipherError,
    },
    /// A secret is unusable as a credential.
    #[error("vault secret `{name}`: {message}")]
    Invalid {
        /// The secret's name.
        name: String,
        /// What is wrong (never the value).
        message: String,
    },
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VaultFile {
    version: u32,
    secrets: BTreeMap<String, SealedEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SealedEntry {
    key_version: u32,
    nonce: String,
    ciphertext: String,
}

/// The associated-data scope of an organisation's vault.
fn scope(org_id: &str) -> String {
    format!("mock-gate-vault/{org_id}")
}

/// Where the vault is and how its key is found.
#[derive(Debug, Clone)]
pub struct VaultSettings {
    /// The sealed vault file.
    pub file: PathBuf,
    /// A file holding the key (used when [`Self::key`] is not set).
    pub key_file: Option<PathBuf>,
    /// The key text given by the embedder: `mock-gate` reads [`VAULT_KEY_ENV`] into it (a
    /// library does not read the environment). Takes precedence over the key file.
    pub key: Option<SecretString>,
}

/// The vault cipher, with the key found per [`VaultSettings`].
///
/// # Errors
/// [`VaultError::NoKey`] or [`VaultError::Key`].
pub fn cipher(settings: &VaultSettings) -> Result<SecretCipher, VaultError> {
    let (text, origin) = match (&settings.key, &settings.key_file) {
        (Some(key), _) => (key.clone(), VAULT_KEY_ENV.to_owned()),
        (None, Some(path)) => (
            SecretString::from(
                std::fs::read_to_string(path).map_err(|error| VaultError::Io {
                    path: path.clone(),
                    error,
                })?,
            ),
            format!("file {}", path.display()),
        ),
        (None, None) => return Err(VaultError::NoKey),
    };
    SecretCipher::from_key_text(text.expose_secret())
        .map_err(|error| VaultError::Key { origin, error })
}

fn read(path: &Path) -> Result<VaultFile, VaultError> {
    let io = |error| VaultError::Io {
        path: path.to_owned(),
        error,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_VAULT_BYTES {
        return Err(VaultError::Format {
            path: path.to_owned(),
            message: format!("{len} bytes; the limit is {MAX_VAULT_BYTES}"),
        });
    }
    let text = std::fs::read(path).map_err(io)?;
    let file: VaultFile = serde_json::from_slice(&text).map_err(|e| VaultError::Format {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    if file.version != 1 {
        return Err(VaultError::Format {
            path: path.to_owned(),
            message: format!("version {} is not supported (1 is)", file.version),
        });
    }
    Ok(file)
}

/// Seals `value` under `name` into the vault file (created if missing; other entries kept).
///
/// # Errors
/// [`VaultError`] for a bad key, an unreadable or unwritable file, or an unusable value.
pub fn put(
    settings: &VaultSettings,
    org_id: &str,
    name: &str,
    value: &SecretString,
) -> Result<(), VaultError> {
    check_secret(name, value)?;
    let cipher = cipher(settings)?;
    let mut file = if settings.file.exists() {
        read(&settings.file)?
    } else {
        VaultFile {
            version: 1,
            secrets: BTreeMap::new(),
        }
    };
    let sealed = cipher
        .seal(&scope(org_id), name, value.expose_secret().as_bytes())
        .map_err(|error| VaultError::Open {
            path: settings.file.clone(),
            error,
        })?;
    file.secrets.insert(
        name.to_owned(),
        SealedEntry {
            key_version: sealed.key_version,
            nonce: STANDARD.encode(&sealed.nonce),
            ciphertext: STANDARD.encode(&sealed.ciphertext),
        },
    );
    let text = serde_json::to_vec_pretty(&file).map_err(|e| VaultError::Format {
        path: settings.file.clone(),
        message: e.to_string(),
    })?;
    let io = |error| VaultError::Io {
        path: settings.file.clone(),
        error,
    };
    if let Some(dir) = settings.file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    std::fs::write(&settings.file, text).map_err(io)
}

/// A secret is usable as a header value: 1 to [`MAX_SECRET_BYTES`] visible ASCII characters.
fn check_secret(name: &str, value: &SecretString) -> Result<(), VaultError> {
    let v = value.expose_secret();
    let bad = |message: String| VaultError::Invalid {
        name: name.to_owned(),
        message,
    };
    if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(
            "a secret name has 1 to 128 visible ASCII characters".into()
        ));
    }
    if v.is_empty() || v.len() > MAX_SECRET_BYTES {
        return Err(bad(format!(
            "the value must have 1 to {MAX_SECRET_BYTES} bytes, got {}",
            v.len()
        )));
    }
    if !v.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(bad(
            "the value must be printable ASCII (it is sent in an HTTP header)".into(),
        ));
    }
    Ok(())
}

/// The opened secrets named in `names`.
///
/// # Errors
/// [`VaultError`] for a bad key or file, a missing secret, or one that does not decrypt.
pub fn open(
    settings: &VaultSettings,
    org_id: &str,
    names: &[&str],
) -> Result<BTreeMap<String, SecretString>, VaultError> {
    let cipher = cipher(settings)?;
    let file = read(&settings.file)?;
    let mut out = BTreeMap::new();
    for name in names {
        let entry = file.secrets.get(*name).ok_or_else(|| VaultError::Missing {
            path: settings.file.clone(),
            name: (*name).to_owned(),
        })?;
        let format = |what: &str| VaultError::Format {
            path: settings.file.clone(),
            message: format!("secret `{name}`: {what} is not base64"),
        };
        let sealed = SealedSecret {
            name: (*name).to_owned(),
            key_version: entry.key_version,
            nonce: STANDARD.decode(&entry.nonce).map_err(|_| format("nonce"))?,
            ciphertext: STANDARD
                .decode(&entry.ciphertext)
                .map_err(|_| format("ciphertext"))?,
        };
        let plain = cipher
            .open(&scope(org_id), &sealed)
            .map_err(|error| VaultError::Open {
                path: settings.file.clone(),
                error,
            })?;
        let text =
            String::from_utf8(plain.expose_secret().to_vec()).map_err(|_| VaultError::Invalid {
                name: (*name).to_owned(),
                message: "not UTF-8".into(),
            })?;
        let secret = SecretString::from(text);
        check_secret(name, &secret)?;
        out.insert((*name).to_owned(), secret);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn settings(dir: &Path) -> VaultSettings {
        let key_file = dir.join("vault.key");
        std::fs::write(&key_file, KEY).unwrap();
        VaultSettings {
            file: dir.join("vault.json"),
            key_file: Some(key_file),
            key: None,
        }
    }

    #[test]
    fn a_sealed_secret_opens_and_is_not_stored_in_clear() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        put(
            &s,
            "org_bank",
            "payments",
            &SecretString::from("sk_live_123"),
        )
        .unwrap();
        let raw = std::fs::read_to_string(&s.file).unwrap();
        assert!(!raw.contains("sk_live_123"), "{raw}");
        let opened = open(&s, "org_bank", &["payments"]).unwrap();
        assert_eq!(opened["payments"].expose_secret(), "sk_live_123");
        assert!(!format!("{:?}", opened["payments"]).contains("sk_live"));
    }

    #[test]
    fn another_org_another_key_or_a_missing_name_do_not_open() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        put(
            &s,
            "org_bank",
            "payments",
            &SecretString::from("sk_live_123"),
        )
        .unwrap();
        let err = open(&s, "org_other", &["payments"]).unwrap_err();
        assert!(matches!(err, VaultError::Open { .. }), "{err}");
        assert!(!err.to_string().contains("sk_live"));
        let err = open(&s, "org_bank", &["nope"]).unwrap_err();
        assert!(err.to_string().contains("no secret `nope`"), "{err}");
        std::fs::write(
            s.key_file.as_ref().unwrap(),
            KEY.replace("00010203", "ffffffff"),
        )
        .unwrap();
        assert!(matches!(
            open(&s, "org_bank", &["payments"]).unwrap_err(),
            VaultError::Open { .. }
        ));
    }

    #[test]
    fn unusable_values_are_refused_before_sealing() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        let err = put(&s, "o", "p", &SecretString::from("line\nbreak")).unwrap_err();
        assert!(err.to_string().contains("printable ASCII"), "{err}");
        let err = put(&s, "o", "p", &SecretString::from("")).unwrap_err();
        assert!(err.to_string().contains("1 to 8192 bytes"), "{err}");
        let mut keyless = VaultSettings {
            file: dir.path().join("v.json"),
            key_file: None,
            key: None,
        };
        assert!(matches!(cipher(&keyless).unwrap_err(), VaultError::NoKey));
        keyless.key = Some(SecretString::from("abc"));
        let err = cipher(&keyless).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("vault key MOCK_GATE_VAULT_KEY: "),
            "{err}"
        );
        keyless.key = Some(SecretString::from(KEY));
        put(&keyless, "o", "p", &SecretString::from("v")).unwrap();
        assert_eq!(
            open(&keyless, "o", &["p"]).unwrap()["p"].expose_secret(),
            "v"
        );
    }
}
