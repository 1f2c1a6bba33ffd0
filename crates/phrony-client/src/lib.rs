//! The typed client of the Phrony runtime: what the `phrony` CLI (and Rust tests) call instead
//! of touching protobuf. It depends on the generated code of `phrony-proto` and on no ledger, SQL
//! driver or session engine (a test of the `cli` package checks the dependency tree).
//!
//! [`Client::connect`] opens a plaintext HTTP/2 channel and [`Client::connect_tls`] a TLS one
//! (verifying the runtime's certificate against the CA of [`ClientTls`], optionally presenting
//! a client certificate for mutual TLS), failing fast with [`ClientError::Unreachable`] when
//! nothing listens (or the handshake fails); and each method performs one RPC and
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
//! [`work`] is the worker side of the `Work` stream (register, heartbeat, results, nacks), on
//! which the `phrony-sdk` crate builds its `Worker`.
//!
//! # Actors
//!
//! Every change names its actor. It travels in the request's `actor` field where the message
//! has one, and always in the [`ACTOR_HEADER`] metadata, the only way to
//! name the actor of Deprecate, Retire and Archive.

/// Actor names (the rule lives in `phrony-auth`, shared with the server).
pub use phrony_auth::actor;
mod approvals;
mod audit;
mod bundles;
mod error;
pub mod interactive;
mod sessions;
mod types;
pub mod work;

use std::path::Path;
use std::time::Duration;

use phrony_manifest::CompiledAgent;
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

pub use approvals::{
    Approval, ApprovalChange, ApprovalChangeKind, ApprovalFilter, ApprovalPage, ApprovalWatch,
    DecideApproval, Decision, DecisionOutcome, OUTCOME_REVIEW, Vote, display_actor,
};
pub use audit::{
    AuditExport, AuditProblem, AuditScope, AuditVerification, ExportedEvent, ShadowDecision,
    ShadowDecisions, WebhookDelivery,
};
pub use bundles::{
    ActiveBundle, BundleMemberInfo, BundleMemberPackage, BundleSecretRequirement, BundleSummary,
    BundleVersion, BundleVersionSummary, DeployedBundle, PublishBundle, PublishedBundle,
    RolledBackBundle, bundle_deployments_from_pb, bundle_versions_from_pb, bundles_from_pb,
    secret_requirements_from_pb,
};
pub use error::{ClientError, Code};
pub use sessions::{
    PayloadRef, RunSession, RunTarget, SessionAgent, SessionDetail, SessionEvent, SessionFilter,
    SessionInspection, SessionMode, SessionOutput, SessionPage, SessionSummary, StartedSession,
    Starter, TimelineDetail, TimelineEntry, TokenUsage, ToolInvocation, TruncatedPayload,
    TurnSummary, VersionedName,
};
pub use types::{
    ActiveVersion, AgentName, AgentSummary, AgentVersion, AgentVersionSummary, Deployed,
    DeploymentRecord, Health, Published, RolledBack, RuntimeVersion, SecretEndpointChange,
    VersionStatus,
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
    runtime: RuntimeClient<InterceptedService<Channel, Bearer>>,
    health: HealthClient<Channel>,
    addr: String,
    runtime_token: bool,
    client_certificate: bool,
}

impl Client {
    /// Connects to the runtime at `addr`: `host:port`, or an `http://host:port` URI.
    ///
    /// # Errors
    /// [`ClientError::InvalidAddress`] for an address that does not parse (or asks for TLS,
    /// which this release does not speak); [`ClientError::Unreachable`] when no connection could
    /// be opened within [`CONNECT_TIMEOUT`].
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        Self::connect_with(addr, None, None).await
    }

    /// [`Client::connect`], sending `token` as `authorization: Bearer <token>` on every call
    /// and stream (`None` sends no credential, as `local` mode needs none).
    ///
    /// # Errors
    /// As [`Client::connect`]; [`ClientError::InvalidToken`] when `token` cannot be sent in a
    /// header (empty, or not visible ASCII).
    pub async fn connect_with_token(addr: &str, token: Option<&str>) -> Result<Self, ClientError> {
        Self::connect_with(addr, None, token).await
    }

    /// Connects to the runtime at `addr` over TLS: `host:port` or an `https://host:port` URI.
    /// The runtime's certificate must be signed by the CA of `tls` and name the host (a DNS
    /// name or IP address in its subject alternative names).
    ///
    /// # Errors
    /// [`ClientError::InvalidAddress`] for an address that does not parse or is `http://`;
    /// [`ClientError::Unreachable`] when no connection (or no TLS handshake) could be
    /// completed within [`CONNECT_TIMEOUT`].
    pub async fn connect_tls(addr: &str, tls: &ClientTls) -> Result<Self, ClientError> {
        Self::connect_with(addr, Some(tls), None).await
    }

    /// The general form: over TLS when `tls` is given (see [`Client::connect_tls`]), sending
    /// `token` on every call when given (see [`Client::connect_with_token`]).
    ///
    /// # Errors
    /// As [`Client::connect_tls`] and [`Client::connect_with_token`].
    pub async fn connect_with(
        addr: &str,
        tls: Option<&ClientTls>,
        token: Option<&str>,
    ) -> Result<Self, ClientError> {
        let bearer = Bearer::new(token)?;
        let (shown, uri) = normalize_addr(addr, tls.is_some())?;
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|e| ClientError::InvalidAddress {
                addr: addr.to_owned(),
                reason: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT);
        if let Some(tls) = tls {
            let mut config =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            if let Some(domain) = &tls.domain {
                config = config.domain_name(domain.clone());
            }
            endpoint = endpoint.tls_config(config).map_err(|e| ClientError::Tls {
                reason: e.to_string(),
            })?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| ClientError::from_transport(&e, &shown, CONNECT_TIMEOUT))?;
        Ok(Self {
            runtime: RuntimeClient::with_interceptor(channel.clone(), bearer)
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            health: HealthClient::new(channel),
            addr: shown,
            runtime_token: token.is_some(),
            client_certificate: tls.is_some_and(|t| t.identity.is_some()),
        })
    }

    /// Whether this client sends a bearer token ([`Client::connect_with_token`]).
    #[must_use]
    pub fn sends_token(&self) -> bool {
        self.runtime_token
    }

    /// Whether this client presents a credential the runtime verifies: a bearer token, or a
    /// client certificate (mutual TLS). Such a caller is recorded as its verified principal, so
    /// it names no actor of its own (naming one would be impersonation without the relay
    /// permission).
    #[must_use]
    pub fn sends_credential(&self) -> bool {
        self.runtime_token || self.client_certificate
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
        self.deploy_with(agent, version, actor, false).await
    }

    /// [`Client::deploy`]; `allow_new_secret_endpoints` lets a version that sends a secret to
    /// an endpoint no earlier deployment used be deployed (the runtime records the change and
    /// answers it in [`Deployed::secret_endpoint_changes`]); without it such a deploy is
    /// `FailedPrecondition`.
    ///
    /// # Errors
    /// As [`Client::deploy`].
    pub async fn deploy_with(
        &self,
        agent: &AgentName,
        version: &str,
        actor: &str,
        allow_new_secret_endpoints: bool,
    ) -> Result<Deployed, ClientError> {
        let request = pb::DeployRequest {
            agent_ref: Some(agent.to_pb(version)),
            actor: actor.to_owned(),
            allow_new_secret_endpoints,
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
        self.rollback_with(agent, to, actor, false).await
    }

    /// [`Client::rollback`]; `allow_new_secret_endpoints` as in [`Client::deploy_with`] (only a
    /// `to` that was never deployed can send a secret somewhere new).
    ///
    /// # Errors
    /// As [`Client::rollback`].
    pub async fn rollback_with(
        &self,
        agent: &AgentName,
        to: Option<&str>,
        actor: &str,
        allow_new_secret_endpoints: bool,
    ) -> Result<RolledBack, ClientError> {
        let request = pb::RollbackRequest {
            agent_ref: Some(agent.to_pb("")),
            to_version: to.unwrap_or_default().to_owned(),
            actor: actor.to_owned(),
            allow_new_secret_endpoints,
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
fn normalize_addr(addr: &str, tls: bool) -> Result<(String, String), ClientError> {
    let invalid = |reason: &str| ClientError::InvalidAddress {
        addr: addr.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = addr.trim();
    if trimmed.is_empty() {
        return Err(invalid("empty; expected host:port"));
    }
    let host_port = match (
        trimmed.strip_prefix("https://"),
        trimmed.strip_prefix("http://"),
    ) {
        (Some(_), _) if !tls => {
            return Err(invalid(
                "https:// needs the runtime's CA certificate (PHRONY_TLS_CA / --tls-ca)",
            ));
        }
        (Some(rest), _) => rest,
        (None, Some(_)) if tls => {
            return Err(invalid(
                "http:// is plaintext but a TLS CA was given; use host:port or https://",
            ));
        }
        (None, Some(rest)) => rest,
        (None, None) => trimmed,
    }
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
    let scheme = if tls { "https" } else { "http" };
    Ok((host_port.to_owned(), format!("{scheme}://{host_port}")))
}

/// The largest CA, certificate or key file [`ClientTls::from_files`] reads.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// TLS settings of a connection ([`Client::connect_tls`]): the CA that signed the runtime's
/// certificate and, for mutual TLS, the client's certificate and key.
#[derive(Clone)]
pub struct ClientTls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_certificate", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the CA certificates of `ca_pem` (PEM).
    #[must_use]
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            identity: None,
            domain: None,
        }
    }

    /// Presents a client certificate (PEM chain and PEM key) for mutual TLS.
    #[must_use]
    pub fn with_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Checks the runtime's certificate for `domain` instead of the address's host.
    #[must_use]
    pub fn with_domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// Reads the CA file and, for mutual TLS, the client certificate and key files (PEM, each
    /// at most 1 MiB).
    ///
    /// # Errors
    /// [`ClientError::Tls`] naming the file that cannot be read or holds no PEM block, or a
    /// certificate without a key (or the reverse).
    pub fn from_files(
        ca: &Path,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Self, ClientError> {
        let tls = Self::new(read_pem("CA certificate", ca, "CERTIFICATE")?);
        match (cert, key) {
            (None, None) => Ok(tls),
            (Some(c), Some(k)) => Ok(tls.with_identity(
                read_pem("client certificate", c, "CERTIFICATE")?,
                read_pem("client key", k, "PRIVATE KEY")?,
            )),
            (Some(c), None) => Err(ClientError::Tls {
                reason: format!(
                    "client certificate {} given without its key (PHRONY_TLS_KEY / --tls-key)",
                    c.display()
                ),
            }),
            (None, Some(k)) => Err(ClientError::Tls {
                reason: format!(
                    "client key {} given without its certificate (PHRONY_TLS_CERT / --tls-cert)",
                    k.display()
                ),
            }),
        }
    }
}

/// Reads a PEM file that must contain a `-----BEGIN …{label}-----` block.
fn read_pem(what: &str, path: &Path, label: &str) -> Result<Vec<u8>, ClientError> {
    use std::io::Read as _;
    let fail = |reason: String| ClientError::Tls {
        reason: format!("{what} {}: {reason}", path.display()),
    };
    let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(fail("larger than 1 MiB".to_owned()));
    }
    let text = String::from_utf8_lossy(&bytes);
    let has_block = text
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{label}-----")));
    if !has_block {
        return Err(fail(format!("no PEM {label} block")));
    }
    Ok(bytes)
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
            normalize_addr("127.0.0.1:7777", false).unwrap(),
            (
                "127.0.0.1:7777".to_owned(),
                "http://127.0.0.1:7777".to_owned()
            )
        );
        assert_eq!(
            normalize_addr("http://localhost:9000/", false).unwrap().0,
            "localhost:9000"
        );
        assert_eq!(
            normalize_addr("[::1]:7777", false).unwrap().1,
            "http://[::1]:7777"
        );
        // TLS: host:port or https://, never http://.
        assert_eq!(
            normalize_addr("localhost:7777", true).unwrap().1,
            "https://localhost:7777"
        );
        assert_eq!(
            normalize_addr("https://localhost:7777/", true).unwrap(),
            (
                "localhost:7777".to_owned(),
                "https://localhost:7777".to_owned()
            )
        );
        let err = normalize_addr("http://localhost:7777", true).unwrap_err();
        assert!(err.to_string().contains("plaintext"), "{err}");
        let err = normalize_addr("https://localhost:7777", false).unwrap_err();
        assert!(err.to_string().contains("PHRONY_TLS_CA"), "{err}");
        for bad in [
            "",
            "localhost",
            "localhost:http",
            ":7777",
            "https://h:1",
            "h:1/path",
        ] {
            let err = normalize_addr(bad, false).unwrap_err();
            assert!(
                matches!(err, ClientError::InvalidAddress { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn tls_files_are_checked_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let junk = dir.path().join("junk.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::write(&junk, "hello").unwrap();
        assert!(ClientTls::from_files(&ca, None, None).is_ok());
        let err = ClientTls::from_files(&junk, None, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("junk.pem") && err.contains("CERTIFICATE"),
            "{err}"
        );
        let err = ClientTls::from_files(&dir.path().join("nope.pem"), None, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nope.pem") && err.contains("cannot read"),
            "{err}"
        );
        let err = ClientTls::from_files(&ca, Some(&ca), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("without its key"), "{err}");
        let err = ClientTls::from_files(&ca, Some(&ca), Some(&ca))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("client key") && err.contains("PRIVATE KEY"),
            "{err}"
        );
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

/// Adds `authorization: Bearer <token>` to every request, when a token is configured.
#[derive(Clone)]
struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Bearer {
    fn new(token: Option<&str>) -> Result<Self, ClientError> {
        let Some(token) = token else {
            return Ok(Self(None));
        };
        let token = token.trim();
        let bad = |reason: &str| ClientError::InvalidToken {
            reason: reason.to_owned(),
        };
        if token.is_empty() {
            return Err(bad("it is empty"));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("it contains a character other than visible ASCII"));
        }
        let mut value: MetadataValue<tonic::metadata::Ascii> = format!("Bearer {token}")
            .parse()
            .map_err(|_| bad("it cannot be sent in a header"))?;
        value.set_sensitive(true);
        Ok(Self(Some(value)))
    }
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Bearer(…)"
        } else {
            "Bearer(none)"
        })
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}
