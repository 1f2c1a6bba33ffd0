//! What the client returns: plain Rust values converted from the wire messages, with timestamps
//! parsed and "empty means unset" strings turned into `Option`s.

use std::fmt;

use chrono::{DateTime, Utc};
use phrony_proto::runtime::v1 as pb;

use super::ClientError;

/// An agent: `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AgentName {
    /// The agent's namespace.
    pub namespace: String,
    /// The agent's name.
    pub name: String,
}

impl AgentName {
    /// `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub(crate) fn to_pb(&self, version: &str) -> pb::AgentRef {
        pb::AgentRef {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            version: version.to_owned(),
        }
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What `GetVersion` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// The runtime's release version (semver).
    pub version: String,
    /// The storage schema version the runtime migrated to; `None` when it did not say.
    pub schema_version: Option<String>,
}

/// The runtime's gRPC health (`grpc.health.v1`) for the runtime service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// The runtime serves, and its database took a durable write at the last probe (or
    /// since: every write the runtime makes counts).
    Serving,
    /// The runtime is up but cannot serve: its database cannot take a durable write (down,
    /// locked by another process past the busy timeout, full disk), or it is shutting down.
    NotServing,
    /// The health service gave no usable answer.
    Unknown,
}

/// A version stored by `Publish`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The agent.
    pub agent: AgentName,
    /// The version label.
    pub version: String,
    /// The agent's id.
    pub agent_id: String,
    /// The version's id.
    pub version_id: String,
    /// Hex SHA-256 of the stored content.
    pub content_hash: String,
    /// False when this exact content was already published under this version (an idempotent
    /// re-publish that changed nothing).
    pub created: bool,
}

/// The outcome of `Deploy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployed {
    /// The agent.
    pub agent: AgentName,
    /// The version now active.
    pub version: String,
    /// The version active before; `None` on the first deployment.
    pub previous_version: Option<String>,
    /// When the deployment was recorded.
    pub deployed_at: DateTime<Utc>,
    /// The secrets it sends to an endpoint no earlier deployment used (allowed explicitly).
    pub secret_endpoint_changes: Vec<SecretEndpointChange>,
}

/// A secret sent to an endpoint no earlier deployment of the agent (or bundle) sent it to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretEndpointChange {
    /// The bundle member (child name) that sends it; `None` for an agent's own deployment.
    pub member: Option<String>,
    /// `secrets.<name>`.
    pub secret: String,
    /// The environment variable its value is read from.
    pub from_env: String,
    /// The new endpoint.
    pub endpoint: String,
    /// The endpoints earlier deployments sent it to (empty: none did).
    pub previous_endpoints: Vec<String>,
}

impl std::fmt::Display for SecretEndpointChange {
    /// `secret "openai" (OPENAI_API_KEY) is now sent to B (previous deployments: A)`, after
    /// `member "front-desk": ` for a bundle member's.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(member) = &self.member {
            write!(f, "member {member:?}: ")?;
        }
        write!(
            f,
            "secret {:?} ({}) is now sent to {} (",
            self.secret, self.from_env, self.endpoint
        )?;
        if self.previous_endpoints.is_empty() {
            write!(f, "no earlier deployment sent {})", self.from_env)
        } else {
            write!(
                f,
                "previous deployments: {})",
                self.previous_endpoints.join(", ")
            )
        }
    }
}

/// The outcome of `Rollback`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolledBack {
    /// The version active after the rollback.
    pub version: String,
    /// The version active before it.
    pub previous_version: Option<String>,
    /// The secrets it sends to an endpoint no earlier deployment used (allowed explicitly).
    pub secret_endpoint_changes: Vec<SecretEndpointChange>,
}

/// The active deployment of an agent (`GetActiveVersion`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveVersion {
    /// The active version.
    pub version: String,
    /// When it was deployed (or rolled back to).
    pub deployed_at: DateTime<Utc>,
    /// Who deployed it.
    pub actor: String,
}

/// One row of an agent's deployment history (`ListDeployments`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentRecord {
    /// The version activated.
    pub version: String,
    /// `deploy` or `rollback`.
    pub action: String,
    /// Who did it.
    pub actor: String,
    /// When.
    pub created_at: DateTime<Utc>,
    /// The lock hash of the bundle version activated (bundle deployments only).
    pub lock_hash: Option<String>,
}

/// A published version with its stored manifest (`GetAgentVersion`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentVersion {
    /// The version label.
    pub version: String,
    /// The stored compiled manifest (canonical JSON).
    pub manifest_json: String,
    /// Hex SHA-256 of the stored content.
    pub content_hash: String,
    /// When it was published.
    pub published_at: DateTime<Utc>,
    /// Who published it, when the runtime recorded it.
    pub published_by: Option<String>,
    /// When it was deprecated.
    pub deprecated_at: Option<DateTime<Utc>>,
    /// When it was retired.
    pub retired_at: Option<DateTime<Utc>>,
}

impl AgentVersion {
    /// The status users see (§6.3).
    #[must_use]
    pub fn status(&self) -> VersionStatus {
        VersionStatus::of(self.deprecated_at, self.retired_at)
    }
}

/// One version in an agent's version list (`ListAgentVersions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentVersionSummary {
    /// The version's id.
    pub id: String,
    /// The version label.
    pub version: String,
    /// Hex SHA-256 of the stored content.
    pub content_hash: String,
    /// When it was published.
    pub published_at: DateTime<Utc>,
    /// Who published it, when the runtime recorded it.
    pub published_by: Option<String>,
    /// When it was deprecated.
    pub deprecated_at: Option<DateTime<Utc>>,
    /// When it was retired.
    pub retired_at: Option<DateTime<Utc>>,
}

impl AgentVersionSummary {
    /// The status users see (§6.3).
    #[must_use]
    pub fn status(&self) -> VersionStatus {
        VersionStatus::of(self.deprecated_at, self.retired_at)
    }
}

/// The lifecycle status of a version: retired wins over deprecated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionStatus {
    /// Runnable when active.
    Published,
    /// Deployable, not runnable.
    Deprecated,
    /// Neither deployable nor runnable.
    Retired,
}

impl VersionStatus {
    fn of(deprecated_at: Option<DateTime<Utc>>, retired_at: Option<DateTime<Utc>>) -> Self {
        match (deprecated_at, retired_at) {
            (_, Some(_)) => Self::Retired,
            (Some(_), None) => Self::Deprecated,
            (None, None) => Self::Published,
        }
    }

    /// `published`, `deprecated` or `retired`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Deprecated => "deprecated",
            Self::Retired => "retired",
        }
    }
}

impl fmt::Display for VersionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An agent in the catalog (`ListAgents`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSummary {
    /// The agent's id.
    pub id: String,
    /// The agent.
    pub agent: AgentName,
    /// `metadata.owner` of its latest publish.
    pub owner: String,
    /// When it was archived.
    pub archived_at: Option<DateTime<Utc>>,
}

// ---------------------------------------------------------------------------------------------
// Wire → client values

/// A required RFC 3339 timestamp.
pub(super) fn timestamp(
    rpc: &'static str,
    field: &str,
    text: &str,
) -> Result<DateTime<Utc>, ClientError> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| ClientError::invalid_response(rpc, format!("{field} {text:?}: {e}")))
}

/// An optional timestamp: empty means unset.
pub(super) fn optional_timestamp(
    rpc: &'static str,
    field: &str,
    text: &str,
) -> Result<Option<DateTime<Utc>>, ClientError> {
    if text.is_empty() {
        Ok(None)
    } else {
        timestamp(rpc, field, text).map(Some)
    }
}

/// An optional string: empty means unset.
pub(super) fn optional(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

/// A listing's `page_size`: 0 asks for the runtime's default; larger than `i32` is clamped.
pub(super) fn page_size(limit: Option<u32>) -> i32 {
    limit.map_or(0, |n| i32::try_from(n).unwrap_or(i32::MAX))
}

pub(crate) fn runtime_version(r: pb::GetVersionResponse) -> RuntimeVersion {
    RuntimeVersion {
        version: r.version,
        schema_version: optional(r.schema_version),
    }
}

pub(crate) fn published(r: pb::PublishResponse) -> Published {
    Published {
        // Unset: a runtime that predates the field; those refuse every re-publish.
        created: r.created.unwrap_or(true),
        agent: AgentName::new(r.namespace, r.name),
        version: r.version,
        agent_id: r.agent_id,
        version_id: r.version_id,
        content_hash: r.content_hash,
    }
}

pub(crate) fn deployed(r: pb::DeployResponse) -> Result<Deployed, ClientError> {
    Ok(Deployed {
        deployed_at: timestamp("Deploy", "deployed_at", &r.deployed_at)?,
        agent: AgentName::new(r.namespace, r.name),
        version: r.version,
        previous_version: optional(r.previous_version),
        secret_endpoint_changes: secret_endpoint_changes(r.secret_endpoint_changes),
    })
}

pub(crate) fn rolled_back(r: pb::RollbackResponse) -> RolledBack {
    RolledBack {
        version: r.version,
        previous_version: optional(r.previous_version),
        secret_endpoint_changes: secret_endpoint_changes(r.secret_endpoint_changes),
    }
}

/// The changes a deploy or rollback answered (an empty `member` is none).
pub(crate) fn secret_endpoint_changes(
    changes: Vec<pb::SecretEndpointChange>,
) -> Vec<SecretEndpointChange> {
    changes
        .into_iter()
        .map(|c| SecretEndpointChange {
            member: optional(c.member),
            secret: c.secret,
            from_env: c.from_env,
            endpoint: c.endpoint,
            previous_endpoints: c.previous_endpoints,
        })
        .collect()
}

pub(crate) fn active_version(
    r: pb::GetActiveVersionResponse,
) -> Result<ActiveVersion, ClientError> {
    Ok(ActiveVersion {
        deployed_at: timestamp("GetActiveVersion", "deployed_at", &r.deployed_at)?,
        version: r.version,
        actor: r.actor,
    })
}

pub(crate) fn deployments(
    r: pb::ListDeploymentsResponse,
) -> Result<Vec<DeploymentRecord>, ClientError> {
    deployment_records("ListDeployments", r.deployments)
}

/// The rows of an agent's or a bundle's deployment history.
pub(crate) fn deployment_records(
    rpc: &'static str,
    entries: Vec<pb::DeploymentEntry>,
) -> Result<Vec<DeploymentRecord>, ClientError> {
    entries
        .into_iter()
        .map(|d| {
            Ok(DeploymentRecord {
                created_at: timestamp(rpc, "created_at", &d.created_at)?,
                version: d.version,
                action: d.action,
                actor: d.actor,
                lock_hash: optional(d.lock_hash),
            })
        })
        .collect()
}

pub(crate) fn agent_version(r: pb::GetAgentVersionResponse) -> Result<AgentVersion, ClientError> {
    const RPC: &str = "GetAgentVersion";
    Ok(AgentVersion {
        manifest_json: String::from_utf8(r.manifest)
            .map_err(|e| ClientError::invalid_response(RPC, format!("manifest: {e}")))?,
        published_at: timestamp(RPC, "published_at", &r.published_at)?,
        deprecated_at: optional_timestamp(RPC, "deprecated_at", &r.deprecated_at)?,
        retired_at: optional_timestamp(RPC, "retired_at", &r.retired_at)?,
        version: r.version,
        content_hash: r.content_hash,
        published_by: optional(r.published_by),
    })
}

pub(crate) fn agent_versions(
    r: pb::ListAgentVersionsResponse,
) -> Result<Vec<AgentVersionSummary>, ClientError> {
    const RPC: &str = "ListAgentVersions";
    r.versions
        .into_iter()
        .map(|v| {
            Ok(AgentVersionSummary {
                // `deployed_at` is the historical name of the publish time.
                published_at: timestamp(RPC, "deployed_at", &v.deployed_at)?,
                deprecated_at: optional_timestamp(RPC, "deprecated_at", &v.deprecated_at)?,
                retired_at: optional_timestamp(RPC, "retired_at", &v.retired_at)?,
                id: v.id,
                version: v.version,
                content_hash: v.content_hash,
                published_by: optional(v.published_by),
            })
        })
        .collect()
}

pub(crate) fn agents(r: pb::ListAgentsResponse) -> Result<Vec<AgentSummary>, ClientError> {
    r.agents
        .into_iter()
        .map(|a| {
            Ok(AgentSummary {
                archived_at: optional_timestamp("ListAgents", "archived_at", &a.archived_at)?,
                id: a.id,
                agent: AgentName::new(a.namespace, a.name),
                owner: a.owner,
            })
        })
        .collect()
}

pub(crate) fn health(status: tonic_health::pb::health_check_response::ServingStatus) -> Health {
    use tonic_health::pb::health_check_response::ServingStatus;
    match status {
        ServingStatus::Serving => Health::Serving,
        ServingStatus::NotServing => Health::NotServing,
        ServingStatus::Unknown | ServingStatus::ServiceUnknown => Health::Unknown,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn empty_strings_are_unset_and_timestamps_parse() {
        let v = agent_versions(pb::ListAgentVersionsResponse {
            versions: vec![pb::AgentVersionSummary {
                id: "id-1".into(),
                version: "1.0.0".into(),
                content_hash: "ab".into(),
                deployed_at: "2025-01-31T09:30:00Z".into(),
                deprecated_at: String::new(),
                retired_at: "2025-02-01T00:00:00Z".into(),
                published_by: String::new(),
            }],
        })
        .unwrap();
        assert_eq!(v[0].published_at.to_rfc3339(), "2025-01-31T09:30:00+00:00");
        assert_eq!(v[0].deprecated_at, None);
        assert_eq!(v[0].published_by, None);
        assert_eq!(v[0].status(), VersionStatus::Retired);
    }

    #[test]
    fn a_malformed_timestamp_names_the_rpc_and_field() {
        let err = active_version(pb::GetActiveVersionResponse {
            version: "1.0.0".into(),
            deployed_at: "yesterday".into(),
            actor: "a".into(),
        })
        .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("unexpected GetActiveVersion response"),
            "{shown}"
        );
        assert!(shown.contains("deployed_at \"yesterday\""), "{shown}");
    }

    #[test]
    fn publish_reports_whether_it_created_the_version() {
        let response = |created| pb::PublishResponse {
            agent_id: "a".into(),
            version_id: "v".into(),
            content_hash: "ab".into(),
            namespace: "ns".into(),
            name: "n".into(),
            version: "1.0.0".into(),
            created,
        };
        assert!(published(response(Some(true))).created);
        assert!(!published(response(Some(false))).created);
        // A runtime without the field (the reference) refuses re-publishes: success = created.
        assert!(published(response(None)).created);
    }

    #[test]
    fn status_prefers_retired_over_deprecated() {
        let t = Some(Utc::now());
        assert_eq!(VersionStatus::of(None, None), VersionStatus::Published);
        assert_eq!(VersionStatus::of(t, None), VersionStatus::Deprecated);
        assert_eq!(VersionStatus::of(t, t), VersionStatus::Retired);
        assert_eq!(VersionStatus::of(None, t).as_str(), "retired");
    }
}
