//! Dev-only helpers shared by the workspace's tests (never a normal dependency).
//!
//! - [`postgres`]: a throw-away PostgreSQL database per test, dropped when it goes out of scope.
//! - [`private_postgres`]: a private PostgreSQL cluster (its own `initdb`, port and socket) a
//!   test may stop, crash and start again.
//! - [`small_fs`]: a small `tmpfs` a test can fill up (a full disk).
//! - [`sqlite_lock`]: another process's hold on an SQLite database's write lock.
//! - [`stub`]: the tutorial's refund agent on the scripted `stub` model, written to a directory.
//! - `worker` (feature `worker`): a Rust tool worker on the SDK's `Worker` that records its calls.
//! - [`pki`]: a throw-away CA, server and client certificates for TLS and mTLS tests.
//! - [`proxy`]: a TCP proxy that loses the connection on cue.
//! - [`fake_api`]: a local fake model vendor API answering scripted replies.
//! - [`fake_mcp`]: a fake MCP server (Streamable HTTP) with switches for failures and auth.
//! - `fake_model` (feature `model`): an in-process scripted `ModelProvider` that records every
//!   request, for the engine's and the server edge's tests.
//!
//! This crate depends on no other phrony crate, but with the `model` feature on
//! `phrony-providers`, and with the `worker` feature `phrony-sdk` (and so
//! `phrony-client`), so every crate, the ledger and the server edge included, can take it as a
//! dev-dependency without a second copy of itself in its test build (the providers' own tests
//! take it without `model`; only the end-to-end tests and the benchmark turn on `worker`).

#![allow(
    clippy::disallowed_methods,
    reason = "dev-only test support: the test database URL and skip switch come from the environment"
)]

pub mod fake_api;
pub mod fake_mcp;
#[cfg(feature = "model")]
pub mod fake_model;
pub mod pki;
pub mod postgres;
pub mod private_postgres;
pub mod proxy;
pub mod small_fs;
pub mod sqlite_lock;
pub mod stub;
#[cfg(feature = "worker")]
pub mod worker;

use std::path::{Path, PathBuf};

/// The workspace root (two levels above this crate).
#[must_use]
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map_or_else(|| PathBuf::from("../.."), Path::to_path_buf)
}

/// `policies-examples/`, the tutorial and example agents.
#[must_use]
pub fn examples_dir() -> PathBuf {
    workspace_root().join("policies-examples")
}
