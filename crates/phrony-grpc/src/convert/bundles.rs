//! Bundles (§6.5): `BundleRef` fields in, ledger bundle records out.

use phrony_engine::ActivatedBundle;
use phrony_ledger::{
    Bundle, BundleDeployment, BundleMember, BundleRef, BundleVersion, PublishedBundle,
};
use phrony_manifest::BundleSecret;
use phrony_proto::runtime::v1 as pb;
use tonic::Status;

use super::{secret_endpoint_changes, timestamp};

/// `bundle_ref` with namespace and name; its version is returned when set.
pub(crate) fn bundle_ref(r: Option<&pb::BundleRef>) -> Result<(BundleRef, Option<String>), Status> {
    match r {
        Some(r) if !r.namespace.is_empty() && !r.name.is_empty() => Ok((
            BundleRef::new(r.namespace.clone(), r.name.clone()),
            super::optional(&r.version).map(str::to_owned),
        )),
        _ => Err(Status::invalid_argument(
            "bundle_ref requires namespace and name",
        )),
    }
}

/// `bundle_ref` with namespace, name and version (a semver or a `sha256:` lock hash).
pub(crate) fn versioned_bundle_ref(
    r: Option<&pb::BundleRef>,
) -> Result<(BundleRef, String), Status> {
    match r {
        Some(r) if !r.namespace.is_empty() && !r.name.is_empty() && !r.version.is_empty() => Ok((
            BundleRef::new(r.namespace.clone(), r.name.clone()),
            r.version.clone(),
        )),
        _ => Err(Status::invalid_argument(
            "bundle_ref requires namespace, name, and version (semver or lock hash)",
        )),
    }
}

pub(crate) fn publish_response(p: PublishedBundle) -> pb::PublishBundleResponse {
    pb::PublishBundleResponse {
        bundle_id: p.bundle_id.to_string(),
        bundle_version_id: p.version_id.to_string(),
        lock_hash: p.lock_hash,
        namespace: p.bundle.namespace,
        name: p.bundle.name,
        lock: p.lock_json.into_bytes(),
        version: p.version,
    }
}

pub(crate) fn deploy_response(bundle: &BundleRef, a: ActivatedBundle) -> pb::DeployBundleResponse {
    let d = a.deployment;
    pb::DeployBundleResponse {
        namespace: bundle.namespace.clone(),
        name: bundle.name.clone(),
        version: d.version,
        previous_version: d.previous_version.unwrap_or_default(),
        deployed_at: timestamp(d.created_at),
        lock_hash: d.lock_hash,
        previous_lock_hash: d.previous_lock_hash.unwrap_or_default(),
        secret_endpoint_changes: secret_endpoint_changes(a.changes),
    }
}

pub(crate) fn rollback_response(a: ActivatedBundle) -> pb::RollbackBundleResponse {
    let d = a.deployment;
    pb::RollbackBundleResponse {
        version: d.version,
        previous_version: d.previous_version.unwrap_or_default(),
        lock_hash: d.lock_hash,
        previous_lock_hash: d.previous_lock_hash.unwrap_or_default(),
        deployed_at: timestamp(d.created_at),
        secret_endpoint_changes: secret_endpoint_changes(a.changes),
    }
}

pub(crate) fn active_response(d: BundleDeployment) -> pb::GetActiveBundleResponse {
    pb::GetActiveBundleResponse {
        version: d.version,
        deployed_at: timestamp(d.created_at),
        actor: d.actor,
        lock_hash: d.lock_hash,
    }
}

pub(crate) fn secret_requirements_response(
    secrets: Vec<BundleSecret>,
) -> pb::GetBundleSecretRequirementsResponse {
    pb::GetBundleSecretRequirementsResponse {
        secrets: secrets
            .into_iter()
            .map(|s| {
                (
                    s.name,
                    pb::SecretRequirement {
                        from_env: s.from_env,
                        declared_by: s.declared_by,
                    },
                )
            })
            .collect(),
    }
}

pub(crate) fn list_response(bundles: Vec<Bundle>) -> pb::ListBundlesResponse {
    pb::ListBundlesResponse {
        bundles: bundles
            .into_iter()
            .map(|b| pb::BundleSummary {
                id: b.id.to_string(),
                namespace: b.bundle.namespace,
                name: b.bundle.name,
                owner: b.owner,
            })
            .collect(),
    }
}

pub(crate) fn list_versions_response(
    versions: Vec<BundleVersion>,
) -> pb::ListBundleVersionsResponse {
    pb::ListBundleVersionsResponse {
        versions: versions
            .into_iter()
            .map(|v| pb::BundleVersionSummary {
                id: v.id.to_string(),
                version: v.version,
                published_at: timestamp(v.published_at),
                lock_hash: v.lock_hash,
                published_by: v.published_by,
            })
            .collect(),
    }
}

pub(crate) fn list_deployments_response(
    deployments: Vec<BundleDeployment>,
) -> pb::ListBundleDeploymentsResponse {
    pb::ListBundleDeploymentsResponse {
        deployments: deployments
            .into_iter()
            .map(|d| pb::DeploymentEntry {
                version: d.version,
                action: d.action.as_str().to_owned(),
                actor: d.actor,
                created_at: timestamp(d.created_at),
                lock_hash: d.lock_hash,
            })
            .collect(),
    }
}

pub(crate) fn version_response(
    version: BundleVersion,
    members: Vec<BundleMember>,
    active: bool,
) -> pb::GetBundleVersionResponse {
    pb::GetBundleVersionResponse {
        bundle_version_id: version.id.to_string(),
        namespace: version.bundle.namespace,
        name: version.bundle.name,
        version: version.version,
        lock_hash: version.lock_hash,
        lock: version.lock_json.into_bytes(),
        bundle_manifest: version.manifest_json.into_bytes(),
        members: members
            .into_iter()
            .map(|m| pb::BundleMemberInfo {
                child_name: m.child_name,
                origin: m.origin.as_str().to_owned(),
                r#ref: m.reference,
                member_version_id: m.member_version_id.to_string(),
                is_root: m.is_root,
                namespace: m.agent.namespace,
                name: m.agent.name,
                version: m.agent.version,
                content_hash: m.lock_content_hash,
            })
            .collect(),
        published_at: timestamp(version.published_at),
        published_by: version.published_by,
        active,
    }
}
