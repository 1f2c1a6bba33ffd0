//! RSA signing keys: the gate's token/receipt key and the test IdP's key.
//!
//! Keys are RSA-2048, stored as PKCS#8 PEM files (mode 0600) and generated on first use, so a
//! restarted gate keeps publishing the same JWKS. The `kid` is the first 16 hex characters of
//! the SHA-256 of the key's RFC 7638 JWK thumbprint input.

use std::path::{Path, PathBuf};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, Header};
use rsa::PrivateKey as RsaPrivateKey;
use rsa::pkcs1::EncodeRsaPrivateKey as _;
use rsa::pkcs8::{DecodePrivateKey as _, EncodePrivateKey as _, LineEnding};
use rsa::traits::PublicKeyParts as _;
use serde::Serialize;
use serde_json::{Value, json};

use crate::canonical::{hmac_sha256_hex, sha256_hex};

/// Errors loading, creating or using a key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file cannot be read or written.
    #[error("key file {path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The IO error.
        error: std::io::Error,
    },
    /// The key file is not an RSA PKCS#8 PEM key.
    #[error("key file {path} is not an RSA PKCS#8 PEM private key: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// The decoder's message.
        message: String,
    },
    /// Key generation or signing failed.
    #[error("{0}")]
    Crypto(String),
}

/// An RSA signing key with its `kid`.
pub struct SigningKey {
    kid: String,
    /// Parsed and checked once: every token and receipt is signed with it.
    pair: RsaKeyPair,
    jwk: Value,
    /// PKCS#1 DER of the private key; also the secret behind commitment salts.
    secret: Vec<u8>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A fresh in-memory key (nothing written).
    ///
    /// # Errors
    /// [`KeyError::Crypto`] when the system RNG or key generation fails.
    pub fn generate() -> Result<Self, KeyError> {
        let key = RsaPrivateKey::new(&mut getrandom::SysRng, 2048)
            .map_err(|e| KeyError::Crypto(format!("generating an RSA key: {e}")))?;
        Self::from_rsa(&key)
    }

    /// Loads the key at `path`, or generates one and writes it there (creating parent
    /// directories, mode 0600) when the file does not exist.
    ///
    /// # Errors
    /// [`KeyError`] when the file cannot be read, parsed or written.
    pub fn load_or_create(path: &Path) -> Result<Self, KeyError> {
        let io = |error| KeyError::Io {
            path: path.to_owned(),
            error,
        };
        match std::fs::read_to_string(path) {
            Ok(pem) => {
                let key = RsaPrivateKey::from_pkcs8_pem(&pem).map_err(|e| KeyError::Format {
                    path: path.to_owned(),
                    message: e.to_string(),
                })?;
                Self::from_rsa(&key)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = RsaPrivateKey::new(&mut getrandom::SysRng, 2048)
                    .map_err(|e| KeyError::Crypto(format!("generating an RSA key: {e}")))?;
                let pem = key
                    .to_pkcs8_pem(LineEnding::LF)
                    .map_err(|e| KeyError::Crypto(format!("encoding the key: {e}")))?;
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent).map_err(io)?;
                }
                write_private(path, pem.as_bytes()).map_err(io)?;
                Self::from_rsa(&key)
            }
            Err(e) => Err(io(e)),
        }
    }

    fn from_rsa(key: &RsaPrivateKey) -> Result<Self, KeyError> {
        let der = key
            .to_pkcs1_der()
            .map_err(|e| KeyError::Crypto(format!("encoding the key: {e}")))?;
        let n = URL_SAFE_NO_PAD.encode(key.n_bytes());
        let e = URL_SAFE_NO_PAD.encode(key.e_bytes());
        let thumbprint_input = format!(r#"{{"e":"{e}","kty":"RSA","n":"{n}"}}"#);
        let kid = sha256_hex(thumbprint_input.as_bytes())[..16].to_owned();
        let jwk = json!({"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid, "n": n, "e": e});
        let pair = RsaKeyPair::from_der(der.as_bytes())
            .map_err(|e| KeyError::Crypto(format!("loading the key for signing: {e}")))?;
        Ok(Self {
            pair,
            secret: der.as_bytes().to_vec(),
            kid,
            jwk,
        })
    }

    /// The key id.
    #[must_use]
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public JWK (`kty`, `use`, `alg`, `kid`, `n`, `e`).
    #[must_use]
    pub fn public_jwk(&self) -> &Value {
        &self.jwk
    }

    /// A JWKS holding only this key.
    #[must_use]
    pub fn jwks(&self) -> Value {
        json!({"keys": [self.jwk]})
    }

    /// Signs `claims` as a compact RS256 JWS with this key's `kid` and the given `typ`.
    ///
    /// # Errors
    /// [`KeyError::Crypto`] when serialisation or signing fails.
    pub fn sign<T: Serialize>(&self, typ: &str, claims: &T) -> Result<String, KeyError> {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(self.kid.clone());
        header.typ = Some(typ.to_owned());
        let mut jws = json_part(&header)?;
        jws.push('.');
        jws.push_str(&json_part(claims)?);
        let mut signature = vec![0; self.pair.public_modulus_len()];
        self.pair
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                jws.as_bytes(),
                &mut signature,
            )
            .map_err(|e| KeyError::Crypto(format!("signing a token: {e}")))?;
        jws.push('.');
        jws.push_str(&URL_SAFE_NO_PAD.encode(signature));
        Ok(jws)
    }

    /// A secret, stable per key, derived for `label` (hex, 32 characters): the salt of the
    /// mandate and policy commitments. Without the private key it cannot be guessed, so the
    /// commitments hide the terms until the owner reveals them.
    #[must_use]
    pub fn derive_salt(&self, label: &str) -> String {
        let mut message = b"phrony-gate.salt.v1|".to_vec();
        message.extend_from_slice(label.as_bytes());
        hmac_sha256_hex(&self.secret, &message)[..32].to_owned()
    }
}

/// A JWS part: the base64url (unpadded) JSON of `value`.
fn json_part<T: Serialize + ?Sized>(value: &T) -> Result<String, KeyError> {
    let json = serde_json::to_vec(value)
        .map_err(|e| KeyError::Crypto(format!("encoding a token part: {e}")))?;
    Ok(URL_SAFE_NO_PAD.encode(json))
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_round_trips_through_its_file_and_signs_verifiable_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/key.pem");
        let first = SigningKey::load_or_create(&path).unwrap();
        let again = SigningKey::load_or_create(&path).unwrap();
        assert_eq!(first.kid(), again.kid());
        assert_eq!(first.kid().len(), 16);
        assert_eq!(first.derive_salt("m|1"), again.derive_salt("m|1"));
        assert_ne!(first.derive_salt("m|1"), first.derive_salt("m|2"));

        let token = first
            .sign("JWT", &json!({"sub": "a", "exp": 4_000_000_000_u64}))
            .unwrap();
        let jwk = first.public_jwk();
        let key = jsonwebtoken::DecodingKey::from_rsa_components(
            jwk["n"].as_str().unwrap(),
            jwk["e"].as_str().unwrap(),
        )
        .unwrap();
        let mut validation = jsonwebtoken::Validation::new(Algorithm::RS256);
        validation.validate_aud = false;
        let data = jsonwebtoken::decode::<Value>(&token, &key, &validation).unwrap();
        assert_eq!(data.header.kid.as_deref(), Some(first.kid()));
        assert_eq!(data.claims["sub"], "a");
    }

    #[test]
    fn a_file_that_is_not_a_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        std::fs::write(&path, "not a key").unwrap();
        assert!(matches!(
            SigningKey::load_or_create(&path),
            Err(KeyError::Format { .. })
        ));
    }
}
