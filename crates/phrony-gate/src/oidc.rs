//! OIDC delegation: verifying the user's `id_token` against the configured issuer's JWKS and
//! deriving `user_role`; and the local test IdP that mints such tokens.

use std::collections::BTreeMap;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Value, json};

use crate::config::OidcSettings;
use crate::keys::{KeyError, SigningKey};

/// Clock skew tolerated on `exp` and `nbf`.
const LEEWAY_SECONDS: i64 = 30;

/// A verified user.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VerifiedUser {
    /// `sub`.
    pub sub: String,
    /// The e-mail claim, if present.
    pub email: Option<String>,
    /// The role derived from the role claim.
    pub role: String,
}

/// Errors setting up the verifier.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The JWKS file cannot be read or is not a JWKS.
    #[error("OIDC JWKS {path}: {message}")]
    Jwks {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The test IdP key.
    #[error("test IdP key: {0}")]
    Key(KeyError),
}

/// The key's error is in the message, not a `source()` (a report names it once).
impl From<KeyError> for OidcError {
    fn from(error: KeyError) -> Self {
        Self::Key(error)
    }
}

/// Verifies user tokens of one issuer.
pub struct Verifier {
    settings: OidcSettings,
    keys: BTreeMap<String, DecodingKey>,
    test_idp: Option<SigningKey>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("issuer", &self.settings.issuer)
            .field("kids", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// Loads the JWKS file and/or the test IdP key (creating the key on first use).
    ///
    /// # Errors
    /// [`OidcError`] when a key source cannot be read.
    pub fn new(settings: &OidcSettings) -> Result<Self, OidcError> {
        let mut keys = BTreeMap::new();
        if let Some(path) = &settings.jwks_file {
            let jwks_error = |message: String| OidcError::Jwks {
                path: path.display().to_string(),
                message,
            };
            let text = std::fs::read_to_string(path).map_err(|e| jwks_error(e.to_string()))?;
            let jwks: Value = serde_json::from_str(&text).map_err(|e| jwks_error(e.to_string()))?;
            let list = jwks
                .get("keys")
                .and_then(Value::as_array)
                .ok_or_else(|| jwks_error("has no `keys` array".into()))?;
            for jwk in list {
                let (Some(kid), Some("RSA"), Some(n), Some(e)) = (
                    jwk.get("kid").and_then(Value::as_str),
                    jwk.get("kty").and_then(Value::as_str),
                    jwk.get("n").and_then(Value::as_str),
                    jwk.get("e").and_then(Value::as_str),
                ) else {
                    continue;
                };
                let key = DecodingKey::from_rsa_components(n, e)
                    .map_err(|e| jwks_error(format!("key `{kid}`: {e}")))?;
                keys.insert(kid.to_owned(), key);
            }
            if keys.is_empty() {
                return Err(jwks_error("holds no RSA key with a kid".into()));
            }
        }
        let test_idp = match &settings.test_idp_key {
            Some(path) => {
                let key = SigningKey::load_or_create(path)?;
                let jwk = key.public_jwk();
                let n = jwk["n"].as_str().unwrap_or_default();
                let e = jwk["e"].as_str().unwrap_or_default();
                let decoding = DecodingKey::from_rsa_components(n, e)
                    .map_err(|e| KeyError::Crypto(e.to_string()))?;
                keys.insert(key.kid().to_owned(), decoding);
                Some(key)
            }
            None => None,
        };
        Ok(Self {
            settings: settings.clone(),
            keys,
            test_idp,
        })
    }

    /// Verifies signature, `iss`, `aud`, `exp` and `nbf` (against `now_unix`, 30 s leeway) of
    /// `token` and derives the user.
    ///
    /// # Errors
    /// A message naming what is wrong with the token.
    pub fn verify(&self, token: &str, now_unix: i64) -> Result<VerifiedUser, String> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| format!("not a JWT: {e}"))?;
        if header.alg != Algorithm::RS256 {
            return Err(format!("alg {:?} is not RS256", header.alg));
        }
        let kid = header.kid.ok_or("the token has no kid")?;
        let key = self
            .keys
            .get(&kid)
            .ok_or_else(|| format!("kid `{kid}` is not in the issuer's JWKS"))?;
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        // Time is checked below against the gate's clock, not the system's.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        let data = jsonwebtoken::decode::<Value>(token, key, &validation)
            .map_err(|e| format!("invalid: {e}"))?;
        let claims = data.claims;
        let exp = claims
            .get("exp")
            .and_then(Value::as_i64)
            .ok_or("the token has no numeric exp")?;
        if exp + LEEWAY_SECONDS < now_unix {
            return Err(format!("expired at {exp}"));
        }
        if let Some(nbf) = claims.get("nbf").and_then(Value::as_i64)
            && nbf - LEEWAY_SECONDS > now_unix
        {
            return Err(format!("not valid before {nbf}"));
        }
        let sub = claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or("the token has no sub")?
            .to_owned();
        let role = match claims.get(&self.settings.role_claim) {
            Some(Value::String(r)) if !r.is_empty() => r.clone(),
            Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
                items[0].as_str().unwrap_or_default().to_owned()
            }
            Some(_) => {
                return Err(format!(
                    "claim `{}` must be one role (a string)",
                    self.settings.role_claim
                ));
            }
            None => {
                return Err(format!(
                    "the token has no `{}` claim",
                    self.settings.role_claim
                ));
            }
        };
        let email = claims
            .get(&self.settings.email_claim)
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(VerifiedUser { sub, email, role })
    }

    /// Mints an `id_token` from the local test IdP.
    ///
    /// # Errors
    /// A message when no test IdP is configured or signing fails.
    pub fn mint_test_token(
        &self,
        sub: &str,
        role: &str,
        email: Option<&str>,
        now_unix: i64,
    ) -> Result<String, String> {
        let key = self
            .test_idp
            .as_ref()
            .ok_or("the configuration has no oidc.test_idp")?;
        let mut claims = json!({
            "iss": self.settings.issuer,
            "aud": self.settings.audience,
            "sub": sub,
            "iat": now_unix,
            "exp": now_unix + i64::from(self.settings.test_idp_ttl_seconds),
        });
        claims[self.settings.role_claim.as_str()] = json!(role);
        if let Some(email) = email {
            claims[self.settings.email_claim.as_str()] = json!(email);
        }
        key.sign("JWT", &claims).map_err(|e| e.to_string())
    }

    /// The JWKS of the test IdP, if any.
    #[must_use]
    pub fn test_idp_jwks(&self) -> Option<Value> {
        self.test_idp.as_ref().map(SigningKey::jwks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &std::path::Path) -> OidcSettings {
        OidcSettings {
            issuer: "https://idp.test".into(),
            audience: "gate".into(),
            role_claim: "role".into(),
            email_claim: "email".into(),
            jwks_file: None,
            test_idp_key: Some(dir.join("idp.pem")),
            test_idp_ttl_seconds: 600,
        }
    }

    #[test]
    fn test_idp_tokens_verify_and_bad_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let v = Verifier::new(&settings(dir.path())).unwrap();
        let now = chrono::Utc::now().timestamp();
        let token = v
            .mint_test_token("alice@bank", "support_agent", Some("alice@bank"), now)
            .unwrap();
        assert_eq!(
            v.verify(&token, now).unwrap(),
            VerifiedUser {
                sub: "alice@bank".into(),
                email: Some("alice@bank".into()),
                role: "support_agent".into()
            }
        );
        let expired = v.mint_test_token("a", "r", None, now - 10_000).unwrap();
        assert!(v.verify(&expired, now).unwrap_err().contains("expired"));
        // Another issuer's key (same config, fresh key file) is not trusted.
        let other_dir = tempfile::tempdir().unwrap();
        let other = Verifier::new(&settings(other_dir.path())).unwrap();
        let foreign = other.mint_test_token("a", "manager", None, now).unwrap();
        assert!(
            v.verify(&foreign, now)
                .unwrap_err()
                .contains("not in the issuer's JWKS")
        );
        // Wrong audience.
        let mut s = settings(dir.path());
        s.audience = "someone-else".into();
        let v2 = Verifier::new(&s).unwrap();
        let token2 = v2.mint_test_token("a", "r", None, now).unwrap();
        assert!(v.verify(&token2, now).is_err());
        assert!(v.verify("garbage", now).is_err());
    }

    #[test]
    fn jwks_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let idp = Verifier::new(&settings(dir.path())).unwrap();
        let jwks_path = dir.path().join("jwks.json");
        std::fs::write(&jwks_path, idp.test_idp_jwks().unwrap().to_string()).unwrap();
        let mut s = settings(dir.path());
        s.test_idp_key = None;
        s.jwks_file = Some(jwks_path);
        let v = Verifier::new(&s).unwrap();
        let now = chrono::Utc::now().timestamp();
        let token = idp.mint_test_token("bob", "manager", None, now).unwrap();
        assert_eq!(v.verify(&token, now).unwrap().role, "manager");
        assert!(v.mint_test_token("x", "y", None, now).is_err());
    }
}
