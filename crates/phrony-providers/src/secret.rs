//! [`ApiKey`]: a provider key that never shows up in logs.

use secrecy::{ExposeSecret as _, SecretString};

/// A model API key. `Debug` and `Display` print `***`; the memory is wiped on drop.
#[derive(Clone)]
pub struct ApiKey(SecretString);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(SecretString::from(key.into()))
    }

    /// The key itself, for building a request header.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.expose().is_empty()
    }
}

impl From<String> for ApiKey {
    fn from(key: String) -> Self {
        Self::new(key)
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

impl std::fmt::Display for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_redacted_in_debug_and_display() {
        let key = ApiKey::new("sk-very-secret");
        assert_eq!(format!("{key:?}"), "ApiKey(***)");
        assert_eq!(key.to_string(), "***");
        assert_eq!(format!("{:?}", Some(key.clone())), "Some(ApiKey(***))");
        assert_eq!(key.expose(), "sk-very-secret");
    }
}
