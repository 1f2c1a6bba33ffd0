//! Where a compiled agent sends its secrets, as the manifest declares it: the model API key to
//! the provider's endpoint, an MCP server's `auth.secret` to the server's URL. Pure: the
//! daemon resolves a provider's runtime default (`OPENAI_BASE_URL`, …) in `phrony-providers`.

use std::fmt;

use crate::model::compiled::{CompiledAgent, Model};

/// A secret's destination as the manifest declares it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeclaredEndpoint {
    /// The API root the runtime is configured with for this provider (`openai`:
    /// `OPENAI_BASE_URL` or the vendor's; `anthropic`: `ANTHROPIC_BASE_URL` or the vendor's):
    /// operator configuration, not the publisher's choice.
    RuntimeDefault {
        /// `spec.model.provider`.
        provider: String,
    },
    /// A URL written in the manifest (`spec.model.base_url` of `openai-compatible`,
    /// `spec.mcp_servers[].url`), normalised by [`normalize_api_root`].
    Url(String),
}

impl fmt::Display for DeclaredEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RuntimeDefault { provider } => {
                write!(f, "provider {provider} (runtime default endpoint)")
            }
            Self::Url(url) => f.write_str(url),
        }
    }
}

/// What sends a secret.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SecretUser {
    /// The model provider (`spec.model`), as its API key.
    Model,
    /// `spec.mcp_servers[]` with this name, as its `auth.secret`.
    McpServer(String),
}

/// One place a declared secret's value is sent.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeclaredDestination {
    /// `secrets.<name>`.
    pub secret: String,
    /// The environment variable the client reads its value from (`secrets.<name>.fromEnv`): the
    /// value that travels is this variable's.
    pub from_env: String,
    /// Where it goes.
    pub endpoint: DeclaredEndpoint,
    /// What sends it.
    pub user: SecretUser,
}

/// An API root or server URL as the providers use it: surrounding whitespace and trailing
/// slashes removed (`http://a/v1/` and `http://a/v1` are one endpoint).
#[must_use]
pub fn normalize_api_root(raw: &str) -> String {
    raw.trim().trim_end_matches('/').to_owned()
}

impl Model {
    /// The secret holding the model API key: `spec.model.secret`, else the secret named after
    /// the provider.
    #[must_use]
    pub fn api_key_secret(&self) -> &str {
        if self.secret.is_empty() {
            &self.provider
        } else {
            &self.secret
        }
    }
}

impl CompiledAgent {
    /// Every place this agent sends one of its declared secrets, sorted. A secret that is not
    /// declared under `secrets` is never resolved by a client, so it goes nowhere; the `stub`
    /// provider sends no key.
    #[must_use]
    pub fn secret_destinations(&self) -> Vec<DeclaredDestination> {
        let mut found = Vec::new();
        let mut push = |secret: &str, endpoint: DeclaredEndpoint, user: SecretUser| {
            if let Some(declared) = self.secrets.get(secret) {
                found.push(DeclaredDestination {
                    secret: secret.to_owned(),
                    from_env: declared.from_env.clone(),
                    endpoint,
                    user,
                });
            }
        };
        let model = &self.spec.model;
        let model_endpoint = match model.provider.as_str() {
            "stub" => None,
            "openai-compatible" => Some(DeclaredEndpoint::Url(normalize_api_root(&model.base_url))),
            // `openai`, `anthropic`; an unknown provider (refused at publish) is kept as declared.
            other => Some(DeclaredEndpoint::RuntimeDefault {
                provider: other.to_owned(),
            }),
        };
        if let Some(endpoint) = model_endpoint {
            push(model.api_key_secret(), endpoint, SecretUser::Model);
        }
        for server in &self.spec.mcp_servers {
            if let Some(auth) = server.auth.as_ref().filter(|a| !a.secret.is_empty()) {
                push(
                    &auth.secret,
                    DeclaredEndpoint::Url(normalize_api_root(&server.url)),
                    SecretUser::McpServer(server.name.clone()),
                );
            }
        }
        found.sort();
        found.dedup();
        found
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;
    use crate::model::compiled::{McpAuth, McpServer, SecretRef};

    fn agent(provider: &str, base_url: &str, secret: &str) -> CompiledAgent {
        let mut agent: CompiledAgent = serde_json::from_value(serde_json::json!({
            "apiVersion": "phrony.com/v1",
            "kind": "Agent",
            "metadata": {"name": "a", "namespace": "n", "version": "1.0.0"},
            "spec": {
                "purpose": "p",
                "instructions": {"text": "t"},
                "model": {"provider": provider, "name": "m"}
            }
        }))
        .unwrap();
        agent.spec.model.base_url = base_url.to_owned();
        agent.spec.model.secret = secret.to_owned();
        agent
    }

    fn declare(agent: &mut CompiledAgent, name: &str, var: &str) {
        agent.secrets.insert(
            name.to_owned(),
            SecretRef {
                from_env: var.to_owned(),
            },
        );
    }

    fn shown(agent: &CompiledAgent) -> Vec<String> {
        agent
            .secret_destinations()
            .iter()
            .map(|d| format!("{} ({}) -> {}", d.secret, d.from_env, d.endpoint))
            .collect()
    }

    #[test]
    fn the_model_key_goes_to_the_providers_endpoint() {
        let mut a = agent("openai", "", "");
        declare(&mut a, "openai", "OPENAI_API_KEY");
        assert_eq!(
            shown(&a),
            ["openai (OPENAI_API_KEY) -> provider openai (runtime default endpoint)"]
        );
        let mut a = agent("anthropic", "", "claude");
        declare(&mut a, "claude", "ANTHROPIC_API_KEY");
        declare(&mut a, "unused", "OTHER");
        assert_eq!(
            shown(&a),
            ["claude (ANTHROPIC_API_KEY) -> provider anthropic (runtime default endpoint)"]
        );
        let mut a = agent(
            "openai-compatible",
            "  http://b.example:8080/v1//  ",
            "openai",
        );
        declare(&mut a, "openai", "OPENAI_API_KEY");
        assert_eq!(
            shown(&a),
            ["openai (OPENAI_API_KEY) -> http://b.example:8080/v1"]
        );
    }

    #[test]
    fn undeclared_secrets_and_the_stub_send_nothing() {
        // The key secret is not declared: no client resolves it, so it goes nowhere.
        assert!(agent("openai", "", "").secret_destinations().is_empty());
        assert!(
            agent("openai-compatible", "http://b/v1", "")
                .secret_destinations()
                .is_empty()
        );
        let mut a = agent("stub", "", "");
        declare(&mut a, "stub", "STUB_KEY");
        assert!(a.secret_destinations().is_empty());
    }

    #[test]
    fn an_mcp_servers_secret_goes_to_its_url() {
        let mut a = agent("openai", "", "");
        declare(&mut a, "openai", "OPENAI_API_KEY");
        declare(&mut a, "crm", "CRM_TOKEN");
        a.spec.mcp_servers = vec![
            McpServer {
                name: "crm".into(),
                url: "https://mcp.example/crm/".into(),
                transport: String::new(),
                auth: Some(McpAuth {
                    scheme: "bearer".into(),
                    header: String::new(),
                    secret: "crm".into(),
                }),
            },
            McpServer {
                name: "open".into(),
                url: "https://mcp.example/open".into(),
                transport: String::new(),
                auth: None,
            },
        ];
        let destinations = a.secret_destinations();
        assert_eq!(
            shown(&a),
            [
                "crm (CRM_TOKEN) -> https://mcp.example/crm",
                "openai (OPENAI_API_KEY) -> provider openai (runtime default endpoint)",
            ]
        );
        assert_eq!(destinations[0].user, SecretUser::McpServer("crm".into()));
        assert_eq!(destinations[1].user, SecretUser::Model);
    }

    #[test]
    fn normalisation_trims_space_and_trailing_slashes_only() {
        assert_eq!(normalize_api_root(" http://a/v1/ "), "http://a/v1");
        assert_eq!(normalize_api_root("http://a/v1"), "http://a/v1");
        assert_eq!(normalize_api_root("HTTP://A/v1"), "HTTP://A/v1");
    }
}
