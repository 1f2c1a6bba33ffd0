//! [`DriverSetup`]: what drivers need from an agent version (compiled policies, argument
//! validators, the request template), prepared once per version and shared by its sessions
//! (`Inner::prepare`); [`PreparedAgent`] carries it with the compiled agent.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use phrony_ledger::OutputAction;
use phrony_manifest::{CompiledAgent, OutputValidator, ToolArgsValidator, ToolBinding};
use phrony_policy::PolicySet;
use phrony_providers::{CompletionRequest, ResponseSchema, ToolSpec};
use serde_json::json;

use crate::error::EngineError;

/// An agent version ready to drive sessions: its compiled snapshot and what the drivers need
/// from it (its policies and argument schemas compiled, the model request template built).
///
/// Cheap to clone: the sessions of one version share one ([`crate::Engine::prepare_version`]
/// compiles a stored version once per engine).
#[derive(Clone)]
pub struct PreparedAgent {
    agent: Arc<CompiledAgent>,
    setup: Arc<DriverSetup>,
}

impl PreparedAgent {
    /// Compiles `agent` for driving.
    ///
    /// # Errors
    /// `InvalidArgument` when its policies or argument schemas do not compile, or its model
    /// configuration is unusable.
    pub fn new(agent: CompiledAgent) -> Result<Self, EngineError> {
        let setup = DriverSetup::prepare(&agent)?;
        Ok(Self {
            agent: Arc::new(agent),
            setup: Arc::new(setup),
        })
    }

    /// The compiled agent.
    #[must_use]
    pub fn agent(&self) -> &CompiledAgent {
        &self.agent
    }

    /// The shared pieces a driver holds.
    pub(crate) fn parts(&self) -> (Arc<CompiledAgent>, Arc<DriverSetup>) {
        (Arc::clone(&self.agent), Arc::clone(&self.setup))
    }
}

impl fmt::Debug for PreparedAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedAgent")
            .field("agent", &self.agent.qualified_name())
            .field("version", &self.agent.metadata.version)
            .finish_non_exhaustive()
    }
}

/// What a session needs from its agent version, prepared once.
pub(crate) struct DriverSetup {
    pub(crate) policies: PolicySet,
    /// `(wire name, binding)` in manifest order.
    pub(crate) bindings: Vec<(String, ToolBinding)>,
    pub(crate) validators: HashMap<String, ToolArgsValidator>,
    /// System prompt, tools and model parameters; messages are added per completion.
    pub(crate) base_request: CompletionRequest,
    /// The check of a task's final answer (`output.format: json`), if the agent has one.
    pub(crate) output: Option<OutputCheck>,
}

/// How many answers a task gets under `on_invalid: retry`: the first and two retries.
pub(crate) const MAX_OUTPUT_ATTEMPTS: u32 = 3;

/// The agent's output contract: the compiled check and what an invalid answer leads to.
pub(crate) struct OutputCheck {
    pub(crate) validator: OutputValidator,
    /// `output.on_invalid`; `fail` when unset.
    pub(crate) on_invalid: OutputAction,
}

impl OutputCheck {
    /// What the `attempt`-th invalid answer of a session leads to: `retry` until
    /// [`MAX_OUTPUT_ATTEMPTS`] answers were checked, `repair` once, then `fail`.
    pub(crate) fn action(&self, attempt: u32) -> OutputAction {
        match self.on_invalid {
            OutputAction::Retry if attempt < MAX_OUTPUT_ATTEMPTS => OutputAction::Retry,
            OutputAction::Repair if attempt < 2 => OutputAction::Repair,
            OutputAction::Escalate => OutputAction::Escalate,
            OutputAction::Retry | OutputAction::Repair | OutputAction::Fail => OutputAction::Fail,
        }
    }
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
        let output = output_check(agent)?;
        base_request.response_schema = response_schema(agent, output.as_ref());
        Ok(Self {
            policies,
            bindings,
            validators,
            base_request,
            output,
        })
    }

    pub(crate) fn binding(&self, wire: &str) -> Option<&ToolBinding> {
        self.bindings
            .iter()
            .find(|(w, _)| w == wire)
            .map(|(_, b)| b)
    }
}

/// The agent's output check, compiled once per version.
fn output_check(agent: &CompiledAgent) -> Result<Option<OutputCheck>, EngineError> {
    let Some(validator) = OutputValidator::for_agent(agent)
        .map_err(|e| EngineError::invalid(format!("the agent version's {e}")))?
    else {
        return Ok(None);
    };
    let configured = agent
        .output
        .as_ref()
        .map(|o| o.on_invalid.as_str())
        .unwrap_or_default();
    let on_invalid = match configured {
        "" => OutputAction::Fail,
        other => other
            .parse::<OutputAction>()
            .map_err(|e| EngineError::invalid(format!("the agent version's output: {e}")))?,
    };
    Ok(Some(OutputCheck {
        validator,
        on_invalid,
    }))
}

/// `strict: true` with a schema: the schema goes to providers with structured output, named
/// after the agent (`[A-Za-z0-9_-]`, at most 64 characters).
fn response_schema(agent: &CompiledAgent, check: Option<&OutputCheck>) -> Option<ResponseSchema> {
    let strict = agent.output.as_ref().is_some_and(|o| o.strict);
    let schema = check?.validator.schema()?;
    if !strict {
        return None;
    }
    let mut name: String = agent
        .metadata
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        name = "output".to_owned();
    }
    Some(ResponseSchema {
        name,
        schema: schema.clone(),
        strict: true,
    })
}
