//! Test certificates generated at test time (rcgen): a CA, a server certificate for
//! `localhost` / `127.0.0.1`, and client certificates with a chosen subject CN for mutual TLS.
//! Nothing is checked in; every run has fresh keys. [`TestIssuer`] is an OIDC issuer's key with
//! its JWKS, minting the JWTs a test sends.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// The PKCS#8 private key.
    pub key: String,
}

impl Pem {
    /// Writes `<name>.crt` and `<name>.key` into `dir`; returns their paths.
    ///
    /// # Panics
    /// When the files cannot be written.
    #[must_use]
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert).unwrap_or_else(|e| panic!("{}: {e}", cert.display()));
        std::fs::write(&key, &self.key).unwrap_or_else(|e| panic!("{}: {e}", key.display()));
        (cert, key)
    }
}

/// A throw-away certificate authority.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

fn dn(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "phrony tests");
    dn.push(DnType::CommonName, cn);
    dn
}

impl TestCa {
    /// A new CA named `name`.
    ///
    /// # Panics
    /// When key generation fails.
    #[must_use]
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new())
            .unwrap_or_else(|e| panic!("CA params: {e}"));
        params.distinguished_name = dn(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let issuer =
            CertifiedIssuer::self_signed(params, key).unwrap_or_else(|e| panic!("CA cert: {e}"));
        Self { issuer }
    }

    /// The CA certificate, PEM.
    #[must_use]
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes the CA certificate to `dir/<name>.crt`.
    ///
    /// # Panics
    /// When the file cannot be written.
    #[must_use]
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.crt"));
        std::fs::write(&path, self.cert_pem())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }

    fn issue(&self, cn: &str, sans: Vec<String>, usage: ExtendedKeyUsagePurpose) -> Pem {
        let mut params =
            CertificateParams::new(sans).unwrap_or_else(|e| panic!("cert params: {e}"));
        params.distinguished_name = dn(cn);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("key: {e}"));
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("signing: {e}"));
        Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate for `localhost` and `127.0.0.1`.
    #[must_use]
    pub fn server(&self) -> Pem {
        self.issue(
            "phrony-runtime",
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate whose subject CN is `cn`.
    #[must_use]
    pub fn client(&self, cn: &str) -> Pem {
        self.issue(cn, Vec::new(), ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// A throw-away OIDC issuer: an ES256 key with a `kid`, its JWKS, and tokens minted with it.
pub struct TestIssuer {
    kid: String,
    key: jsonwebtoken::EncodingKey,
    jwk: serde_json::Value,
}

impl std::fmt::Debug for TestIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestIssuer")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl TestIssuer {
    /// A fresh key named `kid`.
    ///
    /// # Panics
    /// When key generation fails.
    #[must_use]
    pub fn new(kid: &str) -> Self {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let pair = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .unwrap_or_else(|e| panic!("EC key: {e}"));
        let raw = pair.public_key_raw();
        Self {
            kid: kid.to_owned(),
            key: jsonwebtoken::EncodingKey::from_ec_der(&pair.serialize_der()),
            jwk: serde_json::json!({"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig",
                "kid": kid, "x": b64(&raw[1..33]), "y": b64(&raw[33..])}),
        }
    }

    /// The JWKS document of `issuers`' keys.
    #[must_use]
    pub fn jwks(issuers: &[&Self]) -> String {
        serde_json::json!({"keys": issuers.iter().map(|i| i.jwk.clone()).collect::<Vec<_>>()})
            .to_string()
    }

    /// A JWT with these claims, signed with this key (header `alg: ES256`, this `kid`).
    ///
    /// # Panics
    /// When signing fails.
    #[must_use]
    pub fn token(&self, claims: &serde_json::Value) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.key).unwrap_or_else(|e| panic!("sign: {e}"))
    }
}
