//! The workspace-level tests in one binary.
//!
//! - [`access`]: `required` auth mode with tokens, the real daemon and CLI; `local` mode.
//! - [`audit`]: `phrony audit verify` / `export` through the real daemon.
//! - [`bundles`]: a bundle's lifecycle and run through the real daemon and CLI.
//! - [`delegation`]: delegated child sessions through the real daemon, CLI and a worker process,
//!   with the daemon SIGKILLed while a child waits for a human.
//! - [`schema`]: the authoring JSON Schema against every example.
//! - [`examples`]: each example's `cases.yaml` against the real policy engine.
//! - [`lifecycle`]: the real daemon driven by the real CLI.
//! - [`replicas`]: three daemons on one PostgreSQL database: any replica serves any session, a
//!   killed or paused replica's session is taken over within its lease.
//! - [`replay`]: `phrony policies replay` of a deployed agent's stored calls under a candidate.
//! - [`mcp`]: an MCP-backed tool through the real daemon and CLI, against the fake MCP server.
//! - [`guard_rails`]: the layering rules of ARCHITECTURE.md on the sources and the dependency graph.
//! - [`transport`]: TLS and mutual TLS between the real CLI and daemon.
//! - [`sessions`] and [`tui`]: sessions and approvals through it, the attach TUI in a terminal.
//! - [`demo`]: `phrony demo` through the real CLI, embedded and against a daemon.
//! - [`sdk`]: the Rust SDK's Worker and Client against the real daemon.
//! - [`tables`]: CLI tables as redacted insta snapshots (`snapshots/`).

#![allow(
    clippy::too_many_lines,
    reason = "a test scenario reads top to bottom as one story; splitting it would hide its steps"
)]
#![allow(
    clippy::disallowed_methods,
    reason = "tests: switches such as PHRONY_TEST_SKIP_TMUX come from the environment"
)]
#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

mod access;
mod audit;
mod bundles;
mod cedar;
mod delegation;
mod demo;
mod endpoints;
mod examples;
mod guard_rails;
mod history;
mod lifecycle;
mod mcp;
mod replay;
mod replicas;
mod schema;
mod sdk;
mod sessions;
mod shadow;
mod tables;
mod transport;
mod tui;
mod webhooks;
