//! Errors: [`ApiError`] is what an HTTP caller sees; [`GateError`] is what opening a gate can
//! fail with.
//!
//! A refusal (deny, escalate, velocity) is never an [`ApiError`]: it is a decision, answered
//! with HTTP 200. `ApiError` is reserved for requests that produced no decision: bad bodies
//! (422; 400 for an admin decision without a valid approver name), unknown keys and bad signatures (401), conflicts such as an idempotency key reused
//! for another request (409), unknown ids (404) and gate failures (500).

use crate::config::ConfigError;
use crate::keys::KeyError;
use crate::oidc::OidcError;
use crate::state::ApplyError;
use crate::store::StoreError;

/// A request that produced no decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP {status} {code}: {detail}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// A stable machine-readable code.
    pub code: &'static str,
    /// A human message naming what is wrong (the SDK shows the `detail` field).
    pub detail: String,
}

impl ApiError {
    /// 400: a required field is missing or invalid (admin decisions).
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self {
            status: 400,
            code: "INVALID_REQUEST",
            detail: detail.into(),
        }
    }

    /// 422: the body is malformed.
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self {
            status: 422,
            code: "INVALID_REQUEST",
            detail: detail.into(),
        }
    }

    /// 401: no or unknown key, or a bad signature.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self {
            status: 401,
            code: "UNAUTHENTICATED",
            detail: detail.into(),
        }
    }

    /// 403: authenticated but not allowed.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self {
            status: 403,
            code: "FORBIDDEN",
            detail: detail.into(),
        }
    }

    /// 404: unknown id.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self {
            status: 404,
            code: "NOT_FOUND",
            detail: detail.into(),
        }
    }

    /// 409: conflicts with recorded state.
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self {
            status: 409,
            code: "CONFLICT",
            detail: detail.into(),
        }
    }

    /// 500: the gate failed (the SDK retries it).
    pub fn internal(detail: impl Into<String>) -> Self {
        Self {
            status: 500,
            code: "INTERNAL_ERROR",
            detail: detail.into(),
        }
    }
}

/// Opening a gate failed.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A key could not be loaded or created.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The OIDC verifier could not be set up.
    #[error(transparent)]
    Oidc(#[from] OidcError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored log cannot be replayed.
    #[error("the gate's log cannot be replayed: {0}")]
    Replay(ApplyError),
    /// The stored log's hash chain is broken.
    #[error("the gate's log is tampered with: {0}")]
    Tampered(String),
}

/// The replay's error is in the message, not a `source()` (a report names it once).
impl From<ApplyError> for GateError {
    fn from(error: ApplyError) -> Self {
        Self::Replay(error)
    }
}
