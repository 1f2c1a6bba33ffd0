//! The dispatcher's integration tests in one binary.
//!
//! - [`protocol`]: the worker protocol (registration, leases, results).
//! - [`routing`]: choosing a worker for a call.
//! - [`common`]: an in-process fake worker and a recording observer, shared by both.

mod common;
mod protocol;
mod routing;
