//! `kind: Agent` as authored in YAML (§1.2). Lenient like the reference: unknown keys are
//! reported as warnings by the loader, scalars of any type are read as strings.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::common::{MetadataDoc, PolicyAttachment, SchemaDoc, VersionLabel, nd};

/// An authoring Agent document.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct AgentDoc {
    #[serde(rename = "apiVersion", default, deserialize_with = "nd")]
    pub(crate) api_version: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) kind: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) metadata: MetadataDoc,
    /// `None` when there is no `secrets` section. A `null` entry is kept as `None`.
    #[serde(default)]
    pub(crate) secrets: Option<BTreeMap<String, Option<SecretDoc>>>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) spec: AgentSpecDoc,
    #[serde(default)]
    pub(crate) output: Option<OutputDoc>,
}

/// `secrets.<name>`. Unknown keys are errors (checked by the loader).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct SecretDoc {
    #[serde(rename = "fromEnv", default, deserialize_with = "nd")]
    pub(crate) from_env: String,
}

/// `spec` of an Agent.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct AgentSpecDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) purpose: String,
    #[serde(default)]
    pub(crate) instructions: Option<InstructionsDoc>,
    #[serde(default)]
    pub(crate) model: Option<ModelDoc>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) tools: Vec<ToolBindingDoc>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) mcp_servers: Vec<McpServerDoc>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) agents: Vec<SubagentDoc>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) default_policies: Vec<PolicyAttachment>,
    /// Forbidden on authoring manifests (§1.12).
    #[serde(default)]
    pub(crate) policies: Option<serde_yaml::Value>,
    /// Forbidden (§1.12).
    #[serde(default)]
    pub(crate) hitl: Option<serde_yaml::Value>,
    #[serde(default)]
    pub(crate) limits: Option<LimitsDoc>,
}

/// `spec.instructions`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct InstructionsDoc {
    #[serde(rename = "ref", default, deserialize_with = "nd")]
    pub(crate) reference: String,
    #[serde(default)]
    pub(crate) version: Option<VersionLabel>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) text: String,
}

/// `spec.model` (§1.14).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ModelDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) provider: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) name: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) base_url: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) secret: String,
    #[serde(default)]
    pub(crate) parameters: Option<ParametersDoc>,
    #[serde(default)]
    pub(crate) reasoning: Option<ReasoningDoc>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) provider_options: BTreeMap<String, serde_json::Value>,
}

/// `spec.model.parameters`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ParametersDoc {
    #[serde(default)]
    pub(crate) temperature: Option<f64>,
    #[serde(default)]
    pub(crate) top_p: Option<f64>,
    #[serde(default)]
    pub(crate) max_output_tokens: Option<i64>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) stop_sequences: Vec<String>,
}

/// `spec.model.reasoning`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ReasoningDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) effort: String,
}

/// `spec.tools[i]` (§1.2.1).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ToolBindingDoc {
    #[serde(rename = "ref", default, deserialize_with = "nd")]
    pub(crate) reference: String,
    #[serde(rename = "as", default, deserialize_with = "nd")]
    pub(crate) wire_name: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) description: String,
    #[serde(default)]
    pub(crate) input_schema: Option<SchemaDoc>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) side_effect_class: String,
    #[serde(default)]
    pub(crate) mcp: Option<McpRefDoc>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) policies: Vec<PolicyAttachment>,
    /// Execution deadline of one call (`30s`, `2m`, `1m30s`, `500ms`; a bare number is
    /// seconds); overrides the Tool document's and the runtime's default.
    #[serde(default, deserialize_with = "nd")]
    pub(crate) timeout: String,
    // Forbidden on authoring bindings (§1.12).
    #[serde(default)]
    pub(crate) version: Option<serde_yaml::Value>,
    #[serde(default)]
    pub(crate) name: Option<serde_yaml::Value>,
    #[serde(default)]
    pub(crate) parameters: Option<serde_yaml::Value>,
    #[serde(default)]
    pub(crate) policy: Option<serde_yaml::Value>,
    #[serde(default)]
    pub(crate) agent: Option<serde_yaml::Value>,
}

/// `spec.tools[i].mcp`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct McpRefDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) server: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) tool: String,
}

/// `spec.mcp_servers[i]` (§1.17).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct McpServerDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) name: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) url: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) transport: String,
    #[serde(default)]
    pub(crate) auth: Option<McpAuthDoc>,
}

/// `spec.mcp_servers[i].auth`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct McpAuthDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) scheme: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) header: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) secret: String,
}

/// `spec.agents[i]` (§1.18).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct SubagentDoc {
    #[serde(rename = "ref", default, deserialize_with = "nd")]
    pub(crate) reference: String,
    #[serde(rename = "as", default, deserialize_with = "nd")]
    pub(crate) wire_name: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) description: String,
    #[serde(default)]
    pub(crate) input_schema: Option<SchemaDoc>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) result: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) policies: Vec<PolicyAttachment>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) late_bound: bool,
}

/// `spec.limits` (§1.15).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct LimitsDoc {
    #[serde(default)]
    pub(crate) max_tokens_per_run: Option<i64>,
    #[serde(default)]
    pub(crate) max_loop_iterations: Option<i64>,
    #[serde(default)]
    pub(crate) max_wall_clock_seconds: Option<i64>,
    #[serde(default)]
    pub(crate) max_hitl_wait_minutes: Option<i64>,
    #[serde(default)]
    pub(crate) max_subagent_depth: Option<i64>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) on_limit: String,
}

/// Top-level `output` (§1.16).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct OutputDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) format: String,
    #[serde(default)]
    pub(crate) schema: Option<SchemaDoc>,
    #[serde(default)]
    pub(crate) strict: Option<bool>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) on_invalid: String,
}

/// Whether a forbidden value is "non-empty" (the reference only rejects set values).
pub(crate) fn is_set(v: &Option<serde_yaml::Value>) -> bool {
    match v {
        None | Some(serde_yaml::Value::Null) => false,
        Some(serde_yaml::Value::String(s)) => !s.is_empty(),
        Some(serde_yaml::Value::Sequence(s)) => !s.is_empty(),
        Some(serde_yaml::Value::Mapping(m)) => !m.is_empty(),
        Some(_) => true,
    }
}
