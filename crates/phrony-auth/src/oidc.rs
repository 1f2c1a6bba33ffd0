//! OIDC bearer JWTs: the pure verifier (no IO) over a JWKS the caller already holds.
//!
//! [`OidcVerifier::verify`] checks, in this order, and refuses with a distinct
//! [`AuthError::Rejected`] reason for each:
//!
//! 1. the header: an asymmetric algorithm only (`RS*`, `PS*`, `ES*`, `EdDSA`; `none` and `HS*`
//!    are refused) and a `kid`;
//! 2. the key: the `kid` is in the JWKS (else "unknown key id", which tells the caller a JWKS
//!    refresh may help, see [`OidcRejection::UnknownKeyId`]), the key's type matches the
//!    algorithm's family and, when the JWK names an `alg`, it is the header's;
//! 3. the signature, then `exp` (required) and `nbf` (checked when present) with the configured
//!    leeway, `iss` (required, exactly the configured issuer) and `aud` (required, containing the
//!    configured audience);
//! 4. the subject `sub` (required, non-empty) becomes the [`Principal`] (verification
//!    [`Verification::Oidc`]); roles come from the configured claim (a dotted path such as
//!    `realm_access.roles`; an array of strings or one space-separated string), route and tool
//!    restrictions from the optional `phrony_routes` / `phrony_tools` claims (arrays of strings).
//!    Unknown role names and unusable tool patterns are ignored (they never widen what the token
//!    may do) and listed in [`OidcVerified::ignored`] so the daemon can log them.

use std::collections::BTreeSet;
use std::fmt;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::authenticate::AuthError;
use crate::principal::{Principal, ToolPattern, Verification};
use crate::role::Role;

/// The claim listing the approval routes an OIDC principal may vote on.
pub const ROUTES_CLAIM: &str = "phrony_routes";
/// The claim listing the `tool@version` patterns an OIDC worker may serve.
pub const TOOLS_CLAIM: &str = "phrony_tools";
/// The roles claim when none is configured.
pub const DEFAULT_ROLES_CLAIM: &str = "roles";
/// The clock-skew leeway on `exp` / `nbf` when none is configured, in seconds.
pub const DEFAULT_LEEWAY_SECS: u64 = 60;
/// The longest bearer JWT looked at (bytes); longer ones are refused before any parsing.
pub const MAX_JWT_BYTES: usize = 16 * 1024;

/// What the verifier checks a JWT against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcConfig {
    /// The exact `iss` expected.
    pub issuer: String,
    /// The audience that must be in `aud`.
    pub audience: String,
    /// The claim holding the roles; a dotted path descends into objects (`realm_access.roles`).
    pub roles_claim: String,
    /// Clock-skew leeway on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
}

impl OidcConfig {
    /// A configuration with the default roles claim and leeway.
    #[must_use]
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        Self {
            issuer: issuer.into(),
            audience: audience.into(),
            roles_claim: DEFAULT_ROLES_CLAIM.to_owned(),
            leeway_secs: DEFAULT_LEEWAY_SECS,
        }
    }
}

/// Why a JWT was refused. Each variant is one reason of [`AuthError::Rejected`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OidcRejection {
    /// Longer than [`MAX_JWT_BYTES`].
    #[error("the JWT is {len} bytes, over the {max}-byte bound")]
    TooLong {
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// Not a JWT the verifier can read (shape, base64, JSON, or an algorithm it does not know,
    /// such as `none`).
    #[error("malformed JWT: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// A symmetric (HMAC) algorithm: the runtime only accepts keys the issuer publishes.
    #[error("JWT algorithm {alg} is refused: only asymmetric algorithms (RS*, PS*, ES*, EdDSA)")]
    SymmetricAlgorithm {
        /// The header's algorithm.
        alg: String,
    },
    /// The header names no `kid`.
    #[error("the JWT header has no key id (kid)")]
    MissingKeyId,
    /// The `kid` is not in the JWKS.
    #[error("unknown key id {kid:?} (not in the issuer's JWKS)")]
    UnknownKeyId {
        /// The header's `kid`.
        kid: String,
    },
    /// The JWKS key cannot verify this algorithm (type or `alg` mismatch, unusable key).
    #[error("key {kid:?} cannot verify a {alg} JWT: {reason}")]
    KeyMismatch {
        /// The key id.
        kid: String,
        /// The header's algorithm.
        alg: String,
        /// What does not fit.
        reason: String,
    },
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// Past `exp` (beyond the leeway).
    #[error("the JWT expired")]
    Expired,
    /// Before `nbf` (beyond the leeway).
    #[error("the JWT is not valid yet (nbf)")]
    NotYetValid,
    /// `iss` is not the configured issuer.
    #[error("wrong issuer (expected {expected:?})")]
    WrongIssuer {
        /// The configured issuer.
        expected: String,
    },
    /// `aud` does not contain the configured audience.
    #[error("wrong audience (expected {expected:?})")]
    WrongAudience {
        /// The configured audience.
        expected: String,
    },
    /// A required claim is missing or has the wrong type.
    #[error("claim {claim:?} is missing or invalid")]
    BadClaim {
        /// The claim.
        claim: String,
    },
}

impl From<OidcRejection> for AuthError {
    fn from(r: OidcRejection) -> Self {
        AuthError::Rejected {
            reason: format!("OIDC: {r}"),
        }
    }
}

/// A verified JWT: the principal, and what in its claims was ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcVerified {
    /// The subject, with its roles, routes and tools.
    pub principal: Principal,
    /// Claim values that were ignored (unknown role names, unusable tool patterns), each with the
    /// reason.
    pub ignored: Vec<String>,
}

/// Verifies bearer JWTs from one issuer.
#[derive(Clone, PartialEq, Eq)]
pub struct OidcVerifier {
    config: OidcConfig,
}

impl fmt::Debug for OidcVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OidcVerifier")
            .field("issuer", &self.config.issuer)
            .field("audience", &self.config.audience)
            .field("roles_claim", &self.config.roles_claim)
            .finish_non_exhaustive()
    }
}

impl OidcVerifier {
    /// A verifier for `config`.
    #[must_use]
    pub fn new(config: OidcConfig) -> Self {
        Self { config }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &OidcConfig {
        &self.config
    }

    /// The `kid` a token's header names, if it has a readable header (lets the caller decide
    /// whether to refresh its JWKS before [`OidcVerifier::verify`]).
    #[must_use]
    pub fn key_id(token: &str) -> Option<String> {
        if token.len() > MAX_JWT_BYTES {
            return None;
        }
        jsonwebtoken::decode_header(token).ok().and_then(|h| h.kid)
    }

    /// Verifies `token` against `jwks` (see the module docs for what is checked).
    ///
    /// # Errors
    /// One [`OidcRejection`] per failure.
    pub fn verify(&self, token: &str, jwks: &JwkSet) -> Result<OidcVerified, OidcRejection> {
        if token.len() > MAX_JWT_BYTES {
            return Err(OidcRejection::TooLong {
                len: token.len(),
                max: MAX_JWT_BYTES,
            });
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| OidcRejection::Malformed {
            reason: match e.kind() {
                ErrorKind::Json(_) | ErrorKind::InvalidAlgorithmName => {
                    "unreadable header or unsupported algorithm (`none` is refused)".to_owned()
                }
                _ => e.to_string(),
            },
        })?;
        let alg = header.alg;
        let alg_name = format!("{alg:?}");
        if matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
            return Err(OidcRejection::SymmetricAlgorithm { alg: alg_name });
        }
        let kid = header.kid.ok_or(OidcRejection::MissingKeyId)?;
        let jwk = jwks
            .find(&kid)
            .ok_or_else(|| OidcRejection::UnknownKeyId { kid: kid.clone() })?;
        let key = decoding_key(jwk, alg).map_err(|reason| OidcRejection::KeyMismatch {
            kid: kid.clone(),
            alg: alg_name.clone(),
            reason,
        })?;

        let mut validation = Validation::new(alg);
        validation.leeway = self.config.leeway_secs;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = true;
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data = jsonwebtoken::decode::<Value>(token, &key, &validation)
            .map_err(|e| self.rejection(&e))?;
        self.principal(&data.claims)
    }

    fn rejection(&self, e: &jsonwebtoken::errors::Error) -> OidcRejection {
        match e.kind() {
            ErrorKind::InvalidSignature => OidcRejection::BadSignature,
            ErrorKind::ExpiredSignature => OidcRejection::Expired,
            ErrorKind::ImmatureSignature => OidcRejection::NotYetValid,
            ErrorKind::InvalidIssuer => OidcRejection::WrongIssuer {
                expected: self.config.issuer.clone(),
            },
            ErrorKind::InvalidAudience => OidcRejection::WrongAudience {
                expected: self.config.audience.clone(),
            },
            ErrorKind::MissingRequiredClaim(c) | ErrorKind::InvalidClaimFormat(c) => {
                OidcRejection::BadClaim { claim: c.clone() }
            }
            ErrorKind::InvalidEcdsaKey
            | ErrorKind::InvalidEddsaKey
            | ErrorKind::InvalidRsaKey(_)
            | ErrorKind::InvalidKeyFormat
            | ErrorKind::InvalidAlgorithm => OidcRejection::KeyMismatch {
                kid: String::new(),
                alg: String::new(),
                reason: e.to_string(),
            },
            _ => OidcRejection::Malformed {
                reason: e.to_string(),
            },
        }
    }

    fn principal(&self, claims: &Value) -> Result<OidcVerified, OidcRejection> {
        let sub = claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| OidcRejection::BadClaim {
                claim: "sub".to_owned(),
            })?;
        let mut ignored = Vec::new();
        let mut roles = BTreeSet::new();
        if let Some(value) = claim_path(claims, &self.config.roles_claim) {
            for name in strings(value) {
                match name.parse::<Role>() {
                    Ok(role) => {
                        roles.insert(role);
                    }
                    Err(e) => ignored.push(format!("claim {}: {e}", self.config.roles_claim)),
                }
            }
        }
        let routes = claims
            .get(ROUTES_CLAIM)
            .map(|v| strings(v).into_iter().map(str::to_owned).collect())
            .unwrap_or_default();
        let mut tools = Vec::new();
        for pattern in claims.get(TOOLS_CLAIM).map(strings).unwrap_or_default() {
            match ToolPattern::parse(pattern) {
                Ok(p) => tools.push(p),
                Err(e) => ignored.push(format!("claim {TOOLS_CLAIM}: {e}")),
            }
        }
        Ok(OidcVerified {
            principal: Principal {
                name: sub.to_owned(),
                verification: Verification::Oidc,
                roles,
                routes,
                tools,
            },
            ignored,
        })
    }
}

/// The decoding key for `alg` from `jwk`, refusing symmetric keys and family or `alg` mismatches.
fn decoding_key(jwk: &Jwk, alg: Algorithm) -> Result<DecodingKey, String> {
    let family_ok = matches!(
        (&jwk.algorithm, alg),
        (
            AlgorithmParameters::RSA(_),
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512
        ) | (
            AlgorithmParameters::EllipticCurve(_),
            Algorithm::ES256 | Algorithm::ES384
        ) | (AlgorithmParameters::OctetKeyPair(_), Algorithm::EdDSA)
    );
    if !family_ok {
        return Err("the key's type does not match the algorithm".to_owned());
    }
    if let Some(key_alg) = jwk.common.key_algorithm
        && jsonwebtoken::jwk::KeyAlgorithm::from(alg) != key_alg
    {
        return Err(format!("the key is for {key_alg:?}"));
    }
    DecodingKey::from_jwk(jwk).map_err(|e| format!("unusable key: {e}"))
}

/// Follows a dotted path (`realm_access.roles`) into the claims; a claim whose own name contains
/// dots is found first.
fn claim_path<'a>(claims: &'a Value, path: &str) -> Option<&'a Value> {
    if let Some(v) = claims.get(path) {
        return Some(v);
    }
    path.split('.').try_fold(claims, |v, key| v.get(key))
}

/// The strings of a claim: an array's string elements, or a space-separated string.
fn strings(value: &Value) -> Vec<&str> {
    match value {
        Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
        Value::String(s) => s.split_whitespace().collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    use super::*;
    use crate::role::Permission;

    const ISS: &str = "https://idp.test/realms/phrony";
    const AUD: &str = "phrony-runtime";

    /// A freshly generated signing key with its public JWK.
    struct TestKey {
        alg: Algorithm,
        kid: String,
        encoding: EncodingKey,
        jwk: Value,
    }

    impl TestKey {
        fn ec(kid: &str) -> Self {
            let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            let raw = kp.public_key_raw();
            assert_eq!(raw.len(), 65);
            Self {
                alg: Algorithm::ES256,
                kid: kid.into(),
                encoding: EncodingKey::from_ec_der(&kp.serialize_der()),
                jwk: json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
                    "x": URL_SAFE_NO_PAD.encode(&raw[1..33]), "y": URL_SAFE_NO_PAD.encode(&raw[33..])}),
            }
        }

        fn ed(kid: &str) -> Self {
            let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
            Self {
                alg: Algorithm::EdDSA,
                kid: kid.into(),
                encoding: EncodingKey::from_ed_der(&kp.serialize_der()),
                jwk: json!({"kty": "OKP", "crv": "Ed25519", "kid": kid,
                    "x": URL_SAFE_NO_PAD.encode(kp.public_key_raw())}),
            }
        }

        fn sign(&self, claims: &Value) -> String {
            let mut header = Header::new(self.alg);
            header.kid = Some(self.kid.clone());
            jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
        }
    }

    fn jwks(keys: &[&TestKey]) -> JwkSet {
        serde_json::from_value(
            json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}),
        )
        .unwrap()
    }

    fn now() -> i64 {
        i64::try_from(jsonwebtoken::get_current_timestamp()).unwrap()
    }

    fn claims() -> Value {
        json!({"iss": ISS, "aud": AUD, "sub": "alice@example.com", "exp": now() + 300,
            "iat": now(), "roles": ["approver", "viewer"]})
    }

    fn verifier() -> OidcVerifier {
        OidcVerifier::new(OidcConfig::new(ISS, AUD))
    }

    fn with(mut claims: Value, key: &str, value: Value) -> Value {
        claims[key] = value;
        claims
    }

    #[test]
    fn a_valid_token_becomes_an_oidc_principal_with_its_roles() {
        for key in [TestKey::ec("ec-1"), TestKey::ed("ed-1")] {
            let set = jwks(&[&key]);
            let v = verifier().verify(&key.sign(&claims()), &set).unwrap();
            assert_eq!(v.principal.name, "alice@example.com");
            assert_eq!(v.principal.verification, Verification::Oidc);
            assert_eq!(
                v.principal.roles,
                BTreeSet::from([Role::Approver, Role::Viewer])
            );
            assert!(v.principal.permits(Permission::Approve));
            assert!(!v.principal.permits(Permission::Publish));
            assert!(v.ignored.is_empty());
        }
    }

    #[test]
    fn each_failure_has_its_own_reason() {
        let key = TestKey::ec("k1");
        let other = TestKey::ec("k1");
        let set = jwks(&[&key]);
        let v = verifier();
        let check = |token: String, want: &dyn Fn(&OidcRejection) -> bool| {
            let err = v.verify(&token, &set).unwrap_err();
            assert!(want(&err), "unexpected rejection: {err}");
            let auth: AuthError = err.into();
            assert!(matches!(auth, AuthError::Rejected { .. }));
        };
        check(
            key.sign(&with(claims(), "exp", json!(now() - 3600))),
            &|e| *e == OidcRejection::Expired,
        );
        check(
            key.sign(&with(claims(), "nbf", json!(now() + 3600))),
            &|e| *e == OidcRejection::NotYetValid,
        );
        check(
            key.sign(&with(claims(), "aud", json!("someone-else"))),
            &|e| matches!(e, OidcRejection::WrongAudience { .. }),
        );
        check(
            key.sign(&with(claims(), "iss", json!("https://evil.test"))),
            &|e| matches!(e, OidcRejection::WrongIssuer { .. }),
        );
        // Same kid, a different key: the signature does not verify.
        check(other.sign(&claims()), &|e| {
            *e == OidcRejection::BadSignature
        });
        check(TestKey::ec("k2").sign(&claims()), &|e| {
            *e == OidcRejection::UnknownKeyId { kid: "k2".into() }
        });
        let mut no_sub = claims();
        no_sub.as_object_mut().unwrap().remove("sub");
        check(key.sign(&no_sub), &|e| {
            matches!(e, OidcRejection::BadClaim { .. })
        });
        let mut no_exp = claims();
        no_exp.as_object_mut().unwrap().remove("exp");
        check(key.sign(&no_exp), &|e| {
            matches!(e, OidcRejection::BadClaim { .. })
        });
        // A tampered payload keeps the signature of the original one.
        let token = key.sign(&claims());
        let parts: Vec<&str> = token.split('.').collect();
        let forged = URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&with(claims(), "roles", json!(["admin"]))).unwrap());
        check(format!("{}.{forged}.{}", parts[0], parts[2]), &|e| {
            *e == OidcRejection::BadSignature
        });
    }

    #[test]
    fn the_leeway_tolerates_small_clock_skew() {
        let key = TestKey::ed("k");
        let set = jwks(&[&key]);
        let token = key.sign(&with(claims(), "exp", json!(now() - 10)));
        assert!(verifier().verify(&token, &set).is_ok());
        let strict = OidcVerifier::new(OidcConfig {
            leeway_secs: 0,
            ..OidcConfig::new(ISS, AUD)
        });
        assert_eq!(
            strict.verify(&token, &set).unwrap_err(),
            OidcRejection::Expired
        );
    }

    #[test]
    fn none_and_hmac_algorithms_are_refused() {
        let key = TestKey::ec("k");
        let set = jwks(&[&key]);
        let b64 = |v: Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(&v).unwrap());
        let none = format!(
            "{}.{}.",
            b64(json!({"alg": "none", "kid": "k"})),
            b64(claims())
        );
        assert!(matches!(
            verifier().verify(&none, &set).unwrap_err(),
            OidcRejection::Malformed { .. }
        ));
        // An HS256 token signed with a secret, whatever the JWKS says.
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k".into());
        let hs = jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_secret(b"s").unwrap())
            .unwrap();
        assert_eq!(
            verifier().verify(&hs, &set).unwrap_err(),
            OidcRejection::SymmetricAlgorithm {
                alg: "HS256".into()
            }
        );
        // A symmetric key in the JWKS is not usable for an asymmetric alg either.
        let oct: JwkSet = serde_json::from_value(json!({"keys": [
            {"kty": "oct", "kid": "k", "k": URL_SAFE_NO_PAD.encode(b"secret")}]}))
        .unwrap();
        assert!(matches!(
            verifier().verify(&key.sign(&claims()), &oct).unwrap_err(),
            OidcRejection::KeyMismatch { .. }
        ));
        // An EC token against an OKP key with the same kid.
        let ed = TestKey::ed("k");
        assert!(matches!(
            verifier()
                .verify(&key.sign(&claims()), &jwks(&[&ed]))
                .unwrap_err(),
            OidcRejection::KeyMismatch { .. }
        ));
        let mut no_kid = Header::new(Algorithm::ES256);
        no_kid.kid = None;
        let t = jsonwebtoken::encode(&no_kid, &claims(), &key.encoding).unwrap();
        assert_eq!(
            verifier().verify(&t, &set).unwrap_err(),
            OidcRejection::MissingKeyId
        );
        assert!(matches!(
            verifier().verify("not a jwt", &set).unwrap_err(),
            OidcRejection::Malformed { .. }
        ));
        let long = "a".repeat(MAX_JWT_BYTES + 1);
        assert!(matches!(
            verifier().verify(&long, &set).unwrap_err(),
            OidcRejection::TooLong { .. }
        ));
    }

    #[test]
    fn roles_come_from_a_dotted_claim_and_unknown_ones_are_ignored_with_a_reason() {
        let key = TestKey::ec("k");
        let set = jwks(&[&key]);
        let v = OidcVerifier::new(OidcConfig {
            roles_claim: "realm_access.roles".into(),
            ..OidcConfig::new(ISS, AUD)
        });
        let mut c = claims();
        c.as_object_mut().unwrap().remove("roles");
        c["realm_access"] = json!({"roles": ["worker", "offline_access", "root"]});
        c[TOOLS_CLAIM] = json!(["payments.*@1.*", "bad pattern"]);
        c[ROUTES_CLAIM] = json!(["finance"]);
        let out = v.verify(&key.sign(&c), &set).unwrap();
        assert_eq!(out.principal.roles, BTreeSet::from([Role::Worker]));
        assert!(out.principal.may_serve("payments.issue-refund", "1.2.0"));
        assert!(!out.principal.may_serve("payments.issue-refund", "2.0.0"));
        assert_eq!(out.principal.routes, vec!["finance".to_owned()]);
        assert_eq!(out.ignored.len(), 3, "{:?}", out.ignored);
        assert!(out.ignored.iter().any(|i| i.contains("\"offline_access\"")));
        assert!(out.ignored.iter().any(|i| i.contains("bad pattern")));
        // No roles claim at all: a principal with no roles (authenticated, permitted nothing).
        let bare = verifier().verify(&key.sign(&c), &set).unwrap();
        assert!(bare.principal.roles.is_empty());
        // A space-separated string works too.
        let s = key.sign(&with(claims(), "roles", json!("runner viewer")));
        let p = verifier().verify(&s, &set).unwrap().principal;
        assert_eq!(p.roles, BTreeSet::from([Role::Runner, Role::Viewer]));
        assert_eq!(OidcVerifier::key_id(&s).as_deref(), Some("k"));
    }
}
