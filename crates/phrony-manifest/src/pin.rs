//! Tool descriptor pins: the hash of what an agent version tells the model about a tool.
//!
//! A pin is `sha256:` + the hex SHA-256 of the canonical JSON (sorted keys, Go escaping, see
//! `canonical.rs`) of `{"description", "input_schema", "name", "version"}`: the tool's dispatch
//! ref, its dispatch version (`default` when it has none), the description the model sees and
//! the inline input schema (`null` when there is none). [`descriptor_pin`] is the one
//! implementation: a compiled binding ([`ToolBinding::descriptor_pin`]) and a Tool document on
//! disk ([`tool_descriptor_pin`], what `phrony tools pin` prints for a worker) both go through
//! it. Pins are computed from what snapshots already hold; they are not stored in them, so
//! snapshots and their content hashes are unchanged.
//!
//! A binding that overrides its Tool document's `description` or `input_schema` has the pin of
//! what it overrides to (that is what the model is told), which is not the Tool file's.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::canonical::{self, Json};
use crate::diag::{Diagnostic, Diagnostics};
use crate::model::compiled::{CompiledAgent, ToolBinding};

/// The prefix of every pin.
pub const PIN_PREFIX: &str = "sha256:";

/// The hashed descriptor; fields in sorted key order (canonical JSON).
#[derive(Serialize)]
struct Descriptor<'a> {
    description: &'a str,
    input_schema: Option<&'a Json>,
    name: &'a str,
    version: &'a str,
}

/// The pin of a tool descriptor: `sha256:<hex>` over the canonical JSON of its name (the
/// dispatch ref `namespace.name`), version (empty reads as `default`, the dispatch version),
/// description and input schema.
#[must_use]
pub fn descriptor_pin(
    name: &str,
    version: &str,
    description: &str,
    input_schema: Option<&Json>,
) -> String {
    let version = if version.is_empty() {
        "default"
    } else {
        version
    };
    let descriptor = Descriptor {
        description,
        input_schema,
        name,
        version,
    };
    // Serializing strings and a `Json` value cannot fail (no non-string map keys).
    let bytes = canonical::to_vec(&descriptor).unwrap_or_default();
    format!("{PIN_PREFIX}{}", canonical::sha256_hex(&bytes))
}

/// One tool of an agent version with its descriptor pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPin {
    /// The dispatch ref, e.g. `payments.issue-refund`.
    pub tool: String,
    /// The dispatch version (`default` when the binding has none).
    pub version: String,
    /// The descriptor pin (see [`descriptor_pin`]).
    pub pin: String,
}

impl ToolBinding {
    /// The pin of the descriptor this binding shows the model, for bindings served by workers;
    /// `None` for MCP and delegation bindings, which no worker serves.
    #[must_use]
    pub fn descriptor_pin(&self) -> Option<String> {
        if self.mcp.is_some() || self.agent.is_some() {
            return None;
        }
        Some(descriptor_pin(
            &self.reference,
            self.dispatch_version(),
            &self.description,
            self.input_schema.as_ref().and_then(|s| s.inline.as_ref()),
        ))
    }
}

impl CompiledAgent {
    /// The pins of the tools workers serve for this agent version, in binding order.
    #[must_use]
    pub fn tool_pins(&self) -> Vec<ToolPin> {
        self.spec
            .tools
            .iter()
            .filter_map(|b| {
                b.descriptor_pin().map(|pin| ToolPin {
                    tool: b.reference.clone(),
                    version: b.dispatch_version().to_owned(),
                    pin,
                })
            })
            .collect()
    }
}

/// The bundle root a Tool document's schema refs are relative to: the parent of its `tools/`
/// directory, else the file's own directory.
fn tool_root(file: &Path) -> PathBuf {
    let dir = file.parent().unwrap_or_else(|| Path::new("."));
    if dir.file_name().is_some_and(|n| n == "tools")
        && let Some(root) = dir.parent()
    {
        return root.to_path_buf();
    }
    dir.to_path_buf()
}

/// Reads, validates and pins one Tool document (`tools/*.yaml`): what a worker serving it
/// passes as its `descriptor_hash`. Schema refs resolve against the parent of the file's
/// `tools/` directory (else its own directory), as when an agent binds it.
///
/// # Errors
/// Every problem of the document, as `file:line:column` diagnostics.
pub fn tool_descriptor_pin(path: impl AsRef<Path>) -> Result<ToolPin, Diagnostics> {
    let path = path.as_ref();
    let mut out: Vec<Diagnostic> = Vec::new();
    let read = crate::compile::read_tool(path, &mut out);
    let pinned = read.map(|(src, doc)| {
        let schema = crate::compile::validate_tool(&tool_root(path), &src, &doc, &mut out);
        let tool = format!("{}.{}", doc.metadata.namespace, doc.metadata.name);
        let version = if doc.metadata.version.is_empty() {
            "default".to_owned()
        } else {
            doc.metadata.version.clone()
        };
        let pin = descriptor_pin(&tool, &version, &doc.spec.description, schema.as_ref());
        ToolPin { tool, version, pin }
    });
    crate::diag::sort_diagnostics(&mut out);
    match pinned {
        Some(pin) if !out.iter().any(Diagnostic::is_error) => Ok(pin),
        _ => {
            if !out.iter().any(Diagnostic::is_error) {
                out.push(Diagnostic::file_error(
                    path,
                    "",
                    "the Tool document could not be read",
                ));
            }
            Err(Diagnostics::new(out))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        reason = "tests: a panic is a failed assertion, with its message"
    )]

    use serde_json::json;

    use super::*;

    fn schema() -> Json {
        Json::from(json!({
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
            "required": ["order_id", "amount"],
        }))
    }

    #[test]
    fn a_fixed_descriptor_has_a_stable_pin() {
        // The canonical bytes are sorted keys, compact, the schema's keys sorted too.
        let bytes = canonical::to_vec(&Descriptor {
            description: "Issue a refund.",
            input_schema: Some(&schema()),
            name: "payments.issue-refund",
            version: "1.0.0",
        })
        .unwrap();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            r#"{"description":"Issue a refund.","input_schema":{"properties":{"amount":{"type":"number"},"order_id":{"type":"string"}},"required":["order_id","amount"],"type":"object"},"name":"payments.issue-refund","version":"1.0.0"}"#
        );
        let pin = descriptor_pin(
            "payments.issue-refund",
            "1.0.0",
            "Issue a refund.",
            Some(&schema()),
        );
        assert_eq!(
            pin,
            "sha256:d49b527b1979c00c6fc285f1116fc2bb7544033175a663b3a6dafbcc7a3d3a1e"
        );
    }

    #[test]
    fn every_field_changes_the_pin_and_an_empty_version_is_default() {
        let base = descriptor_pin("payments.issue-refund", "1.0.0", "Issue.", Some(&schema()));
        let other_schema = Json::from(json!({"type": "object"}));
        for changed in [
            descriptor_pin("payments.issue-refund", "1.0.1", "Issue.", Some(&schema())),
            descriptor_pin("payments.issue-refund", "1.0.0", "Issue!", Some(&schema())),
            descriptor_pin(
                "payments.issue-refund",
                "1.0.0",
                "Issue.",
                Some(&other_schema),
            ),
            descriptor_pin("payments.issue-refund", "1.0.0", "Issue.", None),
            descriptor_pin("payments.issue-credit", "1.0.0", "Issue.", Some(&schema())),
        ] {
            assert_ne!(changed, base);
            assert!(changed.starts_with(PIN_PREFIX) && changed.len() == 7 + 64);
        }
        assert_eq!(
            descriptor_pin("orders.lookup", "", "d", None),
            descriptor_pin("orders.lookup", "default", "d", None)
        );
    }

    #[test]
    fn mcp_and_delegation_bindings_have_no_pin() {
        let mut binding = ToolBinding {
            reference: "orders.lookup".into(),
            description: "d".into(),
            ..ToolBinding::default()
        };
        assert_eq!(
            binding.descriptor_pin(),
            Some(descriptor_pin("orders.lookup", "default", "d", None))
        );
        binding.mcp = Some(crate::model::compiled::McpRef::default());
        assert_eq!(binding.descriptor_pin(), None);
        binding.mcp = None;
        binding.agent = Some(crate::model::compiled::AgentTarget::default());
        assert_eq!(binding.descriptor_pin(), None);
    }
}
