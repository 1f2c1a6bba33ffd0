//! The refund agent of the tutorial on the scripted `stub` model, for end-to-end tests that
//! need a session to reach a tool call without a real model provider.
//!
//! ```no_run
//! use serde_json::json;
//! use tests::daemon::Backend;
//! use tests::stub::{REFUND_AGENT, publish_and_deploy, stub_daemon, write_refund_agent};
//! let Some(daemon) = stub_daemon(Backend::Sqlite) else { return };
//! let project = tempfile::tempdir().unwrap();
//! write_refund_agent(
//!     project.path(),
//!     &json!([[
//!         {"type": "text_delta", "text": "Nothing to refund."},
//!         {"type": "completed", "stop_reason": "end_turn"}
//!     ]]),
//! );
//! publish_and_deploy(&daemon, project.path(), REFUND_AGENT);
//! ```
//!
//! The agent (`support/refund-agent@0.1.0`) has one tool, `payments.issue-refund@1.0.0` (as
//! `issue_refund`), guarded by `refund-approval-boundary` (a refund above 250 waits for one
//! approval; a rejection returns to the agent). The tool and the policy are copied from the
//! tutorial in `policies-examples/refund-agent/`, so the tests exercise the files users read.

use std::path::{Path, PathBuf};

pub use phrony_test_support::stub::{
    AGENT_VERSION, REFUND_AGENT, write_refund_agent, write_stub_script,
};

use crate::cli::{ok, phrony};
use crate::daemon::{Backend, Daemon};
use crate::worker::RefundWorker;

/// A daemon that accepts the `stub` model provider (`RUNTIME_ENABLE_STUB_PROVIDER=1`); `None`
/// as for [`Daemon::start`].
#[must_use]
pub fn stub_daemon(backend: Backend) -> Option<Daemon> {
    Daemon::start_with_env(backend, &[("RUNTIME_ENABLE_STUB_PROVIDER", "1")])
}

/// Publishes `dir/agent.yaml` and deploys `agent@`[`AGENT_VERSION`], as the actor `ci`.
///
/// # Panics
/// When a command fails (see [`ok`]).
pub fn publish_and_deploy(daemon: &Daemon, dir: &Path, agent: &str) {
    let manifest: PathBuf = dir.join("agent.yaml");
    ok(phrony(daemon, "ci")
        .args(["agents", "publish"])
        .arg(&manifest));
    ok(phrony(daemon, "ci").args(["agents", "deploy", &format!("{agent}@{AGENT_VERSION}")]));
}

/// A daemon accepting the stub model ([`stub_daemon`]), a [`RefundWorker`] named `worker_id`
/// connected to it, and the refund agent with this script written into a temporary project
/// directory, published and deployed; `None` as for [`Daemon::start`].
///
/// # Panics
/// When a file cannot be written or a command fails.
#[must_use]
pub fn deployed_refund_agent(
    backend: Backend,
    turns: &serde_json::Value,
    worker_id: &str,
) -> Option<(Daemon, RefundWorker, tempfile::TempDir)> {
    let daemon = stub_daemon(backend)?;
    let worker = RefundWorker::start(daemon.addr(), worker_id);
    let project = tempfile::tempdir().unwrap_or_else(|e| panic!("temporary directory: {e}"));
    write_refund_agent(project.path(), turns);
    publish_and_deploy(&daemon, project.path(), REFUND_AGENT);
    Some((daemon, worker, project))
}
