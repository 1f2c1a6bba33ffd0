//! `kind: Policy` (§1.4). Strict: unknown keys are errors, so a typo such as `condition:` cannot
//! silently disable a policy.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::common::{MetadataDoc, nd};

/// A Policy document.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct PolicyDoc {
    #[serde(rename = "apiVersion", default, deserialize_with = "nd")]
    pub(crate) api_version: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) kind: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) metadata: MetadataDoc,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) spec: PolicySpecDoc,
}

/// `spec` of a Policy.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct PolicySpecDoc {
    #[expect(
        dead_code,
        reason = "documentation for humans; parsed so that it is a known key"
    )]
    #[serde(default, deserialize_with = "nd")]
    pub(crate) description: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) scope: String,
    #[serde(default)]
    pub(crate) allow: Option<Vec<String>>,
    /// Our addition: the argument path the allow-list checks (§2.5 gap).
    #[serde(default, deserialize_with = "nd")]
    pub(crate) allow_field: String,
    #[serde(default)]
    pub(crate) conditions: Option<serde_json::Value>,
    #[serde(default)]
    pub(crate) decision: Option<DecisionDoc>,
    /// `enforce` (the default) or `shadow`: evaluated and recorded on every call, never enforced.
    #[serde(default, deserialize_with = "nd")]
    pub(crate) mode: String,
    /// Our addition: Cedar policies computing the effect of this policy on a call (exclusive
    /// with `conditions`, `allow` and `allow_field`).
    #[serde(default)]
    pub(crate) cedar: Option<String>,
    /// Our addition: the named history facts a Cedar policy reads as `context.history.<name>`
    /// (each a history query, like a condition's `history` leaf). Only with `cedar`.
    #[serde(default)]
    pub(crate) history: std::collections::BTreeMap<String, serde_json::Value>,
}

/// `spec.decision`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct DecisionDoc {
    #[serde(rename = "type", default, deserialize_with = "nd")]
    pub(crate) kind: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) reason: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) authority_ref: String,
    #[serde(default)]
    pub(crate) approvals_required: Option<i64>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) on_reject: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) on_modify: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) comprehension_required: bool,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) allow_self_approval: bool,
    #[serde(default)]
    pub(crate) timeout: Option<TimeoutDoc>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) runtime: BTreeMap<String, serde_json::Value>,
}

/// `spec.decision.timeout`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct TimeoutDoc {
    #[serde(default)]
    pub(crate) after_minutes: Option<i64>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) default: String,
}
