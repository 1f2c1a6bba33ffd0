//! What `phrony bundles publish` sends (the client side) and what the runtime accepts (the
//! server side, [`verify_publication`]).
//!
//! The wire carries three parts: the Bundle document as canonical JSON ([`BundleHeader`]), one
//! [`PublishedMember`] per closure member (vendored members carry their compiled snapshot
//! exactly as the compiler wrote it, delegation bindings still unpinned), and the committed
//! `bundle.lock.json`. The server trusts none of it: it re-derives the lock from the members,
//! refuses any drift, and pins each vendored member's local delegations to the version ids it
//! is about to store, so a bundle run is reproducible even when an agent of the same name is
//! re-published later.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::bundle::Bundle;
use crate::canonical;
use crate::model::bundle::MemberOrigin;

/// The Bundle document as published (`PublishBundleRequest.bundle_manifest`): canonical JSON,
/// unknown keys refused on the way in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleHeader {
    /// `phrony.com/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// `Bundle`.
    pub kind: String,
    /// Identity and release label.
    pub metadata: BundleHeaderMetadata,
    /// The root agent.
    pub spec: BundleHeaderSpec,
}

/// `metadata` of a published Bundle document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleHeaderMetadata {
    /// Bundle name.
    pub name: String,
    /// Bundle namespace.
    pub namespace: String,
    /// Release label (semver).
    pub version: String,
    /// Labels (omitted when empty).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// `spec` of a published Bundle document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleHeaderSpec {
    /// Bundle-relative path of the root agent, as written.
    pub root: String,
}

impl BundleHeader {
    /// The canonical JSON bytes sent as `bundle_manifest`.
    pub fn to_json(&self) -> Vec<u8> {
        canonical::to_vec(self).expect("serializing a bundle header to memory cannot fail")
    }
}

/// One member as sent by `PublishBundle` (`BundleMemberPackage`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedMember {
    /// The member agent's `metadata.name`.
    pub child_name: String,
    /// Vendored (this runtime publishes only vendored members so far).
    pub origin: MemberOrigin,
    /// The ref recorded in the lock.
    pub authoring_ref: String,
    /// The compiled snapshot (canonical JSON, delegations unpinned).
    pub snapshot_json: Vec<u8>,
    /// True for the root member (the first).
    pub is_root: bool,
}

impl Bundle {
    /// The Bundle document to publish.
    pub fn header(&self) -> BundleHeader {
        BundleHeader {
            api_version: crate::model::common::API_VERSION.to_owned(),
            kind: "Bundle".to_owned(),
            metadata: BundleHeaderMetadata {
                name: self.name.clone(),
                namespace: self.namespace.clone(),
                version: self.version.clone(),
                labels: self.labels.clone(),
            },
            spec: BundleHeaderSpec {
                root: self.root_ref.clone(),
            },
        }
    }

    /// The members to publish, root first. Fails when a member is external: publishing
    /// external members is not supported yet.
    pub fn published_members(&self) -> Result<Vec<PublishedMember>, String> {
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| match &m.vendored {
                Some((_, agent)) => Ok(PublishedMember {
                    child_name: m.child_name.clone(),
                    origin: MemberOrigin::Vendored,
                    authoring_ref: m.reference.clone(),
                    snapshot_json: agent.snapshot_json(),
                    is_root: i == 0,
                }),
                None => Err(format!(
                    "bundle has external member {:?}: publishing bundles with external members \
                     is not supported by this runtime yet",
                    m.child_name
                )),
            })
            .collect()
    }
}
