//! The refund agent of the tutorial on the scripted `stub` model, written into a directory, for
//! tests that need a session to reach a tool call without a real model provider.
//!
//! ```no_run
//! use serde_json::json;
//! use phrony_test_support::stub::write_refund_agent;
//! let project = std::env::temp_dir().join("refund-project");
//! write_refund_agent(
//!     &project,
//!     &json!([[
//!         {"type": "text_delta", "text": "Nothing to refund."},
//!         {"type": "completed", "stop_reason": "end_turn"}
//!     ]]),
//! );
//! ```
//!
//! The agent (`support/refund-agent@0.1.0`) has one tool, `payments.issue-refund@1.0.0` (as
//! `issue_refund`), guarded by `refund-approval-boundary` (a refund above 250 waits for one
//! approval; a rejection returns to the agent). The tool and the policy are copied from the
//! tutorial in `policies-examples/refund-agent/`, so the tests exercise the files users read.
//! A daemon runs it only with `RUNTIME_ENABLE_STUB_PROVIDER=1`.

use std::path::Path;

use serde_json::{Value, json};

/// The refund agent's `namespace/name`.
pub const REFUND_AGENT: &str = "support/refund-agent";

/// The version every agent written here declares.
pub const AGENT_VERSION: &str = "0.1.0";

/// The refund agent's manifest: the tutorial's purpose and tool wiring, on the stub model.
const REFUND_AGENT_YAML: &str = "apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: refund-agent
  namespace: support
  version: 0.1.0
spec:
  purpose: Handle customer refund requests within policy limits.
  instructions:
    text: Always look up the order before issuing a refund.
  model:
    provider: stub
    name: scripted
  tools:
    - ref: payments.issue-refund
      as: issue_refund
      policies:
        - ref: policies/refund-approval-boundary.yaml
";

/// The tutorial files the refund agent uses, relative to its example directory.
const TUTORIAL_FILES: [&str; 2] = [
    "tools/payments.issue-refund.yaml",
    "policies/refund-approval-boundary.yaml",
];

/// Writes `stub-script.json` into `dir`: the stub model's `turns`, one array of chunks per
/// completion call (`text_delta`, `tool_call`, `completed`, …).
///
/// # Panics
/// When the file cannot be written.
pub fn write_stub_script(dir: &Path, turns: &Value) {
    let path = dir.join("stub-script.json");
    std::fs::write(&path, json!({ "turns": turns }).to_string())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Writes the refund agent into `dir`: its manifest, the stub script with these `turns` (see
/// [`write_stub_script`]), and the tutorial's `payments.issue-refund` tool and
/// `refund-approval-boundary` policy.
///
/// # Panics
/// When a file cannot be read or written.
pub fn write_refund_agent(dir: &Path, turns: &Value) {
    let tutorial = crate::examples_dir().join("refund-agent");
    for file in TUTORIAL_FILES {
        let (from, to) = (tutorial.join(file), dir.join(file));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
        }
        std::fs::copy(&from, &to)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    }
    let manifest = dir.join("agent.yaml");
    std::fs::write(&manifest, REFUND_AGENT_YAML)
        .unwrap_or_else(|e| panic!("write {}: {e}", manifest.display()));
    write_stub_script(dir, turns);
}

/// The stub script of one refund: a call of `issue_refund` with `{order_id, amount, "EUR",
/// reason}`, then a closing text once the tool result is back (see [`write_stub_script`]).
#[must_use]
pub fn one_refund_turns(order_id: &str, amount: u32, reason: &str) -> Value {
    json!([
        [
            {"type": "tool_call", "name": "issue_refund",
             "args": {"order_id": order_id, "amount": amount, "currency": "EUR", "reason": reason}},
            {"type": "completed", "stop_reason": "tool_use"}
        ],
        [
            {"type": "text_delta", "text": "The refund was handled."},
            {"type": "completed", "stop_reason": "end_turn"}
        ]
    ])
}

/// [`write_refund_agent`], the agent renamed `support/<name>` (same tool, policy and version),
/// for tests and tools that deploy several refund agents with different scripts side by side.
///
/// # Panics
/// As [`write_refund_agent`].
pub fn write_refund_agent_named(dir: &Path, name: &str, turns: &Value) {
    write_refund_agent(dir, turns);
    let manifest = dir.join("agent.yaml");
    std::fs::write(
        &manifest,
        REFUND_AGENT_YAML.replacen("name: refund-agent", &format!("name: {name}"), 1),
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", manifest.display()));
}
