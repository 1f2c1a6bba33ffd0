//! OIDC bearer JWTs: the configuration (`RUNTIME_OIDC_ISSUER`, `RUNTIME_OIDC_AUDIENCE`,
//! `RUNTIME_OIDC_JWKS`, `RUNTIME_OIDC_ROLES_CLAIM`, `RUNTIME_OIDC_JWKS_REFRESH`), the issuer's
//! JWKS (fetched over HTTPS, or read from a file) and [`OidcAuthenticator`].
//!
//! - The JWKS is loaded once at start-up (a failure stops the daemon with one line naming the
//!   variable and the source) and cached.
//! - A token whose `kid` is not in the cached JWKS (the issuer rotated its keys) reloads the
//!   JWKS, but at most once per refresh interval (`RUNTIME_OIDC_JWKS_REFRESH`, default 60 s,
//!   counted from the previous attempt whether it succeeded or not), and concurrent requests
//!   share one reload: a flood of tokens with made-up key ids costs at most one fetch per
//!   interval. A failed reload keeps the previous keys.
//! - `http://` JWKS URLs are accepted only for loopback hosts (tests, a local IdP); anything
//!   else must be `https://`. A response is at most [`MAX_JWKS_BYTES`] and must arrive within
//!   10 s.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use phrony_auth::oidc::{DEFAULT_ROLES_CLAIM, OidcConfig, OidcRejection, OidcVerifier};
use phrony_auth::{AuthError, AuthFuture, Authenticator, Credentials, Principal};
use tokio::sync::{Mutex, RwLock};

use crate::config::Settings;

/// The largest JWKS document read (bytes).
pub const MAX_JWKS_BYTES: usize = 1 << 20;
/// `RUNTIME_OIDC_JWKS_REFRESH` when unset.
pub const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(60);
/// How long a JWKS fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the JWKS comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// Fetched with an HTTP GET.
    Url(reqwest::Url),
    /// Read from a file.
    File(PathBuf),
}

impl JwksSource {
    /// Parses `RUNTIME_OIDC_JWKS`: an `https://` URL (`http://` only for a loopback host) or a
    /// file path.
    ///
    /// # Errors
    /// A URL that does not parse, or plain HTTP to a host that is not loopback.
    pub fn parse(text: &str) -> Result<Self, String> {
        let lower = text.to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            return Ok(Self::File(PathBuf::from(text)));
        }
        let url = reqwest::Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
        if url.scheme() == "http" {
            let loopback = match url.host() {
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                None => false,
            };
            if !loopback {
                return Err(
                    "plain http:// is only accepted for a loopback host; use https://".to_owned(),
                );
            }
        }
        Ok(Self::Url(url))
    }
}

impl std::fmt::Display for JwksSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url(u) => write!(f, "{u}"),
            Self::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The validated OIDC settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcSettings {
    /// What tokens are checked against.
    pub config: OidcConfig,
    /// Where the keys come from.
    pub jwks: JwksSource,
    /// The shortest time between two reloads caused by an unknown key id.
    pub refresh: Duration,
}

impl Settings {
    /// The OIDC settings; `None` when none of issuer, audience and JWKS is set.
    ///
    /// # Errors
    /// One line naming the variable: a partial configuration, a bad JWKS URL or refresh value.
    pub(crate) fn oidc(&self) -> anyhow::Result<Option<OidcSettings>> {
        let set = |v: &Option<String>| v.clone().filter(|s| !s.trim().is_empty());
        let (issuer, audience, jwks) = (
            set(&self.oidc_issuer),
            set(&self.oidc_audience),
            set(&self.oidc_jwks),
        );
        if issuer.is_none() && audience.is_none() && jwks.is_none() {
            if set(&self.oidc_roles_claim).is_some() {
                anyhow::bail!("RUNTIME_OIDC_ROLES_CLAIM is set but RUNTIME_OIDC_ISSUER is not");
            }
            return Ok(None);
        }
        let need = |v: Option<String>, var: &str| {
            v.ok_or_else(|| {
                anyhow::anyhow!(
                    "OIDC needs RUNTIME_OIDC_ISSUER, RUNTIME_OIDC_AUDIENCE and RUNTIME_OIDC_JWKS; \
                     {var} is not set"
                )
            })
        };
        let issuer = need(issuer, "RUNTIME_OIDC_ISSUER")?;
        let audience = need(audience, "RUNTIME_OIDC_AUDIENCE")?;
        let jwks_text = need(jwks, "RUNTIME_OIDC_JWKS")?;
        let jwks = JwksSource::parse(&jwks_text)
            .map_err(|e| anyhow::anyhow!("invalid RUNTIME_OIDC_JWKS {jwks_text:?}: {e}"))?;
        let refresh = crate::workers::duration(
            "RUNTIME_OIDC_JWKS_REFRESH",
            self.oidc_jwks_refresh.as_deref(),
            DEFAULT_JWKS_REFRESH,
        )?;
        let mut config = OidcConfig::new(issuer, audience);
        config.roles_claim =
            set(&self.oidc_roles_claim).unwrap_or_else(|| DEFAULT_ROLES_CLAIM.to_owned());
        Ok(Some(OidcSettings {
            config,
            jwks,
            refresh,
        }))
    }
}

#[derive(Debug)]
struct Cache {
    jwks: Arc<JwkSet>,
    /// When the last load was attempted (successful or not).
    attempted_at: Instant,
    /// Bumped on every attempt, so a request that waited for a reload does not start another.
    generation: u64,
}

/// Verifies OIDC bearer JWTs against the issuer's (cached, bounded-refresh) JWKS.
#[derive(Debug)]
pub struct OidcAuthenticator {
    verifier: OidcVerifier,
    source: JwksSource,
    refresh: Duration,
    http: reqwest::Client,
    cache: RwLock<Cache>,
    reload: Mutex<()>,
}

impl OidcAuthenticator {
    /// Loads the JWKS and builds the authenticator.
    ///
    /// # Errors
    /// One line naming `RUNTIME_OIDC_JWKS` and the source when the JWKS cannot be loaded.
    pub async fn load(settings: OidcSettings) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the HTTP client for the JWKS: {e}"))?;
        let jwks = fetch(&http, &settings.jwks)
            .await
            .map_err(|e| anyhow::anyhow!("RUNTIME_OIDC_JWKS {}: {e}", settings.jwks))?;
        tracing::info!(
            issuer = %settings.config.issuer,
            keys = jwks.keys.len(),
            "OIDC: bearer JWTs from {} accepted",
            settings.config.issuer
        );
        Ok(Self {
            verifier: OidcVerifier::new(settings.config),
            source: settings.jwks,
            refresh: settings.refresh,
            http,
            cache: RwLock::new(Cache {
                jwks: Arc::new(jwks),
                attempted_at: Instant::now(),
                generation: 0,
            }),
            reload: Mutex::new(()),
        })
    }

    /// Verifies a bearer JWT, reloading the JWKS (bounded) when its key id is unknown.
    ///
    /// # Errors
    /// [`AuthError::Rejected`] with the verifier's reason.
    pub async fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let (jwks, generation) = {
            let cache = self.cache.read().await;
            (Arc::clone(&cache.jwks), cache.generation)
        };
        let verified = match self.verifier.verify(token, &jwks) {
            Err(OidcRejection::UnknownKeyId { .. }) => {
                let jwks = self.reload_if_due(generation).await;
                self.verifier.verify(token, &jwks)
            }
            other => other,
        };
        match verified {
            Ok(v) => {
                for ignored in &v.ignored {
                    tracing::debug!(subject = %v.principal.name, %ignored, "OIDC claim ignored");
                }
                Ok(v.principal)
            }
            Err(rejection) => Err(rejection.into()),
        }
    }

    /// Reloads the JWKS unless another request already did since `seen`, or the last attempt
    /// is more recent than the refresh interval; returns the keys to use.
    async fn reload_if_due(&self, seen: u64) -> Arc<JwkSet> {
        let _one_at_a_time = self.reload.lock().await;
        {
            let cache = self.cache.read().await;
            if cache.generation != seen || cache.attempted_at.elapsed() < self.refresh {
                return Arc::clone(&cache.jwks);
            }
        }
        let result = fetch(&self.http, &self.source).await;
        let mut cache = self.cache.write().await;
        cache.attempted_at = Instant::now();
        cache.generation += 1;
        match result {
            Ok(jwks) => {
                tracing::info!(keys = jwks.keys.len(), source = %self.source, "OIDC JWKS reloaded");
                cache.jwks = Arc::new(jwks);
            }
            Err(e) => {
                tracing::warn!(source = %self.source, error = %e, "OIDC JWKS reload failed; keeping the previous keys");
            }
        }
        Arc::clone(&cache.jwks)
    }
}

impl Authenticator for OidcAuthenticator {
    fn authenticate<'a>(&'a self, credentials: Credentials<'a>) -> AuthFuture<'a> {
        Box::pin(async move {
            match credentials.bearer {
                Some(token) => self.verify(token).await,
                None => Err(AuthError::Missing),
            }
        })
    }
}

/// Loads a JWKS document from its source, bounded in size (and time, for a URL).
async fn fetch(http: &reqwest::Client, source: &JwksSource) -> Result<JwkSet, String> {
    let bytes = match source {
        JwksSource::File(path) => {
            let path = path.clone();
            tokio::task::spawn_blocking(move || read_bounded(&path))
                .await
                .map_err(|e| format!("reading the file failed: {e}"))??
        }
        JwksSource::Url(url) => {
            let mut response = http
                .get(url.clone())
                .header("accept", "application/json")
                .send()
                .await
                .map_err(|e| format!("cannot fetch: {e}"))?;
            if !response.status().is_success() {
                return Err(format!("the server answered {}", response.status()));
            }
            let mut body = Vec::new();
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|e| format!("cannot read the response: {e}"))?
            {
                if body.len() + chunk.len() > MAX_JWKS_BYTES {
                    return Err(format!(
                        "the response is larger than {MAX_JWKS_BYTES} bytes"
                    ));
                }
                body.extend_from_slice(&chunk);
            }
            body
        }
    };
    serde_json::from_slice::<JwkSet>(&bytes).map_err(|e| format!("not a JWKS document: {e}"))
}

fn read_bounded(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_JWKS_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() > MAX_JWKS_BYTES {
        return Err(format!("larger than {MAX_JWKS_BYTES} bytes"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    use serde_json::{Value, json};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    const ISS: &str = "https://idp.test";
    const AUD: &str = "phrony";

    struct Key {
        kid: String,
        encoding: EncodingKey,
        jwk: Value,
    }

    fn key(kid: &str) -> Key {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = kp.public_key_raw();
        Key {
            kid: kid.into(),
            encoding: EncodingKey::from_ec_der(&kp.serialize_der()),
            jwk: json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256",
                "x": URL_SAFE_NO_PAD.encode(&raw[1..33]), "y": URL_SAFE_NO_PAD.encode(&raw[33..])}),
        }
    }

    fn jwks(keys: &[&Key]) -> String {
        json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}).to_string()
    }

    fn token(key: &Key, claims: Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(key.kid.clone());
        jsonwebtoken::encode(&header, &claims, &key.encoding).unwrap()
    }

    fn claims() -> Value {
        let now = jsonwebtoken::get_current_timestamp();
        json!({"iss": ISS, "aud": AUD, "sub": "carol", "exp": now + 300, "roles": ["runner"]})
    }

    fn settings(source: JwksSource, refresh: Duration) -> OidcSettings {
        OidcSettings {
            config: OidcConfig::new(ISS, AUD),
            jwks: source,
            refresh,
        }
    }

    fn bearer(t: &str) -> Credentials<'_> {
        Credentials {
            bearer: Some(t),
            peer_subject: None,
        }
    }

    #[tokio::test]
    async fn a_local_jwks_file_verifies_tokens_and_each_failure_is_unauthenticated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        let k1 = key("k1");
        std::fs::write(&path, jwks(&[&k1])).unwrap();
        let auth = OidcAuthenticator::load(settings(
            JwksSource::File(path.clone()),
            Duration::from_secs(3600),
        ))
        .await
        .unwrap();
        let p = auth
            .authenticate(bearer(&token(&k1, claims())))
            .await
            .unwrap();
        assert_eq!(p.name, "carol");
        assert_eq!(p.verification, phrony_auth::Verification::Oidc);
        let now = jsonwebtoken::get_current_timestamp();
        let mut expired = claims();
        expired["exp"] = json!(now - 3600);
        let mut wrong_aud = claims();
        wrong_aud["aud"] = json!("other");
        let mut wrong_iss = claims();
        wrong_iss["iss"] = json!("https://evil.test");
        let impostor = key("k1");
        for (t, want) in [
            (token(&k1, expired), "expired"),
            (token(&k1, wrong_aud), "wrong audience"),
            (token(&k1, wrong_iss), "wrong issuer"),
            (token(&impostor, claims()), "bad signature"),
            (token(&key("k9"), claims()), "unknown key id"),
        ] {
            let err = auth.authenticate(bearer(&t)).await.unwrap_err();
            assert!(matches!(err, AuthError::Rejected { .. }), "{err}");
            assert!(err.to_string().contains(want), "{want}: {err}");
        }
        assert_eq!(
            auth.authenticate(Credentials::default()).await.unwrap_err(),
            AuthError::Missing
        );
    }

    #[tokio::test]
    async fn a_bad_jwks_source_stops_start_up_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, "not json").unwrap();
        let err = OidcAuthenticator::load(settings(JwksSource::File(path), DEFAULT_JWKS_REFRESH))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("RUNTIME_OIDC_JWKS") && err.contains("jwks.json"),
            "{err}"
        );
        assert!(err.contains("not a JWKS document"), "{err}");
        let missing = dir.path().join("missing.json");
        let err =
            OidcAuthenticator::load(settings(JwksSource::File(missing), DEFAULT_JWKS_REFRESH))
                .await
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("missing.json") && err.contains("cannot read"),
            "{err}"
        );
        assert!(JwksSource::parse("http://idp.example.com/jwks").is_err());
        assert!(matches!(
            JwksSource::parse("http://127.0.0.1:9/jwks"),
            Ok(JwksSource::Url(_))
        ));
        assert!(matches!(
            JwksSource::parse("https://idp.example.com/jwks"),
            Ok(JwksSource::Url(_))
        ));
        assert_eq!(
            JwksSource::parse("/etc/phrony/jwks.json").unwrap(),
            JwksSource::File("/etc/phrony/jwks.json".into())
        );
    }

    /// Serves `body()` over HTTP/1.1 on 127.0.0.1, counting requests.
    async fn jwks_server(body: Arc<std::sync::Mutex<String>>, hits: Arc<AtomicUsize>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                hits.fetch_add(1, Ordering::SeqCst);
                let text = body.lock().unwrap().clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                        text.len()
                    );
                    let _ = sock.write_all(response.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        format!("http://{addr}/jwks")
    }

    #[tokio::test]
    async fn unknown_key_ids_reload_the_jwks_at_most_once_per_interval() {
        let k1 = key("k1");
        let k2 = key("k2");
        let body = Arc::new(std::sync::Mutex::new(jwks(&[&k1])));
        let hits = Arc::new(AtomicUsize::new(0));
        let url = jwks_server(Arc::clone(&body), Arc::clone(&hits)).await;
        let source = JwksSource::parse(&url).unwrap();

        // A long interval: a flood of unknown kids costs no fetch beyond the first load.
        let auth = Arc::new(
            OidcAuthenticator::load(settings(source.clone(), Duration::from_secs(3600)))
                .await
                .unwrap(),
        );
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        let mut flood = Vec::new();
        for i in 0..50 {
            let auth = Arc::clone(&auth);
            let t = token(&key(&format!("made-up-{i}")), claims());
            flood.push(tokio::spawn(async move { auth.verify(&t).await }));
        }
        for f in flood {
            assert!(f.await.unwrap().is_err());
        }
        assert_eq!(
            hits.load(Ordering::SeqCst),
            1,
            "no fetch within the interval"
        );

        // A zero interval: the issuer rotates to k2; the first k2 token reloads and passes,
        // concurrent ones share that reload.
        let auth = Arc::new(
            OidcAuthenticator::load(settings(source, Duration::ZERO))
                .await
                .unwrap(),
        );
        assert_eq!(hits.load(Ordering::SeqCst), 2);
        *body.lock().unwrap() = jwks(&[&k1, &k2]);
        let p = auth.verify(&token(&k2, claims())).await.unwrap();
        assert_eq!(p.name, "carol");
        assert_eq!(hits.load(Ordering::SeqCst), 3);
        // Now known: no further fetch.
        auth.verify(&token(&k2, claims())).await.unwrap();
        assert_eq!(hits.load(Ordering::SeqCst), 3);
    }
}
