//! [`DriverSetup`]: what drivers need from an agent version (compiled policies, argument
//! validators, the request template), prepared once per version and shared by its sessions
//! (`Inner::prepare`).

use std::collections::HashMap;

use phrony_manifest::{CompiledAgent, ToolArgsValidator, ToolBinding};
use phrony_policy::PolicySet;
use phrony_providers::{CompletionRequest, ToolSpec};
use serde_json::json;

use crate::error::EngineError;

/// What a session needs from its agent version, prepared once.
pub(crate) struct DriverSetup {
    pub(crate) policies: PolicySet,
    /// `(wire name, binding)` in manifest order.
    pub(crate) bindings: Vec<(String, ToolBinding)>,
    pub(crate) validators: HashMap<String, ToolArgsValidator>,
    /// System prompt, tools and model parameters; messages are added per completion.
    pub(crate) base_request: CompletionRequest,
}

impl DriverSetup {
    /// Compiles the agent's policies and argument schemas and the request template.
    pub(crate) fn prepare(agent: &CompiledAgent) -> Result<Self, EngineError> {
        let policies = agent.policy_set().map_err(|e| {
            EngineError::invalid(format!("the agent version's policies do not compile: {e}"))
        })?;
        let mut bindings = Vec::new();
        let mut validators = HashMap::new();
        let mut tools = Vec::new();
        for binding in &agent.spec.tools {
            let wire = binding.wire_name();
            let validator = ToolArgsValidator::for_binding(binding)
                .map_err(|e| EngineError::invalid(e.to_string()))?;
            let schema = binding
                .input_schema
                .as_ref()
                .and_then(|s| s.inline.as_ref())
                .map_or_else(|| json!({"type": "object"}), |j| j.0.clone());
            tools.push(ToolSpec {
                name: wire.clone(),
                description: binding.description.clone(),
                input_schema: schema,
            });
            validators.insert(wire.clone(), validator);
            bindings.push((wire, binding.clone()));
        }
        let mut base_request = CompletionRequest::for_model(&agent.spec.model)
            .map_err(|e| EngineError::invalid(e.to_string()))?;
        let system = agent.spec.instructions.text.trim();
        if !system.is_empty() {
            base_request.system = Some(agent.spec.instructions.text.clone());
        }
        base_request.tools = tools;
        Ok(Self {
            policies,
            bindings,
            validators,
            base_request,
        })
    }

    pub(crate) fn binding(&self, wire: &str) -> Option<&ToolBinding> {
        self.bindings
            .iter()
            .find(|(w, _)| w == wire)
            .map(|(_, b)| b)
    }
}
