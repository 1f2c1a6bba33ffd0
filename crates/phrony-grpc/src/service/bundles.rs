//! Bundle RPCs (§6.5): publish, deploy, rollback and the read-only views.
//!
//! `phrony_manifest::verify_publication` decides whether a publication is acceptable (lock
//! recomputed from the members, no drift, local delegations pinned to the version ids stored
//! here, external ones to the published versions this module resolves first); the ledger
//! stores it, and decides deployments, in one transaction per change. Deploy and rollback go
//! through `phrony_engine::activate_bundle` first, which checks where the members send their
//! secrets. This module converts and logs.

use std::collections::HashMap;

use phrony_auth::Attribution;
use phrony_engine::{ActivatedBundle, Activation};
use phrony_ledger::{
    AgentRef, AgentVersionRef, BundleMemberOrigin, BundleRef, LedgerError, NewBundleMember,
    NewBundleVersion, VersionStatus,
};
use phrony_manifest::{
    BundleSecret, CompiledAgent, MemberOrigin, ReceivedMember, ResolvedExternal,
    external_member_ref,
};
use phrony_proto::runtime::v1 as pb;
use tonic::Status;
use uuid::Uuid;

use super::RuntimeService;
use crate::convert::bundles as conv;
use crate::convert::ledger_status;

impl RuntimeService {
    pub(super) async fn publish_bundle_impl(
        &self,
        request: pb::PublishBundleRequest,
        actor: Attribution,
    ) -> Result<pb::PublishBundleResponse, Status> {
        let received: Vec<ReceivedMember<'_>> = request
            .members
            .iter()
            .map(|m| ReceivedMember {
                child_name: &m.child_name,
                origin: &m.origin,
                authoring_ref: &m.authoring_ref,
                resolved_manifest: &m.resolved_manifest,
                is_root: m.is_root,
                member_version_id: &m.member_version_id,
            })
            .collect();
        // The version id each vendored member will be stored under: delegations are pinned to
        // it before anything is written.
        let externals = self.resolve_externals(&received).await?;
        let mut ids: HashMap<String, Uuid> = HashMap::new();
        let verified = phrony_manifest::verify_publication(
            &request.bundle_manifest,
            &received,
            &request.committed_lock,
            &externals,
            &mut |child: &str| {
                ids.entry(child.to_owned())
                    .or_insert_with(Uuid::new_v4)
                    .to_string()
            },
        )
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let header = &verified.header;
        let bundle = BundleRef::new(
            header.metadata.namespace.clone(),
            header.metadata.name.clone(),
        );
        let mut members = Vec::with_capacity(verified.members.len());
        for m in verified.members {
            let version_id = Uuid::parse_str(&m.version_id).map_err(|e| {
                tracing::error!(child = %m.child_name, error = %e, "member version id is not a UUID");
                Status::internal("internal error; see the runtime log")
            })?;
            members.push(NewBundleMember {
                origin: match m.origin {
                    MemberOrigin::Vendored => BundleMemberOrigin::Vendored,
                    MemberOrigin::External => BundleMemberOrigin::External,
                },
                agent: AgentVersionRef::new(&m.namespace, &m.name, &m.version),
                child_name: m.child_name,
                reference: m.reference,
                is_root: m.is_root,
                lock_content_hash: m.lock_content_hash,
                version_id,
                snapshot_json: m.snapshot_json,
                content_hash: m.content_hash,
            });
        }
        let new = NewBundleVersion {
            bundle: bundle.clone(),
            version: header.metadata.version.clone(),
            labels: header.metadata.labels.clone(),
            lock_hash: verified.lock.version.clone(),
            lock_json: verified.lock_json,
            manifest_json: verified.manifest_json,
            members,
            actor: actor.clone(),
        };
        let published = self
            .ledger
            .publish_bundle(&new)
            .await
            .map_err(ledger_status)?;
        if published.created {
            tracing::info!(
                bundle = %bundle, version = %published.version, lock_hash = %published.lock_hash,
                members = new.members.len(), %actor, "published bundle version"
            );
        } else {
            tracing::info!(
                bundle = %bundle, version = %published.version, %actor,
                "re-publish of an identical bundle; returning the existing version"
            );
        }
        Ok(conv::publish_response(published))
    }

    /// What each external member's ref (`namespace.name@version`) names in this runtime's
    /// catalog, by child name: a published version (not retired) of an agent that is not
    /// archived, or why not. Members whose ref does not parse are left to
    /// `verify_publication`, which reports them.
    async fn resolve_externals(
        &self,
        members: &[ReceivedMember<'_>],
    ) -> Result<HashMap<String, Result<ResolvedExternal, String>>, Status> {
        let mut found = HashMap::new();
        for m in members.iter().filter(|m| m.origin == "external") {
            let Some((namespace, name, version)) = external_member_ref(m.authoring_ref) else {
                continue;
            };
            if found.contains_key(m.child_name) {
                continue;
            }
            let agent = AgentRef::new(&namespace, &name);
            let resolved = match self.ledger.get_agent(&agent).await {
                Ok(a) if a.archived_at.is_some() => Err(format!("agent {agent} is archived")),
                Ok(_) => match self.ledger.get_agent_version(&agent, &version).await {
                    Ok(v) if v.status() == VersionStatus::Retired => {
                        Err(format!("agent {agent} version {version:?} is retired"))
                    }
                    Ok(v) => Ok(ResolvedExternal {
                        version_id: v.id.to_string(),
                        agent: Some(load_published(&v)?),
                        content_hash: v.content_hash,
                    }),
                    Err(LedgerError::NotFound { message }) => Err(message),
                    Err(e) => return Err(ledger_status(e)),
                },
                Err(LedgerError::NotFound { message }) => Err(message),
                Err(LedgerError::InvalidArgument { message }) => Err(message),
                Err(e) => return Err(ledger_status(e)),
            };
            found.insert(m.child_name.to_owned(), resolved);
        }
        Ok(found)
    }

    pub(super) async fn deploy_bundle_impl(
        &self,
        request: pb::DeployBundleRequest,
        actor: Attribution,
    ) -> Result<pb::DeployBundleResponse, Status> {
        let (bundle, version) = conv::versioned_bundle_ref(request.bundle_ref.as_ref())?;
        let activated = self
            .activate_bundle(
                &bundle,
                Activation::Deploy(&version),
                request.allow_new_secret_endpoints,
                &actor,
            )
            .await?;
        let deployment = &activated.deployment;
        tracing::info!(
            bundle = %bundle, version = %deployment.version, lock_hash = %deployment.lock_hash,
            previous = deployment.previous_version.as_deref().unwrap_or(""),
            new_secret_endpoints = activated.changes.len(), %actor, "deployed bundle version"
        );
        Ok(conv::deploy_response(&bundle, activated))
    }

    pub(super) async fn rollback_bundle_impl(
        &self,
        request: pb::RollbackBundleRequest,
        actor: Attribution,
    ) -> Result<pb::RollbackBundleResponse, Status> {
        let (bundle, _) = conv::bundle_ref(request.bundle_ref.as_ref())?;
        let to = crate::convert::optional(&request.to_version);
        let activated = self
            .activate_bundle(
                &bundle,
                Activation::Rollback(to),
                request.allow_new_secret_endpoints,
                &actor,
            )
            .await?;
        let deployment = &activated.deployment;
        tracing::info!(
            bundle = %bundle, version = %deployment.version,
            previous = deployment.previous_version.as_deref().unwrap_or(""),
            new_secret_endpoints = activated.changes.len(), %actor, "rolled back bundle"
        );
        Ok(conv::rollback_response(activated))
    }

    /// A bundle deploy or rollback through [`phrony_engine::activate_bundle`]: the members'
    /// secrets follow the endpoints of the bundle's earlier deployments.
    async fn activate_bundle(
        &self,
        bundle: &BundleRef,
        activation: Activation<'_>,
        allow_new_secret_endpoints: bool,
        actor: &Attribution,
    ) -> Result<ActivatedBundle, Status> {
        phrony_engine::activate_bundle(
            &self.ledger,
            self.secret_providers(),
            bundle,
            activation,
            allow_new_secret_endpoints,
            actor,
        )
        .await
        .map_err(crate::convert::activation_status)
    }

    pub(super) async fn get_active_bundle_impl(
        &self,
        request: pb::GetActiveBundleRequest,
    ) -> Result<pb::GetActiveBundleResponse, Status> {
        let (bundle, _) = conv::bundle_ref(request.bundle_ref.as_ref())?;
        let active = self
            .ledger
            .active_bundle(&bundle)
            .await
            .map_err(ledger_status)?;
        Ok(conv::active_response(active))
    }

    pub(super) async fn get_bundle_secret_requirements_impl(
        &self,
        request: pb::GetBundleSecretRequirementsRequest,
    ) -> Result<pb::GetBundleSecretRequirementsResponse, Status> {
        let (bundle, version) = conv::bundle_ref(request.bundle_ref.as_ref())?;
        let secrets = self.bundle_secrets(&bundle, version.as_deref()).await?;
        Ok(conv::secret_requirements_response(secrets))
    }

    pub(super) async fn list_bundles_impl(
        &self,
        request: pb::ListBundlesRequest,
    ) -> Result<pb::ListBundlesResponse, Status> {
        let namespace = crate::convert::optional(&request.namespace);
        let bundles = self
            .ledger
            .list_bundles(namespace)
            .await
            .map_err(ledger_status)?;
        Ok(conv::list_response(bundles))
    }

    pub(super) async fn list_bundle_versions_impl(
        &self,
        request: pb::ListBundleVersionsRequest,
    ) -> Result<pb::ListBundleVersionsResponse, Status> {
        let (bundle, _) = conv::bundle_ref(request.bundle_ref.as_ref())?;
        let versions = self
            .ledger
            .list_bundle_versions(&bundle)
            .await
            .map_err(ledger_status)?;
        Ok(conv::list_versions_response(versions))
    }

    pub(super) async fn list_bundle_deployments_impl(
        &self,
        request: pb::ListBundleDeploymentsRequest,
    ) -> Result<pb::ListBundleDeploymentsResponse, Status> {
        let (bundle, _) = conv::bundle_ref(request.bundle_ref.as_ref())?;
        let deployments = self
            .ledger
            .list_bundle_deployments(&bundle)
            .await
            .map_err(ledger_status)?;
        Ok(conv::list_deployments_response(deployments))
    }

    pub(super) async fn get_bundle_version_impl(
        &self,
        request: pb::GetBundleVersionRequest,
    ) -> Result<pb::GetBundleVersionResponse, Status> {
        let (bundle, version) = conv::bundle_ref(request.bundle_ref.as_ref())?;
        let (found, members, active) = self
            .ledger
            .get_bundle_version(&bundle, version.as_deref())
            .await
            .map_err(ledger_status)?;
        Ok(conv::version_response(found, members, active))
    }

    /// The union of the secrets the members of the runnable bundle version declare (an
    /// explicit version must be the active deployment).
    pub(crate) async fn bundle_secrets(
        &self,
        bundle: &BundleRef,
        version: Option<&str>,
    ) -> Result<Vec<BundleSecret>, Status> {
        let runnable = self
            .ledger
            .runnable_bundle(bundle, version)
            .await
            .map_err(ledger_status)?;
        let mut agents = Vec::with_capacity(runnable.members.len());
        for m in &runnable.members {
            agents.push((m.child_name.clone(), load_member(bundle, m)?));
        }
        phrony_manifest::bundle_secret_union(agents.iter().map(|(c, a)| (c.as_str(), a))).map_err(
            |conflicts| {
                tracing::error!(bundle = %bundle, ?conflicts, "stored bundle has secret conflicts");
                Status::data_loss(format!(
                    "the stored members of bundle {bundle} declare conflicting secrets: {}",
                    conflicts.join("; ")
                ))
            },
        )
    }
}

/// Loads a published version's stored snapshot; one that does not load is an internal error.
fn load_published(version: &phrony_ledger::AgentVersion) -> Result<CompiledAgent, Status> {
    CompiledAgent::from_snapshot_json(version.snapshot_json.as_bytes()).map_err(|e| {
        tracing::error!(
            agent = %version.agent, version = %version.version, error = %e,
            "stored agent version snapshot does not load"
        );
        Status::internal(format!(
            "the stored snapshot of agent {} version {:?} does not load; see the runtime log",
            version.agent, version.version
        ))
    })
}

/// Loads a stored member snapshot; one that does not load is an internal error.
pub(crate) fn load_member(
    bundle: &BundleRef,
    member: &phrony_ledger::BundleMember,
) -> Result<CompiledAgent, Status> {
    CompiledAgent::from_snapshot_json(member.snapshot_json.as_bytes()).map_err(|e| {
        tracing::error!(
            bundle = %bundle, child = %member.child_name, error = %e,
            "stored bundle member snapshot does not load"
        );
        Status::internal(format!(
            "the stored snapshot of member {:?} of bundle {bundle} does not load; see the \
             runtime log",
            member.child_name
        ))
    })
}
