//! The server edge's integration tests in one binary: the real server in-process, driven over
//! gRPC (`client.rs` stays a binary of its own while the client moves to `phrony-client`).
//!
//! - [`access`]: the role × RPC matrix in `required` auth mode, revocation, impersonation.
//! - [`bundles`]: bundle publish, deploy, rollback, reads and runs, on SQLite and PostgreSQL.
//! - [`credentials`]: mutual TLS subjects and worker restrictions, with a stand-in edge.
//! - [`delegation`]: delegated child sessions of a bundle, on SQLite and PostgreSQL.
//! - [`external_members`]: bundles with external members (`ns.name@version`): lock, publish,
//!   run, on SQLite and PostgreSQL.
//! - [`endpoints`]: secrets follow the deployed versions' endpoints (Deploy, Rollback).
//! - [`interactive`]: the interactive session stream and its approvals.
//! - [`pins`]: tool descriptor pins at worker registration and dispatch, SQLite and PostgreSQL.
//! - [`sdk_worker`]: the published Python SDK's worker against the server.
//! - [`sessions`]: sessions end to end, on SQLite and PostgreSQL.
//! - [`watch`]: `WatchApprovals`: the current set, changes, bounds.
//! - [`work`]: the `Work` stream's protocol.

#![allow(
    clippy::too_many_lines,
    reason = "a test scenario reads top to bottom as one story; splitting it would hide its steps"
)]
#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

mod access;
mod bundles;
mod credentials;
mod delegation;
mod endpoints;
mod external_members;
mod interactive;
mod pins;
mod sdk_worker;
mod sessions;
mod watch;
mod work;
