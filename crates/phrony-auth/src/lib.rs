//! Who may do what in the Phrony runtime.
//!
//! - [`actor`]: the rule every actor name obeys (shared by the client and the server edge).
//! - [`Role`] and [`Permission`]: what a credential carries and what each RPC needs.
//! - [`Principal`]: a caller the runtime identified, with [`Verification`] saying how; it
//!   answers "may it do this" ([`Principal::require`], [`Principal::may_approve_route`],
//!   [`Principal::may_serve`]) and "who is recorded" ([`Principal::attribute`] →
//!   [`Attribution`]).
//! - [`oidc`]: the pure verifier of OIDC bearer JWTs over a JWKS.
//! - [`Authenticator`]: the contract between the gRPC edge and whatever verifies credentials.
//! - [`token`]: API token secrets (`phr_…`), generated from caller-supplied randomness, and the
//!   hash the token store keeps instead of them.
//! - [`throttle`]: failed sign-ins per client address and per account, locked out with a
//!   doubling backoff (the web consoles' sign-in forms).
//!
//! The crate does no IO and reads no environment: the daemon's assembly (`phrony-runtime`)
//! builds authenticators from its configuration and hands them to the edge.

pub mod actor;
mod authenticate;
pub mod oidc;
mod principal;
mod role;
pub mod throttle;
pub mod token;

pub use actor::{ACTOR_HEADER, Actor, ActorError, is_unprintable};
pub use authenticate::{AuthError, AuthFuture, Authenticator, Credentials, Unauthenticated};
pub use principal::{
    Attribution, BadToolPattern, Denied, Impersonation, Principal, ToolPattern, Verification,
};
pub use role::{Permission, Role, UnknownRole};
pub use throttle::{Lockout, LoginThrottle, ThrottleKey, ThrottleLimits};
pub use token::{BadTokenSecret, TOKEN_PREFIX, TOKEN_RANDOM_BYTES, TokenSecret, hash_secret};
