//! Row readers the entity modules share: a session (`sessions` row, read by approvals, calls,
//! secrets and the session log), the attribution columns, and an agent version by id (read
//! when a session starts). A leaf of the module graph: it imports only the storage layer and
//! the value types, so every module that writes may read through it without importing another
//! writer (`guard_rails::ledger_and_engine_modules_form_an_acyclic_graph`).

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use phrony_auth::{Attribution, Verification};
use serde_json::Value;
use uuid::Uuid;

use crate::db::{Conn, Row, args};
use crate::error::{LedgerError, Result};
use crate::model::{Agent, AgentRef, AgentVersion, VersionOrigin};
use crate::vocabulary::{SessionLimits, SessionMode, SessionStatus};

/// `namespace/name@version` of the agent version a session runs (also for bundle members that
/// have no published agent).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentVersionRef {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.version`.
    pub version: String,
}

impl AgentVersionRef {
    /// Builds a reference.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        version: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            version: version.into(),
        }
    }

    /// `namespace/name` without the version.
    #[must_use]
    pub fn agent(&self) -> AgentRef {
        AgentRef::new(&self.namespace, &self.name)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        self.agent().validate()?;
        if self.version.is_empty() {
            return Err(LedgerError::invalid(
                "agent_ref requires namespace, name, and version",
            ));
        }
        Ok(())
    }
}

impl fmt::Display for AgentVersionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@{}", self.namespace, self.name, self.version)
    }
}

/// A session (`sessions` row).
#[derive(Clone, PartialEq)]
pub struct Session {
    /// `run_<uuid>`.
    pub id: String,
    /// The agent version it runs.
    pub agent_version_id: Uuid,
    /// `namespace/name@version` of that version.
    pub agent: AgentVersionRef,
    /// The bundle version a root session of a bundle runs (its root member); `None` for an
    /// agent session (see [`crate::SessionKind`]).
    pub bundle_version_id: Option<Uuid>,
    /// Task or conversation.
    pub mode: SessionMode,
    /// The input object.
    pub input: Value,
    /// Caller metadata.
    pub metadata: BTreeMap<String, String>,
    /// Current status.
    pub status: SessionStatus,
    /// The failure message of a failed session.
    pub error: Option<String>,
    /// The output of a completed session, when one was recorded.
    pub output: Option<Value>,
    /// The delegating session.
    pub parent_session_id: Option<String>,
    /// The root of the delegation tree (itself for a root session).
    pub root_session_id: String,
    /// Delegation depth (0 for a root session).
    pub depth: u32,
    /// The limits in force.
    pub limits: Option<SessionLimits>,
    /// Who started it (the name; see [`Session::started_by`]).
    pub created_by: String,
    /// How the starter was established (`None`: recorded before attribution existed).
    pub created_by_verification: Option<Verification>,
    /// The principal that relayed the starter, if any.
    pub created_by_via: Option<String>,
    /// `session.started` time.
    pub created_at: DateTime<Utc>,
    /// Time of the last status change.
    pub updated_at: DateTime<Utc>,
    /// Time of the terminal transition.
    pub ended_at: Option<DateTime<Utc>>,
}

/// `Debug` lists every field, except attribution fields that were not recorded (so a dump of a
/// log recorded before attribution existed reads exactly as it did).
impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Session");
        d.field("id", &self.id);
        d.field("agent_version_id", &self.agent_version_id);
        d.field("agent", &self.agent);
        if self.bundle_version_id.is_some() {
            d.field("bundle_version_id", &self.bundle_version_id);
        }
        d.field("mode", &self.mode);
        d.field("input", &self.input);
        d.field("metadata", &self.metadata);
        d.field("status", &self.status);
        d.field("error", &self.error);
        d.field("output", &self.output);
        d.field("parent_session_id", &self.parent_session_id);
        d.field("root_session_id", &self.root_session_id);
        d.field("depth", &self.depth);
        d.field("limits", &self.limits);
        d.field("created_by", &self.created_by);
        if self.created_by_verification.is_some() {
            d.field("created_by_verification", &self.created_by_verification);
        }
        if self.created_by_via.is_some() {
            d.field("created_by_via", &self.created_by_via);
        }
        d.field("created_at", &self.created_at);
        d.field("updated_at", &self.updated_at);
        d.field("ended_at", &self.ended_at);
        d.finish()
    }
}

// ---------------------------------------------------------------------------------------------
// Sessions.

pub(crate) const SESSION_COLUMNS: &str = "s.id, s.agent_version_id, s.agent_namespace, s.agent_name, \
     s.agent_version, s.mode, s.input, s.metadata, s.status, s.error, s.output, \
     s.parent_session_id, s.root_session_id, s.depth, s.limits, s.created_by, s.created_at, \
     s.updated_at, s.ended_at, s.created_by_verification, s.created_by_via, s.bundle_version_id";

/// A stored verification column (`NULL` or empty: not recorded).
pub(crate) fn opt_verification(row: &Row, column: &str) -> Result<Option<Verification>> {
    row.opt_text(column)?
        .filter(|v| !v.is_empty())
        .map(|v| {
            Verification::parse(&v).ok_or_else(|| {
                LedgerError::corrupt(format!("{column}: unknown verification {v:?}"))
            })
        })
        .transpose()
}

/// The attribution stored in three columns (name, verification, via); `None` when no
/// verification was recorded.
pub(crate) fn attribution_cols(
    row: &Row,
    name: &str,
    verification: &str,
    via: &str,
) -> Result<Option<Attribution>> {
    let Some(verification) = opt_verification(row, verification)? else {
        return Ok(None);
    };
    Ok(Some(Attribution {
        actor: row.text(name)?,
        verification,
        via: row.opt_text(via)?,
    }))
}

impl Session {
    /// Who started the session, when an attribution was recorded (`None` for sessions
    /// recorded before attribution existed, and those the runtime started itself).
    #[must_use]
    pub fn started_by(&self) -> Option<Attribution> {
        self.created_by_verification
            .map(|verification| Attribution {
                actor: self.created_by.clone(),
                verification,
                via: self.created_by_via.clone(),
            })
    }

    /// The starter as a person reads it: `emad (unverified)`, `alice via approvals-ui`, or the
    /// bare name ([`crate::display_actor`]).
    #[must_use]
    pub fn created_by_display(&self) -> String {
        crate::model::display_actor(
            &self.created_by,
            self.created_by_verification,
            self.created_by_via.as_deref(),
        )
    }
}

pub(crate) fn session_from_row(row: &Row) -> Result<Session> {
    let metadata: BTreeMap<String, String> = serde_json::from_value(row.json("metadata")?)
        .map_err(|e| LedgerError::corrupt(format!("sessions.metadata: {e}")))?;
    let limits = row
        .opt_json("limits")?
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| LedgerError::corrupt(format!("sessions.limits: {e}")))?;
    Ok(Session {
        id: row.text("id")?,
        agent_version_id: row.uuid("agent_version_id")?,
        agent: AgentVersionRef::new(
            row.text("agent_namespace")?,
            row.text("agent_name")?,
            row.text("agent_version")?,
        ),
        bundle_version_id: row.opt_uuid("bundle_version_id")?,
        mode: SessionMode::parse_stored(&row.text("mode")?)?,
        input: row.json("input")?,
        metadata,
        status: SessionStatus::parse_stored(&row.text("status")?)?,
        error: row.opt_text("error")?,
        output: row.opt_json("output")?,
        parent_session_id: row.opt_text("parent_session_id")?,
        root_session_id: row.text("root_session_id")?,
        depth: u32::try_from(row.int("depth")?)
            .map_err(|_| LedgerError::corrupt("sessions.depth out of range"))?,
        limits,
        created_by: row.text("created_by")?,
        created_by_verification: opt_verification(row, "created_by_verification")?,
        created_by_via: row.opt_text("created_by_via")?,
        created_at: row.ts("created_at")?,
        updated_at: row.ts("updated_at")?,
        ended_at: row.opt_ts("ended_at")?,
    })
}

pub(crate) fn session_not_found(id: &str) -> LedgerError {
    LedgerError::not_found(format!("session {id} not found"))
}

pub(crate) async fn find_session(conn: &mut Conn<'_>, id: &str) -> Result<Option<Session>> {
    let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.id = $1");
    conn.fetch_optional("read session", &sql, args![id])
        .await?
        .map(|row| session_from_row(&row))
        .transpose()
}

pub(crate) async fn require_session(conn: &mut Conn<'_>, id: &str) -> Result<Session> {
    find_session(conn, id)
        .await?
        .ok_or_else(|| session_not_found(id))
}

/// What a write needs to know of a session before it appends to its stream: its status and
/// its agent version. Two columns of the row, so a check does not read and parse the
/// session's input, metadata, limits and output (JSON) the way [`find_session`] does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionHead {
    pub(crate) status: SessionStatus,
    pub(crate) agent_version_id: Uuid,
}

/// The [`SessionHead`] of `id`, or `NotFound` (`session X not found`).
pub(crate) async fn require_session_head(conn: &mut Conn<'_>, id: &str) -> Result<SessionHead> {
    let row = conn
        .fetch_optional(
            "read session status",
            "SELECT status, agent_version_id FROM sessions WHERE id = $1",
            args![id],
        )
        .await?
        .ok_or_else(|| session_not_found(id))?;
    Ok(SessionHead {
        status: SessionStatus::parse_stored(&row.text("status")?)?,
        agent_version_id: row.uuid("agent_version_id")?,
    })
}

/// The session and all its descendants, the session first, then by depth and creation.
pub(crate) async fn session_subtree(conn: &mut Conn<'_>, id: &str) -> Result<Vec<Session>> {
    conn.fetch_all("read session tree", &session_subtree_sql(), args![id])
        .await?
        .iter()
        .map(session_from_row)
        .collect()
}

/// [`session_subtree`]'s statement. Its recursion compares `parent_session_id` with a session's
/// id in "C" (the collation of `sessions.id`); on PostgreSQL migration 0022's
/// `sessions_parent_c` serves it (conformance `id_joins_are_served_by_indexes`).
pub(crate) fn session_subtree_sql() -> String {
    format!(
        "WITH RECURSIVE tree (id) AS ( \
             SELECT id FROM sessions WHERE id = $1 \
             UNION ALL \
             SELECT c.id FROM sessions c JOIN tree t ON c.parent_session_id = t.id) \
         SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.id IN (SELECT id FROM tree) \
         ORDER BY s.depth, s.created_at, s.id"
    )
}

// ---------------------------------------------------------------------------------------------
// Agent versions.

/// The columns [`version_from_row`] reads, of `agent_versions v LEFT JOIN agents a ON a.id =
/// v.agent_id`. Published versions read their namespace and name from their agent; vendored
/// ones (no agent) from their own row (migration 0011).
macro_rules! version_columns {
    () => {
        "v.id, v.agent_id, \
         COALESCE(a.namespace, v.member_namespace) AS namespace, \
         COALESCE(a.name, v.member_name) AS name, v.version, \
         v.content_hash, v.snapshot, v.origin, v.bundle_version_id, v.published_by, \
         v.published_at, v.deprecated_at, v.deprecated_by, v.retired_at, v.retired_by"
    };
}
pub(crate) use version_columns;

pub(crate) const VERSION_SELECT: &str = concat!(
    "SELECT ",
    version_columns!(),
    " FROM agent_versions v LEFT JOIN agents a ON a.id = v.agent_id"
);

pub(crate) fn version_from_row(row: &Row) -> Result<AgentVersion> {
    Ok(AgentVersion {
        id: row.uuid("id")?,
        agent_id: row.opt_uuid("agent_id")?,
        agent: AgentRef::new(row.text("namespace")?, row.text("name")?),
        version: row.text("version")?,
        content_hash: row.text("content_hash")?,
        snapshot_json: row.text("snapshot")?,
        origin: VersionOrigin::parse(&row.text("origin")?)?,
        bundle_version_id: row.opt_uuid("bundle_version_id")?,
        published_by: row.text("published_by")?,
        published_at: row.ts("published_at")?,
        deprecated_at: row.opt_ts("deprecated_at")?,
        deprecated_by: row.opt_text("deprecated_by")?,
        retired_at: row.opt_ts("retired_at")?,
        retired_by: row.opt_text("retired_by")?,
    })
}

/// `agent ns/name is archived and cannot be run`: a new session of an archived agent.
pub(crate) fn archived_cannot_run(agent: &AgentRef) -> LedgerError {
    LedgerError::precondition(format!("agent {agent} is archived and cannot be run"))
}

/// `agent ns/name version "v" is retired|deprecated and cannot be run`, or `None` when the
/// version may run. One rule for `Ledger::runnable_version` and the session create's own check.
pub(crate) fn version_cannot_run(version: &AgentVersion) -> Option<LedgerError> {
    [
        (version.retired_at, "retired"),
        (version.deprecated_at, "deprecated"),
    ]
    .into_iter()
    .find(|(at, _)| at.is_some())
    .map(|(_, what)| {
        LedgerError::precondition(format!(
            "agent {} version {:?} is {what} and cannot be run",
            version.agent, version.version
        ))
    })
}

/// A version by id and whether its agent is archived (a vendored version has none: `false`),
/// in one read: what a session's create checks before it starts the version.
pub(crate) async fn find_version_to_run(
    conn: &mut Conn<'_>,
    id: Uuid,
) -> Result<Option<(AgentVersion, bool)>> {
    const SQL: &str = concat!(
        "SELECT ",
        version_columns!(),
        ", a.archived_at AS agent_archived_at \
         FROM agent_versions v LEFT JOIN agents a ON a.id = v.agent_id WHERE v.id = $1"
    );
    conn.fetch_optional("read agent version to run", SQL, args![id])
        .await?
        .map(|row| {
            let archived = row.opt_ts("agent_archived_at")?.is_some();
            Ok((version_from_row(&row)?, archived))
        })
        .transpose()
}

pub(crate) async fn find_version_by_id(
    conn: &mut Conn<'_>,
    id: Uuid,
) -> Result<Option<AgentVersion>> {
    let sql = format!("{VERSION_SELECT} WHERE v.id = $1");
    conn.fetch_optional("read agent version", &sql, args![id])
        .await?
        .map(|row| version_from_row(&row))
        .transpose()
}

// ---------------------------------------------------------------------------------------------
// Agents.

/// The `agents` columns [`agent_from_row`] reads.
pub(crate) const AGENT_COLUMNS: &str =
    "id, namespace, name, owner, labels, archived_at, archived_by, created_at, updated_at";

/// An `agents` row.
pub(crate) fn agent_from_row(row: &Row) -> Result<Agent> {
    let labels = row.json("labels")?;
    let labels: BTreeMap<String, String> = serde_json::from_value(labels)
        .map_err(|e| LedgerError::corrupt(format!("agents.labels: {e}")))?;
    Ok(Agent {
        id: row.uuid("id")?,
        agent: AgentRef::new(row.text("namespace")?, row.text("name")?),
        owner: row.text("owner")?,
        labels,
        archived_at: row.opt_ts("archived_at")?,
        archived_by: row.opt_text("archived_by")?,
        created_at: row.ts("created_at")?,
        updated_at: row.ts("updated_at")?,
    })
}

/// The agent `agent`, if it exists (archived or not).
pub(crate) async fn find_agent(conn: &mut Conn<'_>, agent: &AgentRef) -> Result<Option<Agent>> {
    let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE namespace = $1 AND name = $2");
    conn.fetch_optional("read agent", &sql, args![&agent.namespace, &agent.name])
        .await?
        .map(|row| agent_from_row(&row))
        .transpose()
}
