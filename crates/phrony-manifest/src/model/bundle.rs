//! `kind: Bundle` (§1.5) and `bundle.lock.json` (§1.6).

use serde::{Deserialize, Serialize};

use super::common::{MetadataDoc, nd};

/// A Bundle document.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct BundleDoc {
    #[serde(rename = "apiVersion", default, deserialize_with = "nd")]
    pub(crate) api_version: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) kind: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) metadata: MetadataDoc,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) spec: BundleSpecDoc,
}

/// `spec` of a Bundle.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct BundleSpecDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) root: String,
}

/// Where a bundle member comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberOrigin {
    /// Compiled from a local path inside the bundle.
    Vendored,
    /// An already-published catalog version `namespace.name@version`.
    External,
}

impl MemberOrigin {
    /// `vendored` or `external`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vendored => "vendored",
            Self::External => "external",
        }
    }
}

/// One member of a `bundle.lock.json`, in the reference's field order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockMember {
    /// The member agent's `metadata.name` (external members: the external name).
    pub child_name: String,
    /// `vendored` or `external`.
    pub origin: MemberOrigin,
    /// Hex sha256 of the member's canonical compiled JSON.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content_hash: String,
    /// The authoring ref: a bundle-relative path for vendored members.
    #[serde(rename = "ref", default, skip_serializing_if = "String::is_empty")]
    pub reference: String,
    /// External members only.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// External members only.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// External members only.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
}

/// The body of a lock that its hash covers: `{"root_child_name":…,"members":[…]}`.
#[derive(Debug, Serialize)]
pub(crate) struct LockBody<'a> {
    pub(crate) root_child_name: &'a str,
    pub(crate) members: &'a [LockMember],
}
