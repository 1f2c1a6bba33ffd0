//! Agent lifecycle RPCs (§6.2): publish, deploy, rollback, deprecate, retire, archive, and the
//! read-only views. The ledger implements the semantics (Deploy and Rollback go through
//! `phrony_engine::activate`, which checks where the version sends its secrets first); this
//! module converts and logs.

use phrony_auth::Attribution;
use phrony_engine::{Activated, Activation};
use phrony_ledger::{AgentRef, NewAgentVersion};
use phrony_proto::runtime::v1 as pb;
use tonic::Status;

use super::RuntimeService;
use crate::convert::{self, ledger_status};
use crate::publish;

/// The runtime's release version, reported by GetVersion.
const RUNTIME_VERSION: &str = env!("CARGO_PKG_VERSION");

impl RuntimeService {
    pub(super) async fn get_version_impl(&self) -> Result<pb::GetVersionResponse, Status> {
        let schema = self.ledger.schema_version().await.map_err(ledger_status)?;
        Ok(convert::version_response(RUNTIME_VERSION, schema))
    }

    pub(super) async fn publish_impl(
        &self,
        request: pb::PublishRequest,
        actor: Attribution,
    ) -> Result<pb::PublishResponse, Status> {
        let verified =
            publish::verify(&request.manifest).map_err(|e| convert::snapshot_status(&e))?;
        let metadata = &verified.agent.metadata;
        let agent = AgentRef::new(metadata.namespace.clone(), metadata.name.clone());
        let new = NewAgentVersion {
            namespace: metadata.namespace.clone(),
            name: metadata.name.clone(),
            version: metadata.version.clone(),
            owner: metadata.owner.clone(),
            labels: metadata.labels.clone(),
            snapshot_json: verified.snapshot_json,
            content_hash: verified.content_hash,
            actor: actor.clone(),
        };
        let published = self
            .ledger
            .publish_agent_version(new)
            .await
            .map_err(ledger_status)?;
        if published.created {
            tracing::info!(
                agent = %agent, version = %published.version, content_hash = %published.content_hash,
                %actor, "published agent version"
            );
        } else {
            tracing::info!(
                agent = %agent, version = %published.version, %actor,
                "re-publish of identical content; returning the existing version"
            );
        }
        Ok(convert::publish_response(published))
    }

    pub(super) async fn deploy_impl(
        &self,
        request: pb::DeployRequest,
        actor: Attribution,
    ) -> Result<pb::DeployResponse, Status> {
        let (agent, version) = convert::versioned_agent_ref(request.agent_ref.as_ref())?;
        let activated = self
            .activate(
                &agent,
                Activation::Deploy(&version),
                request.allow_new_secret_endpoints,
                &actor,
            )
            .await?;
        let deployment = &activated.deployment;
        tracing::info!(
            agent = %agent, %version, previous = deployment.previous_version.as_deref().unwrap_or(""),
            new_secret_endpoints = activated.changes.len(), %actor, "deployed agent version"
        );
        Ok(convert::deploy_response(agent, activated))
    }

    pub(super) async fn rollback_impl(
        &self,
        request: pb::RollbackRequest,
        actor: Attribution,
    ) -> Result<pb::RollbackResponse, Status> {
        let agent = convert::agent_ref(request.agent_ref.as_ref())?;
        let to = convert::optional(&request.to_version);
        let activated = self
            .activate(
                &agent,
                Activation::Rollback(to),
                request.allow_new_secret_endpoints,
                &actor,
            )
            .await?;
        let deployment = &activated.deployment;
        tracing::info!(
            agent = %agent, version = %deployment.version,
            previous = deployment.previous_version.as_deref().unwrap_or(""),
            new_secret_endpoints = activated.changes.len(), %actor, "rolled back agent"
        );
        Ok(convert::rollback_response(activated))
    }

    /// A deploy or rollback through [`phrony_engine::activate`]: secrets follow the endpoints
    /// of earlier deployments, as the engine's providers resolve them (a service without an
    /// engine runs no sessions and assumes the vendors' default endpoints).
    async fn activate(
        &self,
        agent: &AgentRef,
        activation: Activation<'_>,
        allow_new_secret_endpoints: bool,
        actor: &Attribution,
    ) -> Result<Activated, Status> {
        phrony_engine::activate(
            &self.ledger,
            self.secret_providers(),
            agent,
            activation,
            allow_new_secret_endpoints,
            actor,
        )
        .await
        .map_err(convert::activation_status)
    }

    pub(super) async fn get_active_version_impl(
        &self,
        request: pb::GetActiveVersionRequest,
    ) -> Result<pb::GetActiveVersionResponse, Status> {
        let agent = convert::agent_ref(request.agent_ref.as_ref())?;
        let deployment = self
            .ledger
            .active_version(&agent)
            .await
            .map_err(ledger_status)?;
        Ok(convert::active_version_response(deployment))
    }

    pub(super) async fn list_deployments_impl(
        &self,
        request: pb::ListDeploymentsRequest,
    ) -> Result<pb::ListDeploymentsResponse, Status> {
        let agent = convert::agent_ref(request.agent_ref.as_ref())?;
        let deployments = self
            .ledger
            .list_deployments(&agent)
            .await
            .map_err(ledger_status)?;
        Ok(convert::list_deployments_response(deployments))
    }

    pub(super) async fn get_agent_version_impl(
        &self,
        request: pb::GetAgentVersionRequest,
    ) -> Result<pb::GetAgentVersionResponse, Status> {
        let (agent, version) = convert::versioned_agent_ref(request.agent_ref.as_ref())?;
        let found = self
            .ledger
            .get_agent_version(&agent, &version)
            .await
            .map_err(ledger_status)?;
        Ok(convert::agent_version_response(found))
    }

    pub(super) async fn list_agents_impl(
        &self,
        request: pb::ListAgentsRequest,
    ) -> Result<pb::ListAgentsResponse, Status> {
        let namespace = convert::optional(&request.namespace);
        let agents = self
            .ledger
            .list_agents(namespace)
            .await
            .map_err(ledger_status)?;
        Ok(convert::list_agents_response(agents))
    }

    pub(super) async fn list_agent_versions_impl(
        &self,
        request: pb::ListAgentVersionsRequest,
    ) -> Result<pb::ListAgentVersionsResponse, Status> {
        let agent = convert::agent_ref(request.agent_ref.as_ref())?;
        let versions = self
            .ledger
            .list_agent_versions(&agent)
            .await
            .map_err(ledger_status)?;
        Ok(convert::list_agent_versions_response(versions))
    }

    pub(super) async fn deprecate_impl(
        &self,
        request: pb::DeprecateAgentVersionRequest,
        actor: Attribution,
    ) -> Result<pb::DeprecateAgentVersionResponse, Status> {
        let (agent, version) = convert::versioned_agent_ref(request.agent_ref.as_ref())?;
        let deprecated = self
            .ledger
            .deprecate_version(&agent, &version, &actor)
            .await
            .map_err(ledger_status)?;
        tracing::info!(agent = %agent, %version, %actor, "deprecated agent version");
        Ok(convert::deprecate_response(deprecated))
    }

    pub(super) async fn retire_impl(
        &self,
        request: pb::RetireAgentVersionRequest,
        actor: Attribution,
    ) -> Result<pb::RetireAgentVersionResponse, Status> {
        let (agent, version) = convert::versioned_agent_ref(request.agent_ref.as_ref())?;
        let retired = self
            .ledger
            .retire_version(&agent, &version, &actor)
            .await
            .map_err(ledger_status)?;
        tracing::info!(
            agent = %agent, %version, %actor, ended_sessions = ?&retired.ended_sessions,
            "retired agent version"
        );
        self.stop_ended(&retired.ended_sessions).await;
        Ok(convert::retire_response(retired.version))
    }

    pub(super) async fn archive_impl(
        &self,
        request: pb::ArchiveAgentRequest,
        actor: Attribution,
    ) -> Result<pb::ArchiveAgentResponse, Status> {
        let agent = convert::agent_ref(request.agent_ref.as_ref())?;
        let archived = self
            .ledger
            .archive_agent(&agent, &actor)
            .await
            .map_err(ledger_status)?;
        tracing::info!(
            agent = %agent, %actor, deprecated_versions = ?&archived.deprecated_versions,
            ended_sessions = ?&archived.ended_sessions, "archived agent"
        );
        self.stop_ended(&archived.ended_sessions).await;
        Ok(convert::archive_response(archived))
    }

    /// The ledger ended these sessions with the lifecycle change (committed): their drivers
    /// stop now. A failure here changes nothing durable, so it is only logged.
    async fn stop_ended(&self, session_ids: &[String]) {
        if session_ids.is_empty() {
            return;
        }
        if let Ok(engine) = self.engine()
            && let Err(e) = engine.stop_ended_sessions(session_ids).await
        {
            tracing::warn!(error = %e, "could not stop the drivers of ended sessions");
        }
    }
}
