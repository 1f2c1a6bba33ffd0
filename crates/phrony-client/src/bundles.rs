//! Bundles: publish one (`PublishBundle`), deploy and roll back its versions (`DeployBundle`,
//! `RollbackBundle`), and read the catalog (`GetActiveBundle`, `ListBundles`,
//! `ListBundleVersions`, `ListBundleDeployments`, `GetBundleVersion`,
//! `GetBundleSecretRequirements`).
//!
//! A bundle is named like an agent (`namespace/name`, an [`AgentName`]); its versions are a
//! semver label or a `sha256:` lock hash. Each answer converts from its wire message with
//! `TryFrom` (public, so a renderer can be tested on a constructed response).

use chrono::{DateTime, Utc};
use phrony_proto::runtime::v1 as pb;

use super::types::{
    DeploymentRecord, SecretEndpointChange, optional, optional_timestamp, secret_endpoint_changes,
    timestamp,
};
use super::{AgentName, Client, ClientError, with_actor};

impl AgentName {
    pub(crate) fn to_bundle_pb(&self, version: &str) -> pb::BundleRef {
        pb::BundleRef {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            version: version.to_owned(),
        }
    }
}

/// What [`Client::publish_bundle`] sends: the Bundle document, its members and the committed
/// lock, as `phrony bundles publish` read and compiled them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishBundle {
    /// The Bundle document (canonical JSON).
    pub bundle_manifest: Vec<u8>,
    /// The closure's members, root first.
    pub members: Vec<BundleMemberPackage>,
    /// The committed `bundle.lock.json`, byte for byte.
    pub committed_lock: Vec<u8>,
}

/// One member of a [`PublishBundle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleMemberPackage {
    /// The member's name inside the bundle (its agent `metadata.name`).
    pub child_name: String,
    /// `vendored` or `external`.
    pub origin: String,
    /// Where it came from: a bundle-relative path (vendored) or `namespace.name@version`.
    pub authoring_ref: String,
    /// The compiled snapshot of a vendored member (JSON).
    pub resolved_manifest: Vec<u8>,
    /// True for the root member.
    pub is_root: bool,
}

/// A bundle version stored by `PublishBundle`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedBundle {
    /// The bundle.
    pub bundle: AgentName,
    /// The semver label.
    pub version: String,
    /// The lock hash (`sha256:…`).
    pub lock_hash: String,
    /// The bundle's id.
    pub bundle_id: String,
    /// The version's id.
    pub bundle_version_id: String,
    /// The stored lock (JSON).
    pub lock_json: String,
}

/// The outcome of `DeployBundle`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployedBundle {
    /// The bundle.
    pub bundle: AgentName,
    /// The version now active.
    pub version: String,
    /// Its lock hash.
    pub lock_hash: String,
    /// The version active before; `None` on the first deployment.
    pub previous_version: Option<String>,
    /// The lock hash of the version active before.
    pub previous_lock_hash: Option<String>,
    /// When the deployment was recorded.
    pub deployed_at: DateTime<Utc>,
    /// The members' secrets it sends to an endpoint no earlier deployment of the bundle used
    /// (allowed explicitly), each naming its member.
    pub secret_endpoint_changes: Vec<SecretEndpointChange>,
}

/// The outcome of `RollbackBundle`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolledBackBundle {
    /// The version active after the rollback.
    pub version: String,
    /// Its lock hash.
    pub lock_hash: String,
    /// The version active before it.
    pub previous_version: Option<String>,
    /// The lock hash of the version active before it.
    pub previous_lock_hash: Option<String>,
    /// When the rollback was recorded (`None` when the runtime did not say).
    pub deployed_at: Option<DateTime<Utc>>,
    /// As [`DeployedBundle::secret_endpoint_changes`].
    pub secret_endpoint_changes: Vec<SecretEndpointChange>,
}

/// The active deployment of a bundle (`GetActiveBundle`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveBundle {
    /// The active version.
    pub version: String,
    /// Its lock hash.
    pub lock_hash: String,
    /// When it was deployed (or rolled back to).
    pub deployed_at: DateTime<Utc>,
    /// Who deployed it.
    pub actor: String,
}

/// A bundle in the catalog (`ListBundles`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSummary {
    /// The bundle's id.
    pub id: String,
    /// The bundle.
    pub bundle: AgentName,
    /// Its owner, when the runtime recorded one.
    pub owner: Option<String>,
}

/// One version in a bundle's version list (`ListBundleVersions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleVersionSummary {
    /// The version's id.
    pub id: String,
    /// The semver label.
    pub version: String,
    /// The lock hash (`sha256:…`).
    pub lock_hash: String,
    /// When it was published.
    pub published_at: DateTime<Utc>,
    /// Who published it, when the runtime recorded it.
    pub published_by: Option<String>,
}

/// One secret a bundle's members declare (`GetBundleSecretRequirements`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSecretRequirement {
    /// The secret's name (`secrets.<name>`).
    pub name: String,
    /// The environment variable its value is read from.
    pub from_env: String,
    /// The members (child names) that declare it.
    pub declared_by: Vec<String>,
}

/// One member of a published bundle version (`GetBundleVersion`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleMemberInfo {
    /// The member's name inside the bundle.
    pub child_name: String,
    /// `vendored` or `external`.
    pub origin: String,
    /// The ref recorded in the lock.
    pub reference: String,
    /// The agent version the member runs.
    pub member_version_id: String,
    /// True for the root member.
    pub is_root: bool,
    /// The member agent as its manifest names it.
    pub agent: AgentName,
    /// The member's own `metadata.version`.
    pub version: String,
    /// The member's content hash as the lock records it.
    pub content_hash: String,
}

/// One published bundle version with its lock, document and members (`GetBundleVersion`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleVersion {
    /// The bundle.
    pub bundle: AgentName,
    /// The semver label.
    pub version: String,
    /// The version's id.
    pub bundle_version_id: String,
    /// The lock hash (`sha256:…`).
    pub lock_hash: String,
    /// The stored `bundle.lock.json`.
    pub lock_json: String,
    /// The Bundle document as published (JSON).
    pub manifest_json: String,
    /// The members, in the runtime's order.
    pub members: Vec<BundleMemberInfo>,
    /// When it was published.
    pub published_at: DateTime<Utc>,
    /// Who published it, when the runtime recorded it.
    pub published_by: Option<String>,
    /// Whether it is the active deployment.
    pub active: bool,
}

// ---------------------------------------------------------------------------------------------
// Wire → client values

fn utf8(rpc: &'static str, field: &str, bytes: Vec<u8>) -> Result<String, ClientError> {
    String::from_utf8(bytes)
        .map_err(|e| ClientError::invalid_response(rpc, format!("{field}: {e}")))
}

impl TryFrom<pb::PublishBundleResponse> for PublishedBundle {
    type Error = ClientError;

    fn try_from(r: pb::PublishBundleResponse) -> Result<Self, ClientError> {
        Ok(Self {
            lock_json: utf8("PublishBundle", "lock", r.lock)?,
            bundle: AgentName::new(r.namespace, r.name),
            version: r.version,
            lock_hash: r.lock_hash,
            bundle_id: r.bundle_id,
            bundle_version_id: r.bundle_version_id,
        })
    }
}

impl TryFrom<pb::DeployBundleResponse> for DeployedBundle {
    type Error = ClientError;

    fn try_from(r: pb::DeployBundleResponse) -> Result<Self, ClientError> {
        Ok(Self {
            deployed_at: timestamp("DeployBundle", "deployed_at", &r.deployed_at)?,
            bundle: AgentName::new(r.namespace, r.name),
            version: r.version,
            lock_hash: r.lock_hash,
            previous_version: optional(r.previous_version),
            previous_lock_hash: optional(r.previous_lock_hash),
            secret_endpoint_changes: secret_endpoint_changes(r.secret_endpoint_changes),
        })
    }
}

impl TryFrom<pb::RollbackBundleResponse> for RolledBackBundle {
    type Error = ClientError;

    fn try_from(r: pb::RollbackBundleResponse) -> Result<Self, ClientError> {
        Ok(Self {
            deployed_at: optional_timestamp("RollbackBundle", "deployed_at", &r.deployed_at)?,
            version: r.version,
            lock_hash: r.lock_hash,
            previous_version: optional(r.previous_version),
            previous_lock_hash: optional(r.previous_lock_hash),
            secret_endpoint_changes: secret_endpoint_changes(r.secret_endpoint_changes),
        })
    }
}

impl TryFrom<pb::GetActiveBundleResponse> for ActiveBundle {
    type Error = ClientError;

    fn try_from(r: pb::GetActiveBundleResponse) -> Result<Self, ClientError> {
        Ok(Self {
            deployed_at: timestamp("GetActiveBundle", "deployed_at", &r.deployed_at)?,
            version: r.version,
            lock_hash: r.lock_hash,
            actor: r.actor,
        })
    }
}

/// `ListBundles`: the bundles, in the runtime's order (namespace, then name).
pub fn bundles_from_pb(r: pb::ListBundlesResponse) -> Vec<BundleSummary> {
    r.bundles
        .into_iter()
        .map(|b| BundleSummary {
            id: b.id,
            bundle: AgentName::new(b.namespace, b.name),
            owner: optional(b.owner),
        })
        .collect()
}

/// `ListBundleVersions`: the versions, in the runtime's order (newest first).
///
/// # Errors
/// [`ClientError::InvalidResponse`] for a malformed timestamp.
pub fn bundle_versions_from_pb(
    r: pb::ListBundleVersionsResponse,
) -> Result<Vec<BundleVersionSummary>, ClientError> {
    r.versions
        .into_iter()
        .map(|v| {
            Ok(BundleVersionSummary {
                published_at: timestamp("ListBundleVersions", "published_at", &v.published_at)?,
                id: v.id,
                version: v.version,
                lock_hash: v.lock_hash,
                published_by: optional(v.published_by),
            })
        })
        .collect()
}

/// `ListBundleDeployments`: the deploy and rollback rows, in the runtime's order (newest first),
/// each with its lock hash.
///
/// # Errors
/// [`ClientError::InvalidResponse`] for a malformed timestamp.
pub fn bundle_deployments_from_pb(
    r: pb::ListBundleDeploymentsResponse,
) -> Result<Vec<DeploymentRecord>, ClientError> {
    super::types::deployment_records("ListBundleDeployments", r.deployments)
}

/// `GetBundleSecretRequirements`: the secret union, sorted by secret name, each `declared_by`
/// sorted too.
pub fn secret_requirements_from_pb(
    r: pb::GetBundleSecretRequirementsResponse,
) -> Vec<BundleSecretRequirement> {
    let mut secrets: Vec<BundleSecretRequirement> = r
        .secrets
        .into_iter()
        .map(|(name, s)| {
            let mut declared_by = s.declared_by;
            declared_by.sort();
            BundleSecretRequirement {
                name,
                from_env: s.from_env,
                declared_by,
            }
        })
        .collect();
    secrets.sort_by(|a, b| a.name.cmp(&b.name));
    secrets
}

impl TryFrom<pb::GetBundleVersionResponse> for BundleVersion {
    type Error = ClientError;

    fn try_from(r: pb::GetBundleVersionResponse) -> Result<Self, ClientError> {
        const RPC: &str = "GetBundleVersion";
        Ok(Self {
            lock_json: utf8(RPC, "lock", r.lock)?,
            manifest_json: utf8(RPC, "bundle_manifest", r.bundle_manifest)?,
            published_at: timestamp(RPC, "published_at", &r.published_at)?,
            bundle: AgentName::new(r.namespace, r.name),
            version: r.version,
            bundle_version_id: r.bundle_version_id,
            lock_hash: r.lock_hash,
            members: r
                .members
                .into_iter()
                .map(|m| BundleMemberInfo {
                    child_name: m.child_name,
                    origin: m.origin,
                    reference: m.r#ref,
                    member_version_id: m.member_version_id,
                    is_root: m.is_root,
                    agent: AgentName::new(m.namespace, m.name),
                    version: m.version,
                    content_hash: m.content_hash,
                })
                .collect(),
            published_by: optional(r.published_by),
            active: r.active,
        })
    }
}

impl Client {
    /// Publishes a bundle version (`PublishBundle`). The runtime recomputes the lock from the
    /// members and refuses any drift from `committed_lock`.
    ///
    /// # Errors
    /// `InvalidArgument` for a document, member or lock the runtime refuses (`committed_lock
    /// drift: …`), `AlreadyExists` for a version label or lock hash already published; any
    /// other [`ClientError`].
    pub async fn publish_bundle(
        &self,
        bundle: &PublishBundle,
        actor: &str,
    ) -> Result<PublishedBundle, ClientError> {
        let request = pb::PublishBundleRequest {
            bundle_manifest: bundle.bundle_manifest.clone(),
            members: bundle
                .members
                .iter()
                .map(|m| pb::BundleMemberPackage {
                    child_name: m.child_name.clone(),
                    origin: m.origin.clone(),
                    authoring_ref: m.authoring_ref.clone(),
                    resolved_manifest: m.resolved_manifest.clone(),
                    is_root: m.is_root,
                    member_version_id: String::new(),
                })
                .collect(),
            actor: actor.to_owned(),
            committed_lock: bundle.committed_lock.clone(),
        };
        let response = self
            .runtime
            .clone()
            .publish_bundle(with_actor(request, actor))
            .await
            .map_err(|s| self.status(&s))?;
        response.into_inner().try_into()
    }

    /// Activates a published bundle version, a semver label or a `sha256:` lock hash
    /// (`DeployBundle`). `allow_new_secret_endpoints` lets a version whose members send a
    /// secret to an endpoint no earlier deployment of the bundle used be deployed (the runtime
    /// records the change and answers it in [`DeployedBundle::secret_endpoint_changes`]).
    ///
    /// # Errors
    /// `NotFound` for an unknown bundle or version; `FailedPrecondition` for a new secret
    /// endpoint without `allow_new_secret_endpoints`; any other [`ClientError`].
    pub async fn deploy_bundle(
        &self,
        bundle: &AgentName,
        version: &str,
        actor: &str,
        allow_new_secret_endpoints: bool,
    ) -> Result<DeployedBundle, ClientError> {
        let request = pb::DeployBundleRequest {
            bundle_ref: Some(bundle.to_bundle_pb(version)),
            actor: actor.to_owned(),
            allow_new_secret_endpoints,
        };
        let response = self
            .runtime
            .clone()
            .deploy_bundle(with_actor(request, actor))
            .await
            .map_err(|s| self.status(&s))?;
        response.into_inner().try_into()
    }

    /// Re-activates the previously deployed bundle version, or `to` (`RollbackBundle`);
    /// `allow_new_secret_endpoints` as in [`Client::deploy_bundle`] (only a `to` that was never
    /// deployed can send a secret somewhere new).
    ///
    /// # Errors
    /// `FailedPrecondition` without an active or previous deployment, or for a new secret
    /// endpoint without `allow_new_secret_endpoints`; `NotFound` for an unknown `to`; any other
    /// [`ClientError`].
    pub async fn rollback_bundle(
        &self,
        bundle: &AgentName,
        to: Option<&str>,
        actor: &str,
        allow_new_secret_endpoints: bool,
    ) -> Result<RolledBackBundle, ClientError> {
        let request = pb::RollbackBundleRequest {
            bundle_ref: Some(bundle.to_bundle_pb("")),
            to_version: to.unwrap_or_default().to_owned(),
            actor: actor.to_owned(),
            allow_new_secret_endpoints,
        };
        let response = self
            .runtime
            .clone()
            .rollback_bundle(with_actor(request, actor))
            .await
            .map_err(|s| self.status(&s))?;
        response.into_inner().try_into()
    }

    /// The active deployment of a bundle (`GetActiveBundle`).
    ///
    /// # Errors
    /// `FailedPrecondition` when nothing is deployed; `NotFound` for an unknown bundle; any
    /// other [`ClientError`].
    pub async fn active_bundle(&self, bundle: &AgentName) -> Result<ActiveBundle, ClientError> {
        let request = pb::GetActiveBundleRequest {
            bundle_ref: Some(bundle.to_bundle_pb("")),
        };
        let response = self
            .runtime
            .clone()
            .get_active_bundle(request)
            .await
            .map_err(|s| self.status(&s))?;
        response.into_inner().try_into()
    }

    /// The bundles in the catalog, optionally of one namespace (`ListBundles`).
    ///
    /// # Errors
    /// Any [`ClientError`].
    pub async fn list_bundles(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<BundleSummary>, ClientError> {
        let request = pb::ListBundlesRequest {
            namespace: namespace.unwrap_or_default().to_owned(),
        };
        let response = self
            .runtime
            .clone()
            .list_bundles(request)
            .await
            .map_err(|s| self.status(&s))?;
        Ok(bundles_from_pb(response.into_inner()))
    }

    /// The published versions of a bundle, newest first (`ListBundleVersions`).
    ///
    /// # Errors
    /// `NotFound` for an unknown bundle; any other [`ClientError`].
    pub async fn list_bundle_versions(
        &self,
        bundle: &AgentName,
    ) -> Result<Vec<BundleVersionSummary>, ClientError> {
        let request = pb::ListBundleVersionsRequest {
            bundle_ref: Some(bundle.to_bundle_pb("")),
        };
        let response = self
            .runtime
            .clone()
            .list_bundle_versions(request)
            .await
            .map_err(|s| self.status(&s))?;
        bundle_versions_from_pb(response.into_inner())
    }

    /// The deployment history of a bundle, newest first (`ListBundleDeployments`).
    ///
    /// # Errors
    /// `NotFound` for an unknown bundle; any other [`ClientError`].
    pub async fn list_bundle_deployments(
        &self,
        bundle: &AgentName,
    ) -> Result<Vec<DeploymentRecord>, ClientError> {
        let request = pb::ListBundleDeploymentsRequest {
            bundle_ref: Some(bundle.to_bundle_pb("")),
        };
        let response = self
            .runtime
            .clone()
            .list_bundle_deployments(request)
            .await
            .map_err(|s| self.status(&s))?;
        bundle_deployments_from_pb(response.into_inner())
    }

    /// One published bundle version with its lock, document and members (`GetBundleVersion`);
    /// `version` `None` is the active deployment.
    ///
    /// # Errors
    /// `NotFound` for an unknown bundle or version, `FailedPrecondition` without a version
    /// when nothing is deployed; any other [`ClientError`].
    pub async fn get_bundle_version(
        &self,
        bundle: &AgentName,
        version: Option<&str>,
    ) -> Result<BundleVersion, ClientError> {
        let request = pb::GetBundleVersionRequest {
            bundle_ref: Some(bundle.to_bundle_pb(version.unwrap_or_default())),
        };
        let response = self
            .runtime
            .clone()
            .get_bundle_version(request)
            .await
            .map_err(|s| self.status(&s))?;
        response.into_inner().try_into()
    }

    /// The union of the secrets a bundle version's members declare, sorted by name
    /// (`GetBundleSecretRequirements`); `version` `None` is the active deployment (an explicit
    /// one must be active).
    ///
    /// # Errors
    /// `NotFound` for an unknown bundle, `FailedPrecondition` when nothing (or another version)
    /// is deployed; any other [`ClientError`].
    pub async fn bundle_secret_requirements(
        &self,
        bundle: &AgentName,
        version: Option<&str>,
    ) -> Result<Vec<BundleSecretRequirement>, ClientError> {
        let request = pb::GetBundleSecretRequirementsRequest {
            bundle_ref: Some(bundle.to_bundle_pb(version.unwrap_or_default())),
        };
        let response = self
            .runtime
            .clone()
            .get_bundle_secret_requirements(request)
            .await
            .map_err(|s| self.status(&s))?;
        Ok(secret_requirements_from_pb(response.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn empty_strings_are_unset_and_timestamps_parse() {
        let deployed = DeployedBundle::try_from(pb::DeployBundleResponse {
            namespace: "support".into(),
            name: "desk".into(),
            version: "1.0.0".into(),
            previous_version: String::new(),
            deployed_at: "2025-01-31T09:30:00Z".into(),
            lock_hash: "sha256:ab".into(),
            previous_lock_hash: String::new(),
            secret_endpoint_changes: Vec::new(),
        })
        .unwrap();
        assert_eq!(deployed.bundle.to_string(), "support/desk");
        assert_eq!(deployed.previous_version, None);
        assert_eq!(deployed.previous_lock_hash, None);
        let rolled = RolledBackBundle::try_from(pb::RollbackBundleResponse {
            version: "1.0.0".into(),
            previous_version: "1.1.0".into(),
            lock_hash: "sha256:ab".into(),
            previous_lock_hash: "sha256:cd".into(),
            deployed_at: String::new(),
            secret_endpoint_changes: vec![pb::SecretEndpointChange {
                secret: "openai".into(),
                from_env: "OPENAI_API_KEY".into(),
                endpoint: "http://b/v1".into(),
                previous_endpoints: Vec::new(),
                member: "specialist".into(),
            }],
        })
        .unwrap();
        assert_eq!(rolled.deployed_at, None);
        assert_eq!(rolled.previous_version.as_deref(), Some("1.1.0"));
        let change = &rolled.secret_endpoint_changes[0];
        assert_eq!(change.member.as_deref(), Some("specialist"));
        assert_eq!(
            change.to_string(),
            "member \"specialist\": secret \"openai\" (OPENAI_API_KEY) is now sent to \
             http://b/v1 (no earlier deployment sent OPENAI_API_KEY)"
        );
    }

    #[test]
    fn a_malformed_timestamp_names_the_rpc_and_field() {
        let err = ActiveBundle::try_from(pb::GetActiveBundleResponse {
            version: "1.0.0".into(),
            deployed_at: "soon".into(),
            actor: "a".into(),
            lock_hash: "sha256:ab".into(),
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("unexpected GetActiveBundle response"),
            "{err}"
        );
        assert!(err.contains("deployed_at \"soon\""), "{err}");
    }

    #[test]
    fn secret_requirements_are_sorted_by_name_and_member() {
        let secrets = secret_requirements_from_pb(pb::GetBundleSecretRequirementsResponse {
            secrets: [
                (
                    "openai".to_owned(),
                    pb::SecretRequirement {
                        from_env: "OPENAI_API_KEY".into(),
                        declared_by: vec!["specialist".into(), "root".into()],
                    },
                ),
                (
                    "crm".to_owned(),
                    pb::SecretRequirement {
                        from_env: "CRM_TOKEN".into(),
                        declared_by: vec!["root".into()],
                    },
                ),
            ]
            .into_iter()
            .collect(),
        });
        let names: Vec<&str> = secrets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["crm", "openai"]);
        assert_eq!(secrets[1].declared_by, ["root", "specialist"]);
    }
}
