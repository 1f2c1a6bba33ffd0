//! Model providers for the Phrony runtime: one streaming interface over the vendors an agent's
//! `spec.model.provider` can name.
//!
//! - `openai` — Chat Completions through [async-openai](https://docs.rs/async-openai), streaming
//!   text and tool calls; honours `OPENAI_BASE_URL` like the official SDKs.
//! - `openai-compatible` — the same client against `spec.model.base_url`; the key is optional.
//! - `anthropic` — the Messages API with tool use over server-sent events; honours
//!   `ANTHROPIC_BASE_URL` like the official SDKs.
//! - `stub` — the scripted model of `stub-script.json`, only when the daemon sets
//!   `RUNTIME_ENABLE_STUB_PROVIDER`.
//!
//! Build a provider with [`build`], then call [`ModelProvider::stream`] once per completion.
//! Failures before the first streamed event are retried with backoff ([`RetryPolicy`]); every
//! error reads as a sentence a user can act on ([`ProviderError`]). API keys travel as
//! [`ApiKey`], which never prints.
//!
//! ```no_run
//! # async fn demo(model: &phrony_manifest::Model) -> Result<(), phrony_providers::ProviderError> {
//! use futures::StreamExt as _;
//! use phrony_providers::{build, ApiKey, BuildOptions, CompletionRequest, Event, Message, ProviderEnv};
//!
//! let provider = build(model, Some(ApiKey::new("sk-…")), &ProviderEnv::default(), &BuildOptions::default())?;
//! let mut request = CompletionRequest::for_model(model)?;
//! request.messages.push(Message::user_text("Refund order 7"));
//! let mut events = provider.stream(request).await?;
//! while let Some(event) = events.next().await {
//!     match event? {
//!         Event::TextDelta(text) => print!("{text}"),
//!         Event::ToolCall { name, args, .. } => println!("\n→ {name}({args})"),
//!         Event::Completed { stop_reason, usage } => println!("\n[{stop_reason}, {} tokens]", usage.total()),
//!         Event::Reasoning(_) => {}
//!     }
//! }
//! # Ok(()) }
//! ```

mod anthropic;
mod driver;
mod endpoints;
mod env;
mod error;
mod http;
mod openai;
mod retry;
mod secret;
mod stub;
mod types;

use std::time::Duration;

use futures::stream::BoxStream;

/// The largest model answer a provider accepts, in bytes: text, reasoning, tool names and tool
/// arguments of one completion together (4 MiB; about 1,000,000 tokens, far above any vendor's
/// output limit). A longer answer fails the completion with [`ProviderError::AnswerTooLarge`]
/// instead of growing the daemon's memory and the event log without bound.
pub const MAX_COMPLETION_BYTES: usize = 4 * 1024 * 1024;

pub use endpoints::{SecretDestination, resolve_endpoint, secret_destinations};
pub use env::ProviderEnv;
pub use error::{HttpFailure, ProviderError, RequestContext};
pub use retry::RetryPolicy;
pub use secret::ApiKey;
pub use types::{
    Completion, CompletionRequest, ContentBlock, DEFAULT_MAX_OUTPUT_TOKENS, Event, Message,
    Parameters, ReasoningBlock, ReasoningEffort, ResponseSchema, Role, StopReason, ToolSpec, Usage,
    estimate_tokens,
};

/// The events of one completion (see [`Event`] for the order). Dropping it cancels the request.
pub type EventStream = BoxStream<'static, Result<Event, ProviderError>>;

/// A model vendor behind one streaming interface.
#[async_trait::async_trait]
pub trait ModelProvider: Send + Sync + std::fmt::Debug {
    /// Which provider this is.
    fn kind(&self) -> ProviderKind;

    /// Starts one completion. Resolves once the first event is in (retrying retryable failures
    /// before it, per the [`RetryPolicy`]); the stream then yields the rest.
    async fn stream(&self, request: CompletionRequest) -> Result<EventStream, ProviderError>;
}

/// The providers `spec.model.provider` may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// `anthropic`
    Anthropic,
    /// `openai`
    OpenAi,
    /// `openai-compatible`
    OpenAiCompatible,
    /// `stub`
    Stub,
}

impl ProviderKind {
    /// Parses a `spec.model.provider` value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "anthropic" => Some(Self::Anthropic),
            "openai" => Some(Self::OpenAi),
            "openai-compatible" => Some(Self::OpenAiCompatible),
            "stub" => Some(Self::Stub),
            _ => None,
        }
    }

    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
            Self::OpenAiCompatible => "openai-compatible",
            Self::Stub => "stub",
        }
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Settings of [`build`] beyond the manifest, key and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildOptions {
    /// Retries before the first event (default: 3 retries, 0.5 s doubling to 8 s, jittered).
    pub retry: RetryPolicy,
    /// Limit on establishing a connection (default 10 s).
    pub connect_timeout: Duration,
    /// Limit on silence: between two events of a response stream, and for its headers (default
    /// 300 s). A stream that stalls longer fails (retried like a broken connection before its
    /// first event).
    pub idle_timeout: Duration,
    /// Provider `stub`: the `stub-script.json` text (the compiled agent's
    /// `phrony.com/stub-script` annotation).
    pub stub_script: Option<String>,
    /// Provider `stub`: completions already played, to resume a script where it stopped.
    pub stub_position: usize,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            stub_script: None,
            stub_position: 0,
        }
    }
}

/// Builds the provider named by `model.provider`.
///
/// - `openai` needs `api_key`; its API root is `env.openai_base_url` or
///   `https://api.openai.com/v1`.
/// - `openai-compatible` needs `model.base_url`; `api_key` is optional (no `Authorization`
///   header without one).
/// - `anthropic` needs `api_key`; its API root is `env.anthropic_base_url` or
///   `https://api.anthropic.com`.
/// - `stub` needs `env.stub_enabled` and `options.stub_script`.
///
/// An empty key counts as none. Unknown providers fail with
/// [`ProviderError::UnsupportedProvider`]. Nothing here reads the process environment.
pub fn build(
    model: &phrony_manifest::Model,
    api_key: Option<ApiKey>,
    env: &ProviderEnv,
    options: &BuildOptions,
) -> Result<Box<dyn ModelProvider>, ProviderError> {
    let kind =
        ProviderKind::parse(&model.provider).ok_or_else(|| ProviderError::UnsupportedProvider {
            provider: model.provider.clone(),
        })?;
    let api_key = api_key.filter(|k| !k.is_empty());
    if kind != ProviderKind::OpenAiCompatible && !model.base_url.is_empty() {
        return Err(ProviderError::InvalidConfig {
            field: "spec.model.base_url",
            message: "must be empty unless provider is openai-compatible".to_owned(),
        });
    }
    let http = || http::client(options.connect_timeout, options.idle_timeout);
    Ok(match kind {
        ProviderKind::Stub => {
            if !env.stub_enabled {
                return Err(ProviderError::StubDisabled);
            }
            let text = options
                .stub_script
                .as_deref()
                .ok_or(ProviderError::InvalidConfig {
                    field: "metadata.annotations",
                    message: "provider stub needs the stub-script.json text, compiled into the \
                              phrony.com/stub-script annotation"
                        .to_owned(),
                })?;
            let script = phrony_manifest::StubScript::parse(text)?;
            Box::new(stub::StubProvider::new(script, options.stub_position))
        }
        ProviderKind::OpenAi => {
            let key = api_key.ok_or(ProviderError::MissingApiKey { provider: kind })?;
            let base = runtime_root(kind, env)?;
            Box::new(openai::OpenAiProvider::new(
                kind,
                base,
                Some(key),
                http()?,
                options.retry.clone(),
                options.idle_timeout,
            )?)
        }
        ProviderKind::OpenAiCompatible => {
            if model.base_url.trim().is_empty() {
                return Err(ProviderError::InvalidConfig {
                    field: "spec.model.base_url",
                    message: "is required when provider is openai-compatible".to_owned(),
                });
            }
            let base = http::api_root("spec.model.base_url", &model.base_url)?;
            Box::new(openai::OpenAiProvider::new(
                kind,
                base,
                api_key,
                http()?,
                options.retry.clone(),
                options.idle_timeout,
            )?)
        }
        ProviderKind::Anthropic => {
            let key = api_key.ok_or(ProviderError::MissingApiKey { provider: kind })?;
            let base = runtime_root(kind, env)?;
            Box::new(anthropic::AnthropicProvider::new(
                base,
                &key,
                http()?,
                options.retry.clone(),
                options.idle_timeout,
            )?)
        }
    })
}

/// The checked API root of a provider whose endpoint is the daemon's (`openai`, `anthropic`):
/// the same root [`secret_destinations`] reports.
fn runtime_root(kind: ProviderKind, env: &ProviderEnv) -> Result<String, ProviderError> {
    endpoints::RuntimeRoot::of(kind, env)
        .ok_or(ProviderError::UnsupportedProvider {
            provider: kind.as_str().to_owned(),
        })?
        .checked()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(provider: &str) -> phrony_manifest::Model {
        phrony_manifest::Model {
            provider: provider.into(),
            name: "m".into(),
            ..Default::default()
        }
    }

    fn err(r: Result<Box<dyn ModelProvider>, ProviderError>) -> String {
        match r {
            Ok(p) => panic!("expected an error, built {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn unsupported_and_misconfigured_providers_fail_clearly() {
        let env = ProviderEnv::default();
        let o = BuildOptions::default();
        assert_eq!(
            err(build(&model("gemini"), None, &env, &o)),
            "unsupported model provider \"gemini\": expected one of anthropic, openai, openai-compatible, stub"
        );
        assert_eq!(
            err(build(&model("openai"), Some(ApiKey::new("")), &env, &o)),
            "model provider openai needs an API key: declare it under secrets and name it in spec.model.secret (default \"openai\")"
        );
        assert!(err(build(&model("anthropic"), None, &env, &o)).contains("needs an API key"));
        assert_eq!(
            err(build(&model("openai-compatible"), None, &env, &o)),
            "invalid model configuration: spec.model.base_url: is required when provider is openai-compatible"
        );
        assert_eq!(
            err(build(&model("stub"), None, &env, &o)),
            "stub provider is not enabled (set RUNTIME_ENABLE_STUB_PROVIDER=true)"
        );
        let bad_env = ProviderEnv {
            openai_base_url: Some("localhost:8080".into()),
            ..ProviderEnv::default()
        };
        assert!(
            err(build(
                &model("openai"),
                Some(ApiKey::new("k")),
                &bad_env,
                &o
            ))
            .starts_with("invalid model configuration: OPENAI_BASE_URL:")
        );
    }

    #[test]
    fn providers_build_without_exposing_the_key() {
        let env = ProviderEnv::default();
        let o = BuildOptions::default();
        let p = build(&model("openai"), Some(ApiKey::new("sk-secret-1")), &env, &o)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.kind(), ProviderKind::OpenAi);
        assert!(!format!("{p:?}").contains("sk-secret-1"));
        let p = build(&model("anthropic"), Some(ApiKey::new("sk-ant-2")), &env, &o)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!format!("{p:?}").contains("sk-ant-2"));
        let mut compatible = model("openai-compatible");
        compatible.base_url = "http://127.0.0.1:11434/v1/".into();
        let p = build(&compatible, None, &env, &o).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.kind(), ProviderKind::OpenAiCompatible);
    }
}
