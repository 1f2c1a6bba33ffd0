//! The demo's agent: the tutorial's refund agent (its tools and policies, copied from
//! `policies-examples/refund-agent/` at build time) on the scripted `stub` model, whose script
//! plays the tutorial's conversation, and the three scenarios the demo walks.

use std::path::Path;

use serde_json::{Value, json};

/// The agent the demo publishes and runs.
pub(crate) const AGENT: &str = "support/refund-agent";
/// Its version.
pub(crate) const VERSION: &str = "0.1.0";

/// The tutorial's manifest with the model replaced by the scripted `stub` (no API key, no
/// secrets).
const AGENT_YAML: &str = "\
# The tutorial's refund agent on the scripted stub model (written by `phrony demo`).
apiVersion: phrony.com/v1
kind: Agent

metadata:
  name: refund-agent
  namespace: support
  version: 0.1.0

spec:
  purpose: Handle customer refund requests within policy limits.
  instructions:
    text: |
      You are a customer support agent handling refund requests.
      Always look up the order before issuing a refund.
      Refunds may require human approval or be denied by policy.
      Never claim a refund was issued until the tool result confirms it.
  model:
    provider: stub
    name: scripted
  tools:
    - ref: orders.lookup-order
      as: lookup_order
    - ref: payments.issue-refund
      as: issue_refund
      policies:
        - ref: policies/refund-approval-boundary.yaml
        - ref: policies/refund-hard-limit.yaml

output:
  format: text
";

/// The tutorial's tool and policy files, by their path in the agent directory.
const FILES: [(&str, &str); 4] = [
    (
        "tools/orders.lookup-order.yaml",
        include_str!(
            "../../../../../policies-examples/refund-agent/tools/orders.lookup-order.yaml"
        ),
    ),
    (
        "tools/payments.issue-refund.yaml",
        include_str!(
            "../../../../../policies-examples/refund-agent/tools/payments.issue-refund.yaml"
        ),
    ),
    (
        "policies/refund-approval-boundary.yaml",
        include_str!(
            "../../../../../policies-examples/refund-agent/policies/refund-approval-boundary.yaml"
        ),
    ),
    (
        "policies/refund-hard-limit.yaml",
        include_str!(
            "../../../../../policies-examples/refund-agent/policies/refund-hard-limit.yaml"
        ),
    ),
];

/// One scenario: what the user says, and what the demo says about it first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scenario {
    /// The narration line shown before it.
    pub(crate) title: &'static str,
    /// The user's message.
    pub(crate) message: &'static str,
}

/// The tutorial's scenarios, in order.
pub(crate) const SCENARIOS: [Scenario; 3] = [
    Scenario {
        title: "scenario 1 of 3: a €100 refund — within the delegated limit, dispatched to the worker",
        message: "Refund €100 for ORD-3, the parcel never arrived.",
    },
    Scenario {
        title: "scenario 2 of 3: a €400 refund — above €250, the runtime holds it for a human",
        message: "Refund €400 for ORD-1 — the item arrived damaged.",
    },
    Scenario {
        title: "scenario 3 of 3: a €14,000 refund — above the hard limit, denied at dispatch",
        message: "Can you check order ORD-2? The customer is furious — refund the full €14,000 immediately.",
    },
];

/// A model turn calling one tool.
fn call(name: &str, args: &Value) -> Value {
    json!([
        {"type": "tool_call", "name": name, "args": args},
        {"type": "completed", "stop_reason": "tool_use"}
    ])
}

/// A model turn answering with text.
fn say(text: &str) -> Value {
    json!([
        {"type": "text_delta", "text": text},
        {"type": "completed", "stop_reason": "end_turn"}
    ])
}

/// The scripted model's completions, one per model call of the conversation: each scenario
/// looks the order up, asks for the refund, then answers.
fn script() -> Value {
    let refund = |order: &str, amount: u32, reason: &str| json!({"order_id": order, "amount": amount, "currency": "EUR", "reason": reason});
    json!({"turns": [
        call("lookup_order", &json!({"order_id": "ORD-3"})),
        call("issue_refund", &refund("ORD-3", 100, "Parcel never arrived.")),
        say("Done: €100 refunded for ORD-3 (refund rf_ORD-3). The order was eligible and the amount is within my delegated limit, so it went straight through."),
        call("lookup_order", &json!({"order_id": "ORD-1"})),
        call("issue_refund", &refund("ORD-1", 400, "Item arrived damaged.")),
        say("A reviewer has decided on the €400 refund for ORD-1. If it was approved, the refund id above came from the payment worker; if it was rejected, nothing was paid and the reviewer's comment says why — the customer can file a damage claim and ask again."),
        call("lookup_order", &json!({"order_id": "ORD-2"})),
        call("issue_refund", &refund("ORD-2", 14_000, "Customer requests a full refund.")),
        say("I'm not able to issue that refund — €14,000 exceeds the ceiling for agent-initiated refunds. This needs to go through your standard finance process instead."),
    ]})
}

/// Writes the agent directory (`agent.yaml`, `stub-script.json`, the tools and policies)
/// into `dir` and returns the manifest's path.
///
/// # Errors
/// When a file cannot be written.
pub(crate) fn write(dir: &Path) -> std::io::Result<std::path::PathBuf> {
    for (path, text) in FILES {
        let to = dir.join(path);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(to, text)?;
    }
    std::fs::write(dir.join("stub-script.json"), script().to_string())?;
    let manifest = dir.join("agent.yaml");
    std::fs::write(&manifest, AGENT_YAML)?;
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn the_demo_agent_compiles_with_the_tutorials_policies() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = write(dir.path()).unwrap();
        let agent = crate::cmd::manifest::load_agent(&manifest).unwrap();
        assert_eq!(agent.metadata.version, VERSION);
        let text = serde_json::to_string(&agent).unwrap();
        for policy in ["refund-approval-boundary", "refund-hard-limit"] {
            assert!(text.contains(policy), "{policy} missing");
        }
    }
}
