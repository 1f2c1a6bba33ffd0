//! The dispatcher's integration tests in one binary.
//!
//! - [`protocol`]: the worker protocol (registration, leases, results).
//! - [`routing`]: choosing a worker for a call.
//! - [`pins`]: descriptor pins at registration and dispatch.
//! - [`common`]: an in-process fake worker and a recording observer, shared by both.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

mod common;
mod pins;
mod protocol;
mod routing;
