//! [`ProviderFactory`]: how the engine gets a model provider for a session.

use std::fmt;

use phrony_manifest::{ANNOTATION_STUB_SCRIPT, CompiledAgent};
use phrony_providers::{
    ApiKey, BuildOptions, ModelProvider, ProviderEnv, ProviderError, SecretDestination,
};

/// Builds the model provider of a session. The daemon uses [`DefaultProviderFactory`]; tests
/// inject scripted providers.
pub trait ProviderFactory: Send + Sync + fmt::Debug + 'static {
    /// A provider for `agent`'s `spec.model`, with the session's API key (if it has one).
    /// `completions_done` is how many completions the session already ran (the stub provider
    /// resumes its script there after a restart).
    fn build(
        &self,
        agent: &CompiledAgent,
        api_key: Option<ApiKey>,
        completions_done: usize,
    ) -> Result<Box<dyn ModelProvider>, ProviderError>;

    /// Where `agent` sends its declared secrets from this daemon
    /// ([`phrony_providers::secret_destinations`] under the providers' configuration). The
    /// default assumes the vendors' default endpoints (no `OPENAI_BASE_URL`/`ANTHROPIC_BASE_URL`);
    /// [`DefaultProviderFactory`] uses the environment it was built with.
    fn secret_destinations(&self, agent: &CompiledAgent) -> Vec<SecretDestination> {
        phrony_providers::secret_destinations(agent, &ProviderEnv::default())
    }
}

/// The production factory: [`phrony_providers::build`] with the daemon's environment.
#[derive(Debug, Clone, Default)]
pub struct DefaultProviderFactory {
    /// `OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`, `RUNTIME_ENABLE_STUB_PROVIDER`.
    pub env: ProviderEnv,
    /// Retries and timeouts.
    pub options: BuildOptions,
}

impl DefaultProviderFactory {
    /// A factory over the provider settings the daemon read (`phrony-runtime` reads them from
    /// the process environment; the engine never does), with the default retries and timeouts.
    #[must_use]
    pub fn new(env: ProviderEnv) -> Self {
        Self {
            env,
            options: BuildOptions::default(),
        }
    }
}

impl ProviderFactory for DefaultProviderFactory {
    fn build(
        &self,
        agent: &CompiledAgent,
        api_key: Option<ApiKey>,
        completions_done: usize,
    ) -> Result<Box<dyn ModelProvider>, ProviderError> {
        let mut options = self.options.clone();
        options.stub_script = agent
            .metadata
            .annotations
            .get(ANNOTATION_STUB_SCRIPT)
            .cloned();
        options.stub_position = completions_done;
        phrony_providers::build(&agent.spec.model, api_key, &self.env, &options)
    }

    fn secret_destinations(&self, agent: &CompiledAgent) -> Vec<SecretDestination> {
        phrony_providers::secret_destinations(agent, &self.env)
    }
}

/// The secret holding the model API key: `spec.model.secret`, else the secret named after the
/// provider.
#[must_use]
pub fn api_key_secret_name(agent: &CompiledAgent) -> String {
    agent.spec.model.api_key_secret().to_owned()
}
