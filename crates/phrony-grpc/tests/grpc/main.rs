//! The server edge's integration tests in one binary: the real server in-process, driven over
//! gRPC (`client.rs` stays a binary of its own while the client moves to `phrony-client`).
//!
//! - [`interactive`]: the interactive session stream and its approvals.
//! - [`sdk_worker`]: the published Python SDK's worker against the server.
//! - [`sessions`]: sessions end to end, on SQLite and PostgreSQL.
//! - [`work`]: the `Work` stream's protocol.

mod interactive;
mod sdk_worker;
mod sessions;
mod work;
