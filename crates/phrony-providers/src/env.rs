//! [`ProviderEnv`]: the daemon environment variables that steer providers.

/// Environment settings read by the providers. The daemon (`phrony-runtime`) builds it once
/// with [`ProviderEnv::from_lookup`] over the process environment; tests build it by hand. The
/// providers never read the process environment themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderEnv {
    /// `OPENAI_BASE_URL`: API root for provider `openai` (default `https://api.openai.com/v1`),
    /// as honoured by the official OpenAI SDKs.
    pub openai_base_url: Option<String>,
    /// `ANTHROPIC_BASE_URL`: API root for provider `anthropic` (default
    /// `https://api.anthropic.com`), as honoured by the official Anthropic SDKs.
    pub anthropic_base_url: Option<String>,
    /// `RUNTIME_ENABLE_STUB_PROVIDER` ∈ {`1`, `true`, `yes`} (case-insensitive).
    pub stub_enabled: bool,
}

impl ProviderEnv {
    /// Reads the variables through `get`; empty values count as unset.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let non_empty = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        Self {
            openai_base_url: non_empty("OPENAI_BASE_URL"),
            anthropic_base_url: non_empty("ANTHROPIC_BASE_URL"),
            stub_enabled: non_empty("RUNTIME_ENABLE_STUB_PROVIDER")
                .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> ProviderEnv {
        ProviderEnv::from_lookup(|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn stub_flag_accepts_the_documented_spellings_only() {
        for v in ["1", "true", "TRUE", "Yes"] {
            assert!(
                env(&[("RUNTIME_ENABLE_STUB_PROVIDER", v)]).stub_enabled,
                "{v}"
            );
        }
        for v in ["", "0", "false", "on", "y"] {
            assert!(
                !env(&[("RUNTIME_ENABLE_STUB_PROVIDER", v)]).stub_enabled,
                "{v}"
            );
        }
    }

    #[test]
    fn empty_base_urls_are_unset() {
        let e = env(&[
            ("OPENAI_BASE_URL", "  "),
            ("ANTHROPIC_BASE_URL", "http://x"),
        ]);
        assert_eq!(e.openai_base_url, None);
        assert_eq!(e.anthropic_base_url.as_deref(), Some("http://x"));
    }
}
