//! The authenticator contract: what the gRPC edge hands over from a request, and what comes back.
//!
//! The edge extracts [`Credentials`] from each request (the `authorization: Bearer …` header and,
//! over mutual TLS, the client certificate's subject) and asks an [`Authenticator`] for the
//! [`Principal`]. Implementations that need IO (the token store, a JWKS fetched over HTTP) live
//! in the daemon's assembly; this crate only defines the contract and the pure verifiers.

use std::future::Future;
use std::pin::Pin;

use crate::principal::Principal;

/// What a request presented.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Credentials<'a> {
    /// The bearer token of the `authorization` header, without the `Bearer ` prefix.
    pub bearer: Option<&'a str>,
    /// The subject of the verified client certificate, over mutual TLS.
    pub peer_subject: Option<&'a str>,
}

/// Why a request is not authenticated. Every variant but [`AuthError::Unavailable`] is the
/// caller's problem (`UNAUTHENTICATED`); `Unavailable` is the runtime's (`UNAVAILABLE`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential at all.
    #[error("no credential: send `authorization: Bearer <token>` (PHRONY_TOKEN for the CLI)")]
    Missing,
    /// The `authorization` header is not a bearer credential the runtime can read.
    #[error("malformed credential: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// A token the store does not know.
    #[error("unknown token")]
    UnknownToken,
    /// A known token past its expiry.
    #[error("token {name:?} expired at {expired_at}")]
    Expired {
        /// The token's name.
        name: String,
        /// When it expired (RFC 3339).
        expired_at: String,
    },
    /// A revoked token.
    #[error("token {name:?} was revoked")]
    Revoked {
        /// The token's name.
        name: String,
    },
    /// A JWT or certificate that failed verification (wrong issuer, audience, signature, key…).
    #[error("credential rejected: {reason}")]
    Rejected {
        /// What failed.
        reason: String,
    },
    /// The runtime could not check the credential (e.g. the token store is unreachable).
    #[error("cannot check credentials now: {reason}")]
    Unavailable {
        /// What failed.
        reason: String,
    },
}

/// The future an [`Authenticator`] returns.
pub type AuthFuture<'a> = Pin<Box<dyn Future<Output = Result<Principal, AuthError>> + Send + 'a>>;

/// Turns a request's credentials into a principal. Called once per RPC (and once per stream), so
/// a revoked token stops working on the next call.
pub trait Authenticator: Send + Sync {
    /// Verifies `credentials`.
    fn authenticate<'a>(&'a self, credentials: Credentials<'a>) -> AuthFuture<'a>;
}

/// `local` mode: nobody is verified; every caller is [`Principal::unverified`] under the default
/// actor's name (a request may still name itself, recorded as unverified).
#[derive(Debug, Clone)]
pub struct Unauthenticated {
    /// The name recorded when a request names no actor.
    pub default_actor: String,
}

impl Authenticator for Unauthenticated {
    fn authenticate<'a>(&'a self, _credentials: Credentials<'a>) -> AuthFuture<'a> {
        let principal = Principal::unverified(self.default_actor.clone());
        Box::pin(async move { Ok(principal) })
    }
}
