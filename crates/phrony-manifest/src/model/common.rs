//! Pieces shared by the authoring kinds: the metadata envelope, schema and policy references,
//! version labels, and the lenient scalar rules of the reference parser.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// The only accepted `apiVersion`.
pub(crate) const API_VERSION: &str = "phrony.com/v1";

/// Deserializes a value where YAML `null` (or an empty value) means "not set", like the
/// reference's zero values. Used as `#[serde(default, deserialize_with = "nd")]`.
pub(crate) fn nd<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `metadata` of every kind.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct MetadataDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) name: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) namespace: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) version: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) owner: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) governance: Option<GovernanceDoc>,
}

/// `metadata.governance`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct GovernanceDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) risk_tier: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) classifications: Vec<String>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) authority_boundaries: Vec<String>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) frameworks: BTreeMap<String, serde_json::Value>,
}

/// A version label written as a string or a number (`version: 2` picks `prompt-2.md`).
///
/// Numbers print like the reference: integral floats without a decimal point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub(crate) struct VersionLabel(pub(crate) String);

impl fmt::Display for VersionLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for VersionLabel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = VersionLabel;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a version string or number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(VersionLabel(v.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(VersionLabel(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(VersionLabel(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(VersionLabel(crate::canonical::go_float(v)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `{ref, version?}` or `{inline: {...}}`: an input, output or delegation schema.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct SchemaDoc {
    #[serde(rename = "ref", default, deserialize_with = "nd")]
    pub(crate) reference: String,
    #[serde(default)]
    pub(crate) version: Option<VersionLabel>,
    #[serde(default)]
    pub(crate) inline: Option<serde_json::Value>,
}

impl SchemaDoc {
    /// Whether `inline` holds something (an empty mapping counts as unset, like the reference).
    pub(crate) fn has_inline(&self) -> bool {
        match &self.inline {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Object(m)) => !m.is_empty(),
            Some(_) => true,
        }
    }
}

/// A policy attachment: a logical id `namespace.name` looked up in `policies/`, or
/// `{ref: policies/x.yaml}` naming a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PolicyAttachment {
    /// `namespace.name`.
    Id(String),
    /// A bundle-relative file; the extension may be left out.
    File(String),
}

impl<'de> Deserialize<'de> for PolicyAttachment {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PolicyAttachment;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a policy id (namespace.name) or {ref: path}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(PolicyAttachment::Id(v.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut reference: Option<String> = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "ref" {
                        reference = map.next_value::<Option<String>>()?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(PolicyAttachment::File(reference.unwrap_or_default()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether `s` is blank (empty or whitespace only), the reference's "required" test.
pub(crate) fn blank(s: &str) -> bool {
    s.trim().is_empty()
}

/// `^[a-z][a-z0-9_-]*$`: secret names.
pub(crate) fn is_secret_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
}

/// `^[a-zA-Z0-9_-]{1,64}$`: wire names of tools.
pub(crate) fn is_wire_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`: environment variable names.
pub(crate) fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The wire name derived from a ref: every character outside `[A-Za-z0-9_-]` becomes `_`,
/// truncated to 64 characters.
pub(crate) fn derive_wire_name(reference: &str) -> String {
    reference
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// "Valid semver" in the reference's lenient sense: with a `v` prefix added (unless present),
/// Go's `semver.IsValid` accepts it. So `1`, `1.2`, `1.2.3`, `1.2.3-rc.1+b` and `v1.2.3` pass.
pub fn is_lenient_semver(label: &str) -> bool {
    lenient_semver(label).is_some()
}

/// Parses a lenient semver label into a full version (`1.2` → `1.2.0`).
pub(crate) fn lenient_semver(label: &str) -> Option<semver::Version> {
    let s = label.strip_prefix('v').unwrap_or(label);
    // Split off build metadata and pre-release, which Go only allows on full versions.
    let (core, rest) = match s.find(['-', '+']) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let parts: Vec<&str> = core.split('.').collect();
    let numeric = |p: &str| {
        !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) && (p == "0" || !p.starts_with('0'))
    };
    if parts.is_empty() || parts.len() > 3 || !parts.iter().all(|p| numeric(p)) {
        return None;
    }
    if parts.len() < 3 && !rest.is_empty() {
        return None;
    }
    let mut full = parts.join(".");
    for _ in parts.len()..3 {
        full.push_str(".0");
    }
    full.push_str(rest);
    semver::Version::parse(&full).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_semver_follows_go() {
        for ok in ["1", "1.2", "1.2.3", "1.2.3-rc.1+b", "v1.2.3", "0.1.0", "v2"] {
            assert!(is_lenient_semver(ok), "{ok}");
        }
        for bad in [
            "",
            "v",
            "not-a-version",
            "1.2.3.4",
            "01.2.3",
            "1.2-rc",
            "1..2",
            "1.2.x",
        ] {
            assert!(!is_lenient_semver(bad), "{bad}");
        }
        assert_eq!(
            lenient_semver("1.2").unwrap(),
            semver::Version::new(1, 2, 0)
        );
    }

    #[test]
    fn name_patterns() {
        assert!(is_secret_name("openai") && is_secret_name("a_b-1"));
        assert!(!is_secret_name("OpenAI") && !is_secret_name("1a") && !is_secret_name(""));
        assert!(is_wire_name("issue_refund") && !is_wire_name("a.b") && !is_wire_name(""));
        assert!(!is_wire_name(&"a".repeat(65)));
        assert_eq!(
            derive_wire_name("payments.process-payment"),
            "payments_process-payment"
        );
        assert!(is_env_name("OPENAI_API_KEY") && !is_env_name("1X") && !is_env_name("A-B"));
    }
}
