//! Plain domain types returned by and passed to the ledger.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use phrony_auth::{Attribution, Verification};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::chain::ChainViolation;
use crate::error::{LedgerError, Result};

/// `namespace/name` of an agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentRef {
    /// The agent's namespace (`metadata.namespace`).
    pub namespace: String,
    /// The agent's name (`metadata.name`).
    pub name: String,
}

impl AgentRef {
    /// Builds a reference; see [`AgentRef::validate`] for the accepted shape.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Checks that namespace and name are present and usable as a stream key: non-empty, no
    /// `/`, no whitespace or control characters. The rule is
    /// [`phrony_manifest::check_agent_name`], which the manifest validator applies too, so a
    /// name that `phrony agents validate` accepts is never refused here.
    ///
    /// # Errors
    /// [`LedgerError::InvalidArgument`] naming the bad part and character.
    pub fn validate(&self) -> Result<()> {
        validate_name_pair("agent", &self.namespace, &self.name)
    }

    /// The audit stream of this agent's lifecycle: `agent:<namespace>/<name>`.
    #[must_use]
    pub fn stream(&self) -> String {
        format!("agent:{self}")
    }
}

/// The rule of [`AgentRef::validate`] for a `kind` (`agent`, `bundle`) of `namespace/name`
/// reference: both present (`<kind>_ref requires namespace and name`), each passing
/// [`phrony_manifest::check_agent_name`].
pub(crate) fn validate_name_pair(kind: &str, namespace: &str, name: &str) -> Result<()> {
    if namespace.is_empty() || name.is_empty() {
        return Err(LedgerError::invalid(format!(
            "{kind}_ref requires namespace and name"
        )));
    }
    for (what, value) in [("namespace", namespace), ("name", name)] {
        if let Err(e) = phrony_manifest::check_agent_name(value) {
            return Err(LedgerError::invalid(format!("{kind} {what} {value:?} {e}")));
        }
    }
    Ok(())
}

impl fmt::Display for AgentRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Input of [`crate::Ledger::publish_agent_version`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAgentVersion {
    /// `metadata.namespace` (the agent is created on first publish).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The release label (`metadata.version`), already validated by the caller.
    pub version: String,
    /// `metadata.owner`; overwrites the agent's owner on every new version.
    pub owner: String,
    /// `metadata.labels`; overwrite the agent's labels on every new version.
    pub labels: BTreeMap<String, String>,
    /// The compiled snapshot JSON text, stored byte for byte. Must be a JSON object.
    pub snapshot_json: String,
    /// The snapshot's content hash, as computed by the caller (opaque to the ledger).
    pub content_hash: String,
    /// Who published (recorded on the version and in the audit event).
    pub actor: Attribution,
}

impl NewAgentVersion {
    /// `namespace/name` of the agent being published.
    #[must_use]
    pub fn agent_ref(&self) -> AgentRef {
        AgentRef::new(&self.namespace, &self.name)
    }
}

/// Result of [`crate::Ledger::publish_agent_version`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The agent's id.
    pub agent_id: Uuid,
    /// The (new or existing) version's id.
    pub version_id: Uuid,
    /// The agent.
    pub agent: AgentRef,
    /// The release label.
    pub version: String,
    /// The stored content hash.
    pub content_hash: String,
    /// `false` when an identical version already existed (idempotent re-publish).
    pub created: bool,
}

/// An agent (`agents` row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    /// Id (UUID v4).
    pub id: Uuid,
    /// Namespace and name.
    pub agent: AgentRef,
    /// Owner from the latest published version.
    pub owner: String,
    /// Labels from the latest published version.
    pub labels: BTreeMap<String, String>,
    /// When the agent was archived, if it was.
    pub archived_at: Option<DateTime<Utc>>,
    /// Who archived it.
    pub archived_by: Option<String>,
    /// First publish.
    pub created_at: DateTime<Utc>,
    /// Last lifecycle event.
    pub updated_at: DateTime<Utc>,
}

/// A version's lifecycle status as users see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionStatus {
    /// Published; runnable when it is the active deployment.
    Published,
    /// Deprecated: cannot be deployed or run.
    Deprecated,
    /// Retired: cannot be deployed, rolled back to or run.
    Retired,
}

impl VersionStatus {
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

/// Where a version came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionOrigin {
    /// Published with `phrony agents publish`.
    Published,
    /// A private bundle member.
    Vendored,
}

impl VersionOrigin {
    /// `published` or `vendored`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Vendored => "vendored",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Self> {
        match s {
            "published" => Ok(Self::Published),
            "vendored" => Ok(Self::Vendored),
            other => Err(LedgerError::corrupt(format!(
                "unknown version origin {other:?}"
            ))),
        }
    }
}

/// How a bundle member is held (`bundle_members.origin`; in events `"vendored"` /
/// `"external"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BundleMemberOrigin {
    /// A private copy compiled from the bundle's own files, stored as a vendored agent version.
    Vendored,
    /// A reference to an agent version published on its own.
    External,
}

impl BundleMemberOrigin {
    /// `vendored` or `external`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vendored => "vendored",
            Self::External => "external",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Self> {
        match s {
            "vendored" => Ok(Self::Vendored),
            "external" => Ok(Self::External),
            other => Err(LedgerError::corrupt(format!(
                "unknown bundle member origin {other:?}"
            ))),
        }
    }
}

impl fmt::Display for BundleMemberOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An immutable agent version (`agent_versions` row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentVersion {
    /// Id (UUID v4).
    pub id: Uuid,
    /// The agent's id; `None` for a vendored version (a private bundle member has no agent).
    pub agent_id: Option<Uuid>,
    /// Namespace and name (a vendored member's own `metadata.namespace` / `metadata.name`).
    pub agent: AgentRef,
    /// Release label (`metadata.version`).
    pub version: String,
    /// Content hash given at publish.
    pub content_hash: String,
    /// The compiled snapshot JSON text, exactly as published.
    pub snapshot_json: String,
    /// `published`, or `vendored` for a private bundle member.
    pub origin: VersionOrigin,
    /// The bundle version a vendored member belongs to (`None` for published versions).
    pub bundle_version_id: Option<Uuid>,
    /// Who published it.
    pub published_by: String,
    /// When it was published.
    pub published_at: DateTime<Utc>,
    /// When it was deprecated.
    pub deprecated_at: Option<DateTime<Utc>>,
    /// Who deprecated it (or archived the agent).
    pub deprecated_by: Option<String>,
    /// When it was retired.
    pub retired_at: Option<DateTime<Utc>>,
    /// Who retired it.
    pub retired_by: Option<String>,
}

impl AgentVersion {
    /// `retired` wins over `deprecated`, which wins over `published`.
    #[must_use]
    pub fn status(&self) -> VersionStatus {
        if self.retired_at.is_some() {
            VersionStatus::Retired
        } else if self.deprecated_at.is_some() {
            VersionStatus::Deprecated
        } else {
            VersionStatus::Published
        }
    }
}

/// A deploy or rollback (in events: `"deploy"` / `"rollback"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeploymentAction {
    /// `phrony agents deploy`.
    Deploy,
    /// `phrony agents rollback`.
    Rollback,
}

impl DeploymentAction {
    /// `deploy` or `rollback`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deploy => "deploy",
            Self::Rollback => "rollback",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Self> {
        match s {
            "deploy" => Ok(Self::Deploy),
            "rollback" => Ok(Self::Rollback),
            other => Err(LedgerError::corrupt(format!(
                "unknown deployment action {other:?}"
            ))),
        }
    }
}

impl fmt::Display for DeploymentAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the append-only deployment history. The newest row is the active version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// Id (UUID v4).
    pub id: Uuid,
    /// The agent's id.
    pub agent_id: Uuid,
    /// The activated version's id.
    pub version_id: Uuid,
    /// The activated version's label.
    pub version: String,
    /// The version that was active before, if any.
    pub previous_version: Option<String>,
    /// Deploy or rollback.
    pub action: DeploymentAction,
    /// Who did it.
    pub actor: String,
    /// When.
    pub created_at: DateTime<Utc>,
}

/// Result of [`crate::Ledger::archive_agent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedAgent {
    /// The agent's id.
    pub agent_id: Uuid,
    /// Labels of the versions this archive deprecated (those not deprecated before).
    pub deprecated_versions: Vec<String>,
    /// When.
    pub archived_at: DateTime<Utc>,
    /// The live sessions of the agent's versions this archive failed (in the same
    /// transaction): an archived agent runs nothing more.
    pub ended_sessions: Vec<String>,
}

/// What [`crate::Ledger::retire_version`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct RetiredVersion {
    /// The version, now retired.
    pub version: AgentVersion,
    /// The live sessions of the version this retire failed (in the same transaction): a
    /// retired version runs nothing more.
    pub ended_sessions: Vec<String>,
}

/// An event to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Dotted lower-case type, e.g. `session.started`, `tool.dispatched`.
    pub event_type: String,
    /// Who caused it: a caller's [`Attribution`] (name, verification, relaying principal), or
    /// one of the runtime's own actors (`system`, `agent`, `policy`, …, given as an unverified
    /// attribution; see [`recorded_verification`]). The name must not be empty.
    pub actor: Attribution,
    /// Snake_case JSON payload.
    pub payload: Value,
    /// The tool call this event belongs to, if any.
    pub call_id: Option<String>,
    /// The session turn this event belongs to, if any.
    pub turn: Option<u32>,
}

impl NewEvent {
    /// An event with no call id and no turn. A bare name (`"system"`) is an unverified
    /// attribution.
    pub fn new(
        event_type: impl Into<String>,
        actor: impl Into<Attribution>,
        payload: Value,
    ) -> Self {
        Self {
            event_type: event_type.into(),
            actor: actor.into(),
            payload,
            call_id: None,
            turn: None,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let valid_type = !self.event_type.is_empty()
            && self.event_type.contains('.')
            && self.event_type.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            });
        if !valid_type {
            return Err(LedgerError::invalid(format!(
                "event type {:?} must be dotted lower-case words, e.g. session.started",
                self.event_type
            )));
        }
        if self.actor.actor.trim().is_empty() {
            return Err(LedgerError::invalid("event actor must not be empty"));
        }
        if self
            .actor
            .via
            .as_deref()
            .is_some_and(|v| v.trim().is_empty())
        {
            return Err(LedgerError::invalid(
                "event actor_via must not be empty when given",
            ));
        }
        if self.call_id.as_deref().is_some_and(str::is_empty) {
            return Err(LedgerError::invalid(
                "event call_id must not be empty when given",
            ));
        }
        Ok(())
    }
}

/// The runtime's own actors: the names [`phrony_auth::actor`] reserves (`system`, `agent`,
/// `policy`, `worker`, and `system:…` such as `system:timeout`), which no client may use.
#[must_use]
pub fn is_runtime_actor(name: &str) -> bool {
    matches!(
        phrony_auth::Actor::parse(name),
        Err(phrony_auth::ActorError::Reserved { .. })
    )
}

/// The verification an event records for `actor`: `None` for the runtime's own actors (an
/// unverified, unrelayed attribution to a reserved name, [`is_runtime_actor`]), which are
/// recorded as before attribution existed; the attribution's verification for everyone else.
#[must_use]
pub fn recorded_verification(actor: &Attribution) -> Option<Verification> {
    let runtime = actor.verification == Verification::Unverified
        && actor.via.is_none()
        && is_runtime_actor(&actor.actor);
    (!runtime).then_some(actor.verification)
}

/// How a person reads a recorded actor: the [`Attribution`]'s display (`emad (unverified)`,
/// `alice via approvals-ui`, `ops-bot`) when a verification was recorded, else the bare name
/// (the runtime's own actors, and everything recorded before attribution existed).
#[must_use]
pub fn display_actor(actor: &str, verification: Option<Verification>, via: Option<&str>) -> String {
    match verification {
        Some(verification) => Attribution {
            actor: actor.to_owned(),
            verification,
            via: via.map(str::to_owned),
        }
        .to_string(),
        None => actor.to_owned(),
    }
}

/// A stored event.
#[derive(Clone, PartialEq)]
pub struct Event {
    /// The stream (a session id, or `agent:<ns>/<name>`).
    pub stream: String,
    /// Position in the stream, gap-free from 1.
    pub seq: u64,
    /// Dotted type.
    pub event_type: String,
    /// Append time (UTC, microsecond precision).
    pub ts: DateTime<Utc>,
    /// Who caused it (the name; see [`Event::attribution`]).
    pub actor: String,
    /// How the actor was established; `None` for the runtime's own actors and for events
    /// written before attribution was recorded.
    pub actor_verification: Option<Verification>,
    /// The principal that relayed the actor, if any.
    pub actor_via: Option<String>,
    /// Tool call id, if any.
    pub call_id: Option<String>,
    /// Session turn, if any.
    pub turn: Option<u32>,
    /// Payload.
    pub payload: Value,
    /// Hash of the previous event (64 zeros for seq 1).
    pub prev_hash: String,
    /// This event's hash (see the crate docs for the exact definition).
    pub hash: String,
}

/// `Debug` lists every field, except attribution fields that were not recorded (so a dump of a
/// log recorded before attribution existed reads exactly as it did).
impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Event");
        d.field("stream", &self.stream);
        d.field("seq", &self.seq);
        d.field("event_type", &self.event_type);
        d.field("ts", &self.ts);
        d.field("actor", &self.actor);
        if self.actor_verification.is_some() {
            d.field("actor_verification", &self.actor_verification);
        }
        if self.actor_via.is_some() {
            d.field("actor_via", &self.actor_via);
        }
        d.field("call_id", &self.call_id);
        d.field("turn", &self.turn);
        d.field("payload", &self.payload);
        d.field("prev_hash", &self.prev_hash);
        d.field("hash", &self.hash);
        d.finish()
    }
}

impl Event {
    /// Recomputes this event's hash from its fields (see the crate docs for the encoding), for
    /// auditors checking an exported log independently of the database.
    #[must_use]
    pub fn recompute_hash(&self) -> String {
        let payload = crate::chain::canonical_json(&self.payload);
        crate::chain::event_hash(&crate::chain::HashInput {
            stream: &self.stream,
            seq: i64::try_from(self.seq).unwrap_or(i64::MAX),
            event_type: &self.event_type,
            ts: &self.ts,
            actor: &self.actor,
            call_id: self.call_id.as_deref(),
            turn: self.turn.map(i64::from),
            payload: &payload,
            prev_hash: &self.prev_hash,
            actor_verification: self.actor_verification.map(Verification::as_str),
            actor_via: self.actor_via.as_deref(),
        })
    }

    /// Who the event is attributed to, when it recorded a verification (`None`: the runtime's
    /// own actors and events written before attribution existed).
    #[must_use]
    pub fn attribution(&self) -> Option<Attribution> {
        self.actor_verification.map(|verification| Attribution {
            actor: self.actor.clone(),
            verification,
            via: self.actor_via.clone(),
        })
    }

    /// The actor as a person reads it ([`display_actor`]): `emad (unverified)`,
    /// `alice via approvals-ui`, or the bare name.
    #[must_use]
    pub fn actor_display(&self) -> String {
        display_actor(
            &self.actor,
            self.actor_verification,
            self.actor_via.as_deref(),
        )
    }
}

/// Result of verifying one stream's hash chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// The stream.
    pub stream: String,
    /// How many events verified before the first violation (all of them when intact).
    pub events_checked: u64,
    /// `last_seq` recorded in the stream head.
    pub head_seq: u64,
    /// Hash recorded in the stream head: anchor it externally to detect a rewrite of the whole
    /// chain. `None` for an empty stream.
    pub head_hash: Option<String>,
    /// The first break in the chain, if any.
    pub violation: Option<ChainViolation>,
}

impl VerifyReport {
    /// `true` when every event and the head check out.
    #[must_use]
    pub fn is_intact(&self) -> bool {
        self.violation.is_none()
    }

    /// Turns a violation into [`LedgerError::Corrupt`].
    ///
    /// # Errors
    /// [`LedgerError::Corrupt`] with the violation's message.
    pub fn into_result(self) -> Result<Self> {
        match &self.violation {
            None => Ok(self),
            Some(v) => Err(LedgerError::corrupt(v.message.clone())),
        }
    }
}

/// Result of [`crate::Ledger::rebuild_projections`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebuildReport {
    /// Streams replayed.
    pub streams: u64,
    /// Events replayed.
    pub events: u64,
}
