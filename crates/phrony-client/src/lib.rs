//! The typed client of the Phrony runtime: what the `phrony` CLI (and Rust tests) call instead
//! of touching protobuf. It depends on the generated code of `phrony-proto` and on no ledger, SQL
//! driver or session engine (a test of the `cli` package checks the dependency tree).
//!
//! [`Client::connect`] opens a plaintext HTTP/2 channel (failing fast with
//! [`ClientError::Unreachable`] when nothing listens), and each method performs one RPC and
//! returns plain values ([`Deployed`], [`AgentVersionSummary`]…: timestamps parsed, "empty means
//! unset" strings as `Option`s). Errors keep the gRPC code and the server's message, so a CLI can
//! render `publish: agent demo/x version "1.0.0" … (AlreadyExists)`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), phrony_client::ClientError> {
//! use phrony_client::{AgentName, Client};
//! let client = Client::connect("127.0.0.1:7777").await?;
//! let agent = AgentName::new("support", "refund-agent");
//! let deployed = client.deploy(&agent, "0.1.0", "alice").await?;
//! println!("deployed {agent}@{} at {}", deployed.version, deployed.deployed_at);
//! # Ok(()) }
//! ```
//!
//! # Actors
//!
//! Every change names its actor. It travels in the request's `actor` field where the message
//! has one, and always in the [`ACTOR_HEADER`] metadata, the only way to
//! name the actor of Deprecate, Retire and Archive.

/// Actor names (the rule lives in `phrony-auth`, shared with the server).
pub use phrony_auth::actor;
mod approvals;
mod error;
pub mod interactive;
mod sessions;
mod types;

use std::time::Duration;

use phrony_manifest::CompiledAgent;
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

pub use approvals::{
    Approval, ApprovalFilter, ApprovalPage, DecideApproval, Decision, DecisionOutcome,
    OUTCOME_REVIEW, Vote, display_actor,
};
pub use error::{ClientError, Code};
pub use sessions::{
    PayloadRef, RunSession, SessionAgent, SessionDetail, SessionEvent, SessionFilter,
    SessionInspection, SessionMode, SessionOutput, SessionPage, SessionSummary, StartedSession,
    TimelineDetail, TimelineEntry, TokenUsage, ToolInvocation, TruncatedPayload, TurnSummary,
    VersionedName,
};
pub use types::{
    ActiveVersion, AgentName, AgentSummary, AgentVersion, AgentVersionSummary, Deployed,
    DeploymentRecord, Health, Published, RolledBack, RuntimeVersion, VersionStatus,
};

pub use phrony_auth::{ACTOR_HEADER, Actor, ActorError, is_unprintable};

/// How long [`Client::connect`] waits for the TCP connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one call waits for the runtime's answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest response message the client decodes (gRPC's default is 4 MiB). The runtime
/// accepts payloads up to its 4 MiB message limit, and a response such as `GetApproval` may
/// carry two of them (the proposed and the edited arguments), hence the headroom.
/// `InspectSession` (3 MiB) and `GetSessionPayload` (1 MiB chunks) stay under the default
/// whatever the session holds.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// A connection to a Phrony runtime. Cheap to clone; calls may run concurrently.
#[derive(Debug, Clone)]
pub struct Client {
    runtime: RuntimeClient<Channel>,
    health: HealthClient<Channel>,
    addr: String,
}

impl Client {
    /// Connects to the runtime at `addr`: `host:port`, or an `http://host:port` URI.
    ///
    /// # Errors
    /// [`ClientError::InvalidAddress`] for an address that does not parse (or asks for TLS,
    /// which this release does not speak); [`ClientError::Unreachable`] when no connection could
    /// be opened within [`CONNECT_TIMEOUT`].
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        let (shown, uri) = normalize_addr(addr)?;
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|e| ClientError::InvalidAddress {
                addr: addr.to_owned(),
                reason: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| ClientError::from_transport(&e, &shown, CONNECT_TIMEOUT))?;
        Ok(Self {
            runtime: RuntimeClient::new(channel.clone())
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            health: HealthClient::new(channel),
            addr: shown,
        })
    }

    /// The runtime's address as given to [`connect`](Self::connect) (without scheme).
    #[must_use]
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn status(&self, status: &tonic::Status) -> ClientError {
        ClientError::from_status(status, &self.addr, REQUEST_TIMEOUT)
    }

    /// The runtime's release and schema version (`GetVersion`).
    ///
    /// # Errors
    /// Any [`ClientError`].
    pub async fn get_version(&self) -> Result<RuntimeVersion, ClientError> {
        let response = self
            .runtime
            .clone()
            .get_version(pb::GetVersionRequest {})
            .await
            .map_err(|s| self.status(&s))?;
        Ok(types::runtime_version(response.into_inner()))
    }

    /// The gRPC health of the runtime service (`grpc.health.v1.Health/Check` for
    /// `phrony.runtime.v1.Runtime`).
    ///
    /// # Errors
    /// Any [`ClientError`]; a runtime without the health service answers `Unimplemented`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        let request = HealthCheckRequest {
            service: phrony_proto::RUNTIME_SERVICE_NAME.to_owned(),
        };
        let response = self
            .health
            .clone()
            .check(request)
            .await
            .map_err(|s| self.status(&s))?;
        Ok(types::health(response.into_inner().status()))
    }

    /// Publishes a compiled agent as an immutable version (`Publish`).
    ///
    /// Re-publishing identical content for an existing version succeeds and returns the
    /// existing version with [`Published::created`] false (the runtime says so in
    /// `PublishResponse.created`; a runtime that does not report it refuses re-publishes, so its
    /// successes are creations).
    ///
    /// # Errors
    /// `AlreadyExists` when the version exists with different content, `FailedPrecondition`
    /// when the agent is archived, `InvalidArgument` when the runtime rejects the snapshot; any
    /// other [`ClientError`].
    pub async fn publish(
        &self,
        agent: &CompiledAgent,
        actor: &str,
    ) -> Result<Published, ClientError> {
        let request = pb::PublishRequest {
            manifest: agent.snapshot_json(),
            actor: actor.to_owned(),
        };
        let response = self
            .runtime
            .clone()
            .publish(with_actor(request, actor))
            .await
            .map_err(|s| self.status(&s))?;
        Ok(types::published(response.into_inner()))
    }

    /// Activates a published version (`Deploy`).
    ///
    /// # Errors
    /// `NotFound` for an unknown agent or version, `FailedPrecondition` when the agent is
    /// archived or the version retired; any other [`ClientError`].
    pub async fn deploy(
        &self,
        agent: &AgentName,
        version: &str,
        actor: &str,
    ) -> Result<Deployed, ClientError> {
        let request = pb::DeployRequest {
            agent_ref: Some(agent.to_pb(version)),
            actor: actor.to_owned(),
        };
        let response = self
            .runtime
            .clone()
            .deploy(with_actor(request, actor))
            .await
            .map_err(|s| self.status(&s))?;
        types::deployed(response.into_inner())
    }

    /// Re-activates the previous deployment, or `to` (`Rollback`).
    ///
    /// # Errors
    /// `FailedPrecondition` without an active or previous deployment, or when `to` is retired;
    /// `NotFound` for an unknown `to`; any other [`ClientError`].
    pub async fn rollback(
        &self,
        agent: &AgentName,
        to: Option<&str>,
        actor: &str,
    ) -> Result<RolledBack, ClientError> {
        let request = pb::RollbackRequest {
            agent_ref: Some(agent.to_pb("")),
            to_version: to.unwrap_or_default().to_owned(),
            actor: actor.to_owned(),
        };
        let response = self
            .runtime
            .clone()
            .rollback(with_actor(request, actor))
            .await
            .map_err(|s| self.status(&s))?;
        Ok(types::rolled_back(response.into_inner()))
    }

    /// The active deployment of an agent (`GetActiveVersion`).
    ///
    /// # Errors
    /// `FailedPrecondition` when nothing is deployed; `NotFound` for an unknown agent; any
    /// other [`ClientError`].
    pub async fn active_version(&self, agent: &AgentName) -> Result<ActiveVersion, ClientError> {
        let request = pb::GetActiveVersionRequest {
            agent_ref: Some(agent.to_pb("")),
        };
        let response = self
            .runtime
            .clone()
            .get_active_version(request)
            .await
            .map_err(|s| self.status(&s))?;
        types::active_version(response.into_inner())
    }

    /// The deployment history of an agent, newest first (`ListDeployments`).
    ///
    /// # Errors
    /// `NotFound` for an unknown agent; any other [`ClientError`].
    pub async fn list_deployments(
        &self,
        agent: &AgentName,
    ) -> Result<Vec<DeploymentRecord>, ClientError> {
        let request = pb::ListDeploymentsRequest {
            agent_ref: Some(agent.to_pb("")),
        };
        let response = self
            .runtime
            .clone()
            .list_deployments(request)
            .await
            .map_err(|s| self.status(&s))?;
        types::deployments(response.into_inner())
    }

    /// A published version with its stored manifest (`GetAgentVersion`).
    ///
    /// # Errors
    /// `NotFound` for an unknown agent or version; any other [`ClientError`].
    pub async fn get_agent_version(
        &self,
        agent: &AgentName,
        version: &str,
    ) -> Result<AgentVersion, ClientError> {
        let request = pb::GetAgentVersionRequest {
            agent_ref: Some(agent.to_pb(version)),
        };
        let response = self
            .runtime
            .clone()
            .get_agent_version(request)
            .await
            .map_err(|s| self.status(&s))?;
        types::agent_version(response.into_inner())
    }

    /// The agents in the catalog, archived ones included, ordered by namespace and name
    /// (`ListAgents`), optionally of one namespace.
    ///
    /// # Errors
    /// Any [`ClientError`].
    pub async fn list_agents(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<AgentSummary>, ClientError> {
        let request = pb::ListAgentsRequest {
            namespace: namespace.unwrap_or_default().to_owned(),
        };
        let response = self
            .runtime
            .clone()
            .list_agents(request)
            .await
            .map_err(|s| self.status(&s))?;
        types::agents(response.into_inner())
    }

    /// The published versions of an agent, newest first (`ListAgentVersions`).
    ///
    /// # Errors
    /// `NotFound` for an unknown agent; any other [`ClientError`].
    pub async fn list_agent_versions(
        &self,
        agent: &AgentName,
    ) -> Result<Vec<AgentVersionSummary>, ClientError> {
        let request = pb::ListAgentVersionsRequest {
            agent_ref: Some(agent.to_pb("")),
        };
        let response = self
            .runtime
            .clone()
            .list_agent_versions(request)
            .await
            .map_err(|s| self.status(&s))?;
        types::agent_versions(response.into_inner())
    }

    /// Deprecates a version (`DeprecateAgentVersion`); returns the version's id.
    ///
    /// # Errors
    /// `NotFound` for an unknown or already deprecated version, `FailedPrecondition` for an
    /// archived agent; [`ClientError::InvalidActor`]; any other [`ClientError`].
    pub async fn deprecate(
        &self,
        agent: &AgentName,
        version: &str,
        actor: &str,
    ) -> Result<String, ClientError> {
        let request = pb::DeprecateAgentVersionRequest {
            agent_ref: Some(agent.to_pb(version)),
        };
        let response = self
            .runtime
            .clone()
            .deprecate_agent_version(with_required_actor(request, actor)?)
            .await
            .map_err(|s| self.status(&s))?;
        Ok(response.into_inner().version_id)
    }

    /// Retires a version (`RetireAgentVersion`); returns the version's id.
    ///
    /// # Errors
    /// `NotFound` for an unknown or already retired version, `FailedPrecondition` for an
    /// archived agent; [`ClientError::InvalidActor`]; any other [`ClientError`].
    pub async fn retire(
        &self,
        agent: &AgentName,
        version: &str,
        actor: &str,
    ) -> Result<String, ClientError> {
        let request = pb::RetireAgentVersionRequest {
            agent_ref: Some(agent.to_pb(version)),
        };
        let response = self
            .runtime
            .clone()
            .retire_agent_version(with_required_actor(request, actor)?)
            .await
            .map_err(|s| self.status(&s))?;
        Ok(response.into_inner().version_id)
    }

    /// Archives an agent and deprecates all its versions (`ArchiveAgent`).
    ///
    /// # Errors
    /// `FailedPrecondition` when already archived, `NotFound` for an unknown agent;
    /// [`ClientError::InvalidActor`]; any other [`ClientError`].
    pub async fn archive(&self, agent: &AgentName, actor: &str) -> Result<(), ClientError> {
        let request = pb::ArchiveAgentRequest {
            agent_ref: Some(agent.to_pb("")),
        };
        self.runtime
            .clone()
            .archive_agent(with_required_actor(request, actor)?)
            .await
            .map_err(|s| self.status(&s))?;
        Ok(())
    }
}

/// Splits a runtime address into its display form (`host:port`) and the URI to dial.
fn normalize_addr(addr: &str) -> Result<(String, String), ClientError> {
    let invalid = |reason: &str| ClientError::InvalidAddress {
        addr: addr.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = addr.trim();
    if trimmed.is_empty() {
        return Err(invalid("empty; expected host:port"));
    }
    if trimmed.starts_with("https://") {
        return Err(invalid(
            "TLS is not supported by this release; use host:port (plaintext)",
        ));
    }
    let host_port = trimmed
        .strip_prefix("http://")
        .unwrap_or(trimmed)
        .trim_end_matches('/');
    if host_port.contains("://") || host_port.contains('/') {
        return Err(invalid("expected host:port"));
    }
    let port_ok = host_port
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !port_ok {
        return Err(invalid("expected host:port, e.g. 127.0.0.1:7777"));
    }
    Ok((host_port.to_owned(), format!("http://{host_port}")))
}

/// A request carrying the actor header, when the actor can travel as one (the message's own
/// `actor` field carries it regardless).
fn with_actor<T>(message: T, actor: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Ok(value) = MetadataValue::try_from(actor) {
        request.metadata_mut().insert(ACTOR_HEADER, value);
    }
    request
}

/// A request whose only way to name the actor is the header.
fn with_required_actor<T>(message: T, actor: &str) -> Result<tonic::Request<T>, ClientError> {
    let value = MetadataValue::try_from(actor).map_err(|_| ClientError::InvalidActor {
        actor: actor.to_owned(),
    })?;
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(ACTOR_HEADER, value);
    Ok(request)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn addresses_accept_host_port_and_http_uris() {
        assert_eq!(
            normalize_addr("127.0.0.1:7777").unwrap(),
            (
                "127.0.0.1:7777".to_owned(),
                "http://127.0.0.1:7777".to_owned()
            )
        );
        assert_eq!(
            normalize_addr("http://localhost:9000/").unwrap().0,
            "localhost:9000"
        );
        assert_eq!(normalize_addr("[::1]:7777").unwrap().1, "http://[::1]:7777");
        for bad in [
            "",
            "localhost",
            "localhost:http",
            ":7777",
            "https://h:1",
            "h:1/path",
        ] {
            let err = normalize_addr(bad).unwrap_err();
            assert!(
                matches!(err, ClientError::InvalidAddress { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable_with_the_reason() {
        // Bind then drop: the port is free and refuses connections.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let err = Client::connect(&addr).await.unwrap_err();
        assert!(err.is_unreachable(), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("cannot reach the phrony runtime at {addr} (connection refused)")
        );
    }

    #[test]
    fn server_statuses_keep_code_and_message() {
        let status = tonic::Status::already_exists("agent demo/x version \"1.0.0\" is immutable");
        let err = ClientError::from_status(&status, "h:1", REQUEST_TIMEOUT);
        assert_eq!(err.code(), Some(Code::AlreadyExists));
        assert_eq!(
            err.to_string(),
            "agent demo/x version \"1.0.0\" is immutable (AlreadyExists)"
        );
        let unavailable = tonic::Status::unavailable("the runtime's database is unavailable");
        let err = ClientError::from_status(&unavailable, "h:1", REQUEST_TIMEOUT);
        assert_eq!(
            err.code(),
            Some(Code::Unavailable),
            "a server-sent status stays an RPC error"
        );
    }

    #[test]
    fn non_ascii_actors_cannot_name_header_only_changes() {
        let err = with_required_actor((), "josé\n").unwrap_err();
        assert!(matches!(err, ClientError::InvalidActor { .. }), "{err}");
        assert!(with_required_actor((), "alice@example.com").is_ok());
    }
}
