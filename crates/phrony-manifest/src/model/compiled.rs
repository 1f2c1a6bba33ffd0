//! The compiled agent snapshot (§1.9): what is published, stored, hashed and run.
//!
//! Field order is the reference's struct declaration order and almost everything is omitted when
//! empty, so that [`CompiledAgent::canonical_json`] is byte-identical to the Go runtime's JSON.
//! Free-form values ([`Json`]) serialize with sorted keys.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::canonical::{self, Json};

/// Annotation marking a compiled snapshot.
pub const ANNOTATION_POLICIES_COMPILED: &str = "phrony.com/policies-compiled";
/// Annotation holding the raw `stub-script.json` text for the stub provider.
pub const ANNOTATION_STUB_SCRIPT: &str = "phrony.com/stub-script";

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// A compiled agent snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompiledAgent {
    /// Always `phrony.com/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// Always `Agent`.
    pub kind: String,
    /// Identity and descriptive metadata.
    pub metadata: Metadata,
    /// Secret references (`fromEnv`), resolved by the client at run time.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, SecretRef>,
    /// The compiled spec.
    pub spec: AgentSpec,
    /// Output configuration (validated, carried, not enforced by the reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Output>,
}

/// `metadata` of a compiled agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Agent name.
    pub name: String,
    /// Agent namespace.
    pub namespace: String,
    /// Release label (lenient semver).
    pub version: String,
    /// Descriptive owner.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// Governance evidence; `authority_boundaries` compile to approval policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub governance: Option<Governance>,
    /// Descriptive labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations, including the compiler's `phrony.com/*` ones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `metadata.governance`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Governance {
    /// Descriptive risk tier.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub risk_tier: String,
    /// Descriptive classifications.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classifications: Vec<String>,
    /// Enforced: each compiles to an agent-wide require_approval policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authority_boundaries: Vec<String>,
    /// Framework pack id → arbitrary payload.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub frameworks: BTreeMap<String, Json>,
}

/// `secrets.<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// The environment variable the client reads the value from.
    #[serde(rename = "fromEnv")]
    pub from_env: String,
}

/// `spec` of a compiled agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Human intent, not sent to the model.
    pub purpose: String,
    /// The system prompt, always inline after compilation.
    pub instructions: Instructions,
    /// Model configuration.
    pub model: Model,
    /// Tool bindings, including delegations compiled from `spec.agents`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolBinding>,
    /// Remote MCP servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<McpServer>,
    /// The compiled, merged policies, sorted by (scope, name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<CompiledPolicy>,
    /// Run limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

/// `spec.instructions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instructions {
    /// Bundle-relative file (authoring only; resolved into `text`).
    #[serde(rename = "ref", default, skip_serializing_if = "String::is_empty")]
    pub reference: String,
    /// Version used to pick a versioned file (authoring only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The prompt text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
}

/// `spec.model`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// `anthropic`, `openai`, `openai-compatible` or `stub`.
    pub provider: String,
    /// Vendor model id.
    pub name: String,
    /// Chat Completions API root for `openai-compatible`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub base_url: String,
    /// Key into `secrets` holding the API key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
    /// Sampling parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Parameters>,
    /// Reasoning effort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Reasoning>,
    /// Carried, not sent to vendors.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub provider_options: BTreeMap<String, Json>,
}

/// `spec.model.parameters`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parameters {
    /// Sampling temperature (exclusive with `top_p`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling (exclusive with `temperature`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Output token cap; 0 = provider default (4096).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_output_tokens: i64,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
}

/// `spec.model.reasoning`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reasoning {
    /// `low`, `medium` or `high`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub effort: String,
}

/// A schema: inline after compilation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schema {
    /// Bundle-relative file (authoring only).
    #[serde(rename = "ref", default, skip_serializing_if = "String::is_empty")]
    pub reference: String,
    /// Version used to pick a versioned file (authoring only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The JSON Schema object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<Json>,
}

/// One compiled tool binding (`spec.tools[i]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolBinding {
    /// Dispatch ref: `namespace.name` (no `@constraint`), or a delegation's ref.
    #[serde(rename = "ref")]
    pub reference: String,
    /// Wire name shown to the model, when set explicitly.
    #[serde(rename = "as", default, skip_serializing_if = "String::is_empty")]
    pub wire_name: String,
    /// Description sent to the model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Function parameters sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Schema>,
    /// The Tool doc's contract version (the dispatch version); empty → `default`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// `read_only`, `idempotent_write`, `non_idempotent_write` or `irreversible_action`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub side_effect_class: String,
    /// Routes the binding to an MCP server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpRef>,
    /// Set on delegation bindings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentTarget>,
    /// Our extension: the execution deadline of one call in milliseconds (the binding's
    /// `timeout`, else its Tool document's); 0 = the runtime's default
    /// (`RUNTIME_TOOL_EXEC_TIMEOUT`). Omitted when 0, so snapshots and content hashes of
    /// manifests without it are unchanged; hashed when set (it changes what runs).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub timeout_ms: u64,
}

impl ToolBinding {
    /// The name the model calls the tool by: `as`, or the ref with every character outside
    /// `[A-Za-z0-9_-]` replaced by `_` (truncated to 64).
    pub fn wire_name(&self) -> String {
        if self.wire_name.is_empty() {
            crate::model::common::derive_wire_name(&self.reference)
        } else {
            self.wire_name.clone()
        }
    }

    /// The execution deadline the binding sets, if any (see [`ToolBinding::timeout_ms`]).
    pub fn timeout(&self) -> Option<std::time::Duration> {
        (self.timeout_ms > 0).then(|| std::time::Duration::from_millis(self.timeout_ms))
    }

    /// The version workers advertise for this tool: the pinned contract version or `default`.
    pub fn dispatch_version(&self) -> &str {
        if self.version.is_empty() {
            "default"
        } else {
            &self.version
        }
    }
}

/// `spec.tools[i].mcp`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpRef {
    /// `spec.mcp_servers[].name`.
    pub server: String,
    /// Remote tool name; defaults to the wire name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tool: String,
}

/// Delegation target of an agent-backed binding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentTarget {
    /// Target namespace (empty for local refs until bundle publish pins it).
    #[serde(default)]
    pub namespace: String,
    /// Target name (empty for local refs until bundle publish pins it).
    #[serde(default)]
    pub name: String,
    /// Pinned version label of an external target.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Bundle child name (the file stem for local refs, until pinned).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub child_name: String,
    /// Resolved at call time; outside the bundle closure.
    #[serde(default, skip_serializing_if = "is_false")]
    pub late_bound: bool,
    /// Frozen target version id (set by the server at bundle publish).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent_version_id: String,
    /// `summary` or `full`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub result: String,
}

/// `spec.mcp_servers[i]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// Unique server name.
    pub name: String,
    /// `https://` URL.
    pub url: String,
    /// `streamable_http` (the default).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub transport: String,
    /// Authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<McpAuth>,
}

/// `spec.mcp_servers[i].auth`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpAuth {
    /// `bearer` or `header`.
    pub scheme: String,
    /// Header name for the `header` scheme.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub header: String,
    /// Key into `secrets`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
}

/// `spec.limits`. Zero means unset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Token budget per run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_tokens_per_run: i64,
    /// Model completions per user turn and user turns per session.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_loop_iterations: i64,
    /// Wall-clock budget, approval waits excluded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_wall_clock_seconds: i64,
    /// Cumulative approval wait.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_hitl_wait_minutes: i64,
    /// Delegation nesting cap (default 5).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_subagent_depth: i64,
    /// `halt` (default) or `escalate`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub on_limit: String,
}

/// Top-level `output`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// `text` or `json`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub format: String,
    /// Output schema, inline after compilation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Schema>,
    /// Strict schema adherence.
    #[serde(default, skip_serializing_if = "is_false")]
    pub strict: bool,
    /// `retry`, `repair`, `escalate` or `fail`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub on_invalid: String,
}

/// A compiled policy (`spec.policies[i]`).
///
/// The first thirteen fields are the reference's compiled PolicySpec. `allow_field` is our
/// extension (the argument the allow-list checks): it changes what the policy decides, so it is
/// hashed when set (a manifest without it hashes exactly like the reference). `namespace`,
/// `version` and `merged_from` are provenance (approvals and audit name
/// `namespace/name@version`): they are stored in our snapshots but left out of the reference
/// canonical form, so content hashes stay identical to the Go runtime's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompiledPolicy {
    /// Unique name within the agent.
    pub name: String,
    /// `agent` (or empty) or `tool:<namespace.name>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope: String,
    /// The decision type: `allow`, `deny`, `block`, `require_approval` or `escalate`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub action: String,
    /// Allow-list (with `action: allow`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Condition tree; absent matches every call in scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Json>,
    /// Governance authority boundary, copied onto approvals.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub authority_ref: String,
    /// Approval quorum (≥ 1 for approval actions).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub approvals_required: i64,
    /// Deny message or approval reason.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// `fail` or `return_to_agent`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub on_reject: String,
    /// `revalidate` or `dispatch`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub on_modify: String,
    /// Approvers must acknowledge comprehension.
    #[serde(default, skip_serializing_if = "is_false")]
    pub comprehension_required: bool,
    /// The separation-of-duties opt-out (`spec.decision.allow_self_approval`); omitted when
    /// false, so snapshots and content hashes of policies without it are unchanged.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_self_approval: bool,
    /// Approval timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<PolicyTimeout>,
    /// Free-form map passed through to approvals.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub runtime: BTreeMap<String, Json>,
    /// Our extension: the argument path the allow-list checks.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub allow_field: String,
    /// Provenance: the Policy document's namespace (empty for compiler-made policies).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Provenance: the Policy document's version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Our extension: `shadow` for a policy that is evaluated and recorded but never enforced
    /// (`spec.mode: shadow`); empty for an enforced one, so snapshots and content hashes of
    /// enforced policies are unchanged. It changes what the runtime does, so it is hashed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    /// Our extension: the Cedar text of a Cedar policy (`spec.cedar`), whose effect on a call
    /// Cedar computes. Omitted when absent, so snapshots and content hashes of other policies
    /// are unchanged; hashed when set (it decides calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cedar: Option<String>,
    /// Our extension: the named history facts of a Cedar policy (`spec.history`), read by its
    /// Cedar text as `context.history.<name>`. Omitted when empty, so snapshots and content
    /// hashes of other policies are unchanged; hashed when set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cedar_history: BTreeMap<String, Json>,
    /// Provenance of a policy the compiler merged from several documents: their
    /// `namespace/name@version`, in attachment order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_from: Vec<String>,
}

impl CompiledPolicy {
    /// `namespace/name@version` when the policy came from one Policy document, else the name.
    pub fn qualified_name(&self) -> String {
        match (self.namespace.is_empty(), self.version.is_empty()) {
            (true, _) => self.name.clone(),
            (false, true) => format!("{}/{}", self.namespace, self.name),
            (false, false) => format!("{}/{}@{}", self.namespace, self.name, self.version),
        }
    }
}

/// `spec.decision.timeout` of a compiled policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyTimeout {
    /// Minutes until the default applies.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub after_minutes: i64,
    /// `deny`, `allow` or `escalate`.
    #[serde(rename = "default", default, skip_serializing_if = "String::is_empty")]
    pub default_decision: String,
}

/// Why a snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Not valid JSON for a compiled agent.
    #[error("invalid compiled snapshot: {0}")]
    Json(serde_json::Error),
    /// Valid JSON, but not a compiled agent: `<path>: <message>`.
    #[error("invalid compiled snapshot: {0}")]
    NotCompiled(String),
}

/// The parser's error is in the message, not a `source()` (a report names it once).
impl From<serde_json::Error> for SnapshotError {
    fn from(error: serde_json::Error) -> Self {
        Self::Json(error)
    }
}

impl CompiledAgent {
    /// The reference canonical form: byte-identical to the Go runtime's compiled JSON, so
    /// [`content_hash`](Self::content_hash) matches it (policy provenance left out).
    pub fn canonical_json(&self) -> Vec<u8> {
        let mut reference = self.clone();
        for p in &mut reference.spec.policies {
            p.namespace.clear();
            p.version.clear();
            p.merged_from.clear();
        }
        canonical::to_vec(&reference).expect(INFALLIBLE)
    }

    /// Hex sha256 of [`canonical_json`](Self::canonical_json), without a `sha256:` prefix.
    pub fn content_hash(&self) -> String {
        canonical::sha256_hex(&self.canonical_json())
    }

    /// Our stored form: canonical JSON including policy provenance.
    pub fn snapshot_json(&self) -> Vec<u8> {
        canonical::to_vec(self).expect(INFALLIBLE)
    }

    /// Reads a snapshot written by [`snapshot_json`](Self::snapshot_json) (or by the reference
    /// compiler). Unknown fields and uncompiled documents (wrong `apiVersion` or `kind`, no
    /// `phrony.com/policies-compiled: "true"` annotation) are rejected; everything else is
    /// [`validate`](Self::validate)'s job.
    pub fn from_snapshot_json(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let agent: CompiledAgent = serde_json::from_slice(bytes)?;
        if agent.api_version != crate::model::common::API_VERSION {
            return Err(SnapshotError::NotCompiled(format!(
                "apiVersion: must be {}",
                crate::model::common::API_VERSION
            )));
        }
        if agent.kind != "Agent" {
            return Err(SnapshotError::NotCompiled("kind: must be Agent".to_owned()));
        }
        if agent
            .metadata
            .annotations
            .get(ANNOTATION_POLICIES_COMPILED)
            .map(String::as_str)
            != Some("true")
        {
            return Err(SnapshotError::NotCompiled(format!(
                "metadata.annotations.{ANNOTATION_POLICIES_COMPILED}: must be \"true\": a \
                 compiled snapshot is marked by the compiler; compile the manifest with phrony"
            )));
        }
        Ok(agent)
    }

    /// `namespace/name`.
    pub fn qualified_name(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    /// The binding the model calls by `wire_name`.
    pub fn tool_by_wire_name(&self, wire_name: &str) -> Option<&ToolBinding> {
        self.spec.tools.iter().find(|t| t.wire_name() == wire_name)
    }
}

/// Serializing the compiled model into a `Vec` cannot fail: every map has string keys, writes to
/// memory do not fail, and serde_json writes non-finite floats as `null`.
const INFALLIBLE: &str = "serializing a compiled agent to memory cannot fail";
