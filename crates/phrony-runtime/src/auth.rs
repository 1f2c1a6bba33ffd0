//! Who may call the daemon: the auth mode (`RUNTIME_AUTH`) and the composite authenticator the
//! gRPC edge asks on every RPC.
//!
//! - **`local`** (the default while the daemon listens on a loopback address and no
//!   authentication is configured): nobody is verified; every caller is an unverified principal
//!   (`phrony_auth::Unauthenticated`) and the daemon warns once at start-up.
//! - **`required`**: every RPC of the Runtime service needs a credential (health and
//!   reflection do not). A daemon bound to a non-loopback address refuses to start in any other
//!   mode.
//!
//! [`Composite`] tries, in order: a bearer starting `phr_` → the API token store
//! ([`TokenStore`], looked up by hash on every RPC, so a revocation or an expiry takes effect on
//! the next call); any other bearer → OIDC when configured, else `unknown token`; no bearer but
//! a verified client-certificate subject → the mTLS mapping when configured; nothing →
//! [`AuthError::Missing`]. (The OIDC and mTLS arms are wired by the transport configuration.)

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use clap::ValueEnum;
use phrony_auth::{
    AuthError, AuthFuture, Authenticator, Credentials, Principal, TOKEN_PREFIX, TokenSecret,
    Unauthenticated, Verification,
};
use phrony_ledger::Ledger;

/// `RUNTIME_AUTH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// Nobody is verified (loopback only); identities are recorded as unverified.
    Local,
    /// Every RPC needs a credential.
    Required,
}

impl AuthMode {
    /// The name as `RUNTIME_AUTH` takes it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Required => "required",
        }
    }
}

/// A daemon that would serve unauthenticated on a non-loopback address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing to serve {addr} without authentication: it is not a loopback address; set \
     RUNTIME_AUTH=required (and create tokens with `phrony-runtime tokens create`), or bind \
     127.0.0.1"
)]
pub struct UnsafeBind {
    /// The bound address.
    pub addr: SocketAddr,
}

/// The mode the daemon runs in: `requested` (`RUNTIME_AUTH`) if given, else `required` when
/// other authentication is configured (`auth_configured`: OIDC, mTLS), else `local`. A
/// non-loopback `bound` address needs `required`.
///
/// # Errors
/// [`UnsafeBind`] for `local` on a non-loopback address.
pub fn resolve_mode(
    requested: Option<AuthMode>,
    auth_configured: bool,
    bound: SocketAddr,
) -> Result<AuthMode, UnsafeBind> {
    let mode = requested.unwrap_or(if auth_configured {
        AuthMode::Required
    } else {
        AuthMode::Local
    });
    if mode == AuthMode::Local && !bound.ip().is_loopback() {
        return Err(UnsafeBind { addr: bound });
    }
    Ok(mode)
}

/// The API token arm: a `phr_…` bearer, looked up by its hash in the ledger on every call.
#[derive(Clone)]
pub struct TokenStore {
    ledger: Ledger,
    now: Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>,
}

impl std::fmt::Debug for TokenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenStore").finish_non_exhaustive()
    }
}

impl TokenStore {
    /// Tokens of `ledger`, expiring by the system clock.
    #[must_use]
    pub fn new(ledger: Ledger) -> Self {
        Self::with_clock(ledger, Arc::new(Utc::now))
    }

    /// Tokens of `ledger`, expiring by `now` (tests).
    #[must_use]
    pub fn with_clock(ledger: Ledger, now: Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>) -> Self {
        Self { ledger, now }
    }

    /// The principal of `bearer`.
    ///
    /// # Errors
    /// `Malformed` (not a token secret), `UnknownToken`, `Revoked`, `Expired`, or
    /// `Unavailable` when the ledger cannot be read.
    pub async fn verify(&self, bearer: &str) -> Result<Principal, AuthError> {
        let secret = TokenSecret::parse(bearer).map_err(|e| AuthError::Malformed {
            reason: e.to_string(),
        })?;
        let token = self
            .ledger
            .find_api_token_by_hash(&secret.hash())
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "cannot read the API token store");
                AuthError::Unavailable {
                    reason: "the token store cannot be read".to_owned(),
                }
            })?
            .ok_or(AuthError::UnknownToken)?;
        if token.revoked_at.is_some() {
            return Err(AuthError::Revoked { name: token.name });
        }
        if let Some(expires_at) = token.expires_at
            && expires_at <= (self.now)()
        {
            return Err(AuthError::Expired {
                name: token.name,
                expired_at: expires_at.to_rfc3339_opts(SecondsFormat::Secs, true),
            });
        }
        Ok(Principal {
            name: token.name,
            verification: Verification::Token,
            roles: token.roles.into_iter().collect::<BTreeSet<_>>(),
            routes: token.routes,
            tools: token.tools,
        })
    }
}

/// The authenticator of `required` mode (see the module docs for the order of the arms).
#[derive(Clone, Default)]
pub struct Composite {
    /// API tokens (`phr_…` bearers).
    pub tokens: Option<TokenStore>,
    /// Other bearers (OIDC JWTs), when configured.
    pub oidc: Option<Arc<dyn Authenticator>>,
    /// Client-certificate subjects (mTLS), when configured.
    pub mtls: Option<Arc<dyn Authenticator>>,
}

impl std::fmt::Debug for Composite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Composite")
            .field("tokens", &self.tokens.is_some())
            .field("oidc", &self.oidc.is_some())
            .field("mtls", &self.mtls.is_some())
            .finish()
    }
}

impl Authenticator for Composite {
    fn authenticate<'a>(&'a self, credentials: Credentials<'a>) -> AuthFuture<'a> {
        Box::pin(async move {
            match (credentials.bearer, credentials.peer_subject) {
                (Some(bearer), _) if bearer.starts_with(TOKEN_PREFIX) => match &self.tokens {
                    Some(tokens) => tokens.verify(bearer).await,
                    None => Err(AuthError::UnknownToken),
                },
                (Some(_), _) => match &self.oidc {
                    Some(oidc) => oidc.authenticate(credentials).await,
                    None => Err(AuthError::UnknownToken),
                },
                (None, Some(_)) => match &self.mtls {
                    Some(mtls) => mtls.authenticate(credentials).await,
                    None => Err(AuthError::Missing),
                },
                (None, None) => Err(AuthError::Missing),
            }
        })
    }
}

/// The authenticator the edge uses in `mode`: [`Unauthenticated`] (recording `default_actor`
/// when a request names nobody) or a [`Composite`] over the ledger's token store.
///
/// In `required` mode the OIDC and mTLS arms are the configured ones, if any.
#[must_use]
pub fn authenticator(
    mode: AuthMode,
    ledger: &Ledger,
    default_actor: &str,
    oidc: Option<Arc<dyn Authenticator>>,
    mtls: Option<Arc<dyn Authenticator>>,
) -> Arc<dyn Authenticator> {
    match mode {
        AuthMode::Local => Arc::new(Unauthenticated {
            default_actor: default_actor.to_owned(),
        }),
        AuthMode::Required => Arc::new(Composite {
            tokens: Some(TokenStore::new(ledger.clone())),
            oidc,
            mtls,
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn local_is_the_loopback_default_and_refused_elsewhere() {
        let lo: SocketAddr = "127.0.0.1:7777".parse().unwrap();
        let lo6: SocketAddr = "[::1]:7777".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7777".parse().unwrap();
        assert_eq!(resolve_mode(None, false, lo), Ok(AuthMode::Local));
        assert_eq!(resolve_mode(None, false, lo6), Ok(AuthMode::Local));
        assert_eq!(resolve_mode(None, true, lo), Ok(AuthMode::Required));
        assert_eq!(
            resolve_mode(Some(AuthMode::Required), false, any),
            Ok(AuthMode::Required)
        );
        let err = resolve_mode(None, false, any).unwrap_err();
        let line = err.to_string();
        assert!(line.contains("RUNTIME_AUTH=required"), "{line}");
        assert!(!line.contains('\n'), "one line: {line}");
        assert!(resolve_mode(Some(AuthMode::Local), false, any).is_err());
    }

    #[tokio::test]
    async fn the_composite_routes_each_credential_to_its_arm() {
        assert_eq!(
            Composite::default()
                .authenticate(Credentials::default())
                .await
                .unwrap_err(),
            AuthError::Missing
        );
        assert_eq!(
            Composite::default()
                .authenticate(Credentials {
                    bearer: Some("phr_x"),
                    peer_subject: None,
                })
                .await
                .unwrap_err(),
            AuthError::UnknownToken,
            "no token store: unknown"
        );
        assert_eq!(
            Composite::default()
                .authenticate(Credentials {
                    bearer: Some("eyJhbGciOiJSUzI1NiJ9.e30.sig"),
                    peer_subject: None,
                })
                .await
                .unwrap_err(),
            AuthError::UnknownToken,
            "a JWT without OIDC configured is an unknown token"
        );
    }
}
