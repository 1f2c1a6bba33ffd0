//! The workspace-level tests in one binary.
//!
//! - [`schema`]: the authoring JSON Schema against every example.
//! - [`examples`]: each example's `cases.yaml` against the real policy engine.
//! - [`lifecycle`]: the real daemon driven by the real CLI.
//! - [`sessions`] and [`tui`]: sessions and approvals through it, the attach TUI in a terminal.

mod examples;
mod lifecycle;
mod schema;
mod sessions;
mod tui;
