//! Where a compiled agent's secrets are sent under the daemon's provider configuration: the
//! manifest's declared destinations ([`phrony_manifest::DeclaredDestination`]) with each
//! provider's runtime default resolved from [`ProviderEnv`], normalised as [`crate::build`]
//! normalises its API root. Pure: no IO, no process environment.

use phrony_manifest::{CompiledAgent, DeclaredEndpoint, normalize_api_root};

use crate::env::ProviderEnv;
use crate::error::ProviderError;
use crate::{ProviderKind, anthropic, http, openai};

/// One secret and the endpoint its value is sent to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SecretDestination {
    /// `secrets.<name>`.
    pub secret: String,
    /// The environment variable the client reads its value from.
    pub from_env: String,
    /// The API root or server URL (no trailing slash).
    pub endpoint: String,
}

/// The API root of a provider whose manifest names none: the daemon's variable, else the
/// vendor's default.
pub(crate) struct RuntimeRoot<'a> {
    variable: &'static str,
    configured: Option<&'a str>,
    default: &'static str,
}

impl<'a> RuntimeRoot<'a> {
    /// `openai` and `anthropic`; `None` for providers whose endpoint is not the runtime's.
    pub(crate) fn of(kind: ProviderKind, env: &'a ProviderEnv) -> Option<Self> {
        match kind {
            ProviderKind::OpenAi => Some(Self {
                variable: "OPENAI_BASE_URL",
                configured: env.openai_base_url.as_deref(),
                default: openai::OPENAI_API_BASE,
            }),
            ProviderKind::Anthropic => Some(Self {
                variable: "ANTHROPIC_BASE_URL",
                configured: env.anthropic_base_url.as_deref(),
                default: anthropic::ANTHROPIC_API_BASE,
            }),
            ProviderKind::OpenAiCompatible | ProviderKind::Stub => None,
        }
    }

    /// The root, checked (an invalid variable is an error naming it).
    pub(crate) fn checked(&self) -> Result<String, ProviderError> {
        match self.configured {
            Some(url) => http::api_root(self.variable, url),
            None => Ok(self.default.to_owned()),
        }
    }

    /// The root, normalised but not checked (what [`Self::checked`] returns when it succeeds).
    fn normalized(&self) -> String {
        self.configured
            .map_or_else(|| self.default.to_owned(), normalize_api_root)
    }
}

/// The endpoint a declared destination resolves to under `env`. A runtime default of a provider
/// this build does not know is kept in its declared form (such a version cannot run).
#[must_use]
pub fn resolve_endpoint(endpoint: &DeclaredEndpoint, env: &ProviderEnv) -> String {
    match endpoint {
        DeclaredEndpoint::Url(url) => url.clone(),
        DeclaredEndpoint::RuntimeDefault { provider } => ProviderKind::parse(provider)
            .and_then(|kind| RuntimeRoot::of(kind, env))
            .map_or_else(|| endpoint.to_string(), |root| root.normalized()),
    }
}

/// Every place `agent` sends one of its declared secrets when it runs on a daemon configured
/// with `env`: secret → endpoint, sorted, without duplicates.
#[must_use]
pub fn secret_destinations(agent: &CompiledAgent, env: &ProviderEnv) -> Vec<SecretDestination> {
    let mut found: Vec<SecretDestination> = agent
        .secret_destinations()
        .into_iter()
        .map(|d| SecretDestination {
            endpoint: resolve_endpoint(&d.endpoint, env),
            secret: d.secret,
            from_env: d.from_env,
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    fn agent(provider: &str, base_url: &str) -> CompiledAgent {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "phrony.com/v1",
            "kind": "Agent",
            "metadata": {"name": "a", "namespace": "n", "version": "1.0.0"},
            "secrets": {"openai": {"fromEnv": "OPENAI_API_KEY"}, "anthropic": {"fromEnv": "ANTHROPIC_API_KEY"}},
            "spec": {
                "purpose": "p",
                "instructions": {"text": "t"},
                "model": {"provider": provider, "name": "m", "base_url": base_url, "secret": if provider == "anthropic" { "anthropic" } else { "openai" }}
            }
        }))
        .unwrap()
    }

    fn endpoints(agent: &CompiledAgent, env: &ProviderEnv) -> Vec<String> {
        secret_destinations(agent, env)
            .into_iter()
            .map(|d| format!("{} ({}) -> {}", d.secret, d.from_env, d.endpoint))
            .collect()
    }

    #[test]
    fn runtime_defaults_follow_the_daemons_configuration() {
        let default = ProviderEnv::default();
        assert_eq!(
            endpoints(&agent("openai", ""), &default),
            ["openai (OPENAI_API_KEY) -> https://api.openai.com/v1"]
        );
        assert_eq!(
            endpoints(&agent("anthropic", ""), &default),
            ["anthropic (ANTHROPIC_API_KEY) -> https://api.anthropic.com"]
        );
        let configured = ProviderEnv {
            openai_base_url: Some(" http://proxy.internal:8080/v1/ ".into()),
            anthropic_base_url: Some("https://claude.internal/".into()),
            stub_enabled: false,
        };
        assert_eq!(
            endpoints(&agent("openai", ""), &configured),
            ["openai (OPENAI_API_KEY) -> http://proxy.internal:8080/v1"]
        );
        assert_eq!(
            endpoints(&agent("anthropic", ""), &configured),
            ["anthropic (ANTHROPIC_API_KEY) -> https://claude.internal"]
        );
    }

    #[test]
    fn openai_compatible_sends_the_key_to_its_base_url_whatever_the_daemon_says() {
        let configured = ProviderEnv {
            openai_base_url: Some("http://proxy.internal/v1".into()),
            ..ProviderEnv::default()
        };
        assert_eq!(
            endpoints(
                &agent("openai-compatible", "http://b.example/v1/"),
                &configured
            ),
            ["openai (OPENAI_API_KEY) -> http://b.example/v1"]
        );
        assert!(endpoints(&agent("stub", ""), &configured).is_empty());
    }

    #[test]
    fn the_destination_is_the_root_build_uses() {
        let env = ProviderEnv {
            openai_base_url: Some("http://127.0.0.1:9/v1/".into()),
            anthropic_base_url: None,
            stub_enabled: false,
        };
        for kind in [ProviderKind::OpenAi, ProviderKind::Anthropic] {
            let root = RuntimeRoot::of(kind, &env).unwrap();
            assert_eq!(root.checked().unwrap(), root.normalized(), "{kind}");
        }
        assert_eq!(
            http::api_root("f", " http://b.example/v1// ").unwrap(),
            normalize_api_root(" http://b.example/v1// ")
        );
    }
}
