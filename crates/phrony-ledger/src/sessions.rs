//! Sessions: creation, status transitions (every one an event), reads, listing and recovery.
//! The `sessions` row and its readers live in the leaf `rows`; a terminal transition, which
//! also closes what the session held, is `cascade::transition` (this module appends the event).
//!
//! Writes follow the crate's pattern: lock the session's stream (named by the session id),
//! check the request against the projections, append the event and apply it with [`apply`],
//! which [`Ledger::rebuild_projections`] replays.

use phrony_auth::{Attribution, Verification};
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::Ledger;
use crate::bundles::BundleRef;
use crate::db::{Arg, Backend, Conn, Tx, args};
use crate::error::{LedgerError, Result};
use crate::event_body::{EventBody, SessionStarted, SessionTransition, event_types as types};
use crate::events::{StreamHead, append, create_or_lock_stream};
use crate::model::{AgentRef, Event, NewEvent, VersionOrigin};
use crate::paging::{Page, PageRequest, Where, decode_token, encode_token};
use crate::rows::{self, SESSION_COLUMNS, find_session, require_session, session_from_row};
use crate::secrets::{self, SealedSecret};

pub use crate::rows::{AgentVersionRef, Session};

pub use crate::vocabulary::{OnLimit, SessionLimits, SessionMode, SessionStatus};

/// Input of [`Ledger::create_session`].
#[derive(Debug, Clone, PartialEq)]
pub struct NewSession {
    /// `run_<uuid>` (see [`new_session_id`]); chosen by the caller so secrets can be sealed to
    /// it before the session exists.
    pub id: String,
    /// The agent version to run (an `agent_versions` row).
    pub agent_version_id: Uuid,
    /// Its `namespace/name@version`; must match the version row when that is a published one.
    pub agent: AgentVersionRef,
    /// The input, a JSON object (`{}` when empty).
    pub input: Value,
    /// Caller metadata (e.g. a ticket id), filterable in [`Ledger::list_sessions`].
    pub metadata: BTreeMap<String, String>,
    /// Task (default) or conversation.
    pub mode: SessionMode,
    /// The delegating session, for a child session; root id and depth are derived from it.
    pub parent_session_id: Option<String>,
    /// The limits in force.
    pub limits: Option<SessionLimits>,
    /// The bundle version a bundle's root session runs: `agent_version_id` must then be its
    /// root member. `None` for agent sessions and child sessions. A vendored (bundle member)
    /// version runs only as a child session or as the root of its bundle; a published version
    /// never has one.
    pub bundle_version_id: Option<Uuid>,
    /// Secrets sealed to this session id, stored in the same transaction (never in events).
    pub secrets: Vec<SealedSecret>,
    /// Who started the session.
    pub actor: Attribution,
}

/// A requested status change for [`Ledger::set_session_status`].
#[derive(Debug, Clone, PartialEq)]
pub struct StatusChange {
    /// The new status.
    pub to: SessionStatus,
    /// Who caused it (`system` by default).
    pub actor: Attribution,
    /// The failure message; required for `failed`, refused otherwise.
    pub error: Option<String>,
    /// The output of a `completed` session; refused for other statuses.
    pub output: Option<Value>,
    /// Why (recorded in the event), e.g. `approval 4f… opened` or a limit message.
    pub reason: Option<String>,
    /// Compare-and-set: refuse unless the session is currently in this status.
    pub expect_from: Option<SessionStatus>,
}

impl StatusChange {
    /// A change to `to` by `system`.
    #[must_use]
    pub fn to(to: SessionStatus) -> Self {
        Self {
            to,
            actor: Attribution::from("system"),
            error: None,
            output: None,
            reason: None,
            expect_from: None,
        }
    }

    /// `completed`, with the session's output if there is one.
    #[must_use]
    pub fn completed(output: Option<Value>) -> Self {
        Self {
            output,
            ..Self::to(SessionStatus::Completed)
        }
    }

    /// `failed` with a message.
    #[must_use]
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            error: Some(message.into()),
            ..Self::to(SessionStatus::Failed)
        }
    }

    /// `cancelled`.
    #[must_use]
    pub fn cancelled() -> Self {
        Self::to(SessionStatus::Cancelled)
    }

    /// Sets the actor.
    #[must_use]
    pub fn by(mut self, actor: impl Into<Attribution>) -> Self {
        self.actor = actor.into();
        self
    }

    /// Sets the reason.
    #[must_use]
    pub fn because(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Only change the status if it is currently `from`.
    #[must_use]
    pub fn from(mut self, from: SessionStatus) -> Self {
        self.expect_from = Some(from);
        self
    }
}

/// Result of [`Ledger::set_session_status`].
#[derive(Debug, Clone, PartialEq)]
pub struct StatusChanged {
    /// The session after the change.
    pub session: Session,
    /// The status before.
    pub from: SessionStatus,
    /// Approvals that were pending and are now `cancelled` (terminal transitions).
    pub closed_approvals: Vec<Uuid>,
    /// Tool calls that were open and are now `cancelled`; the router should send
    /// `WorkToolCancel` for those that were queued or dispatched.
    pub cancelled_calls: Vec<String>,
    /// Descendant sessions that were running and are now `cancelled`.
    pub cancelled_children: Vec<String>,
    /// How many stored secrets of this session were deleted.
    pub secrets_purged: u64,
}

/// What a session was started from ([`SessionFilter::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionKind {
    /// An agent session (`bundle_version_id` is NULL), child sessions included.
    Agent,
    /// A bundle's root session (`bundle_version_id` is set).
    Bundle,
}

impl SessionKind {
    /// `agent` or `bundle`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Bundle => "bundle",
        }
    }
}

/// Filters of [`Ledger::list_sessions`]; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFilter {
    /// Sessions of this agent (any version).
    pub agent: Option<AgentRef>,
    /// …and of this version (requires `agent`).
    pub agent_version: Option<String>,
    /// Sessions in this status.
    pub status: Option<SessionStatus>,
    /// Sessions having all of these metadata pairs.
    pub metadata: BTreeMap<String, String>,
    /// Children of this session (implies children are listed).
    pub parent_session_id: Option<String>,
    /// Also list delegated child sessions (by default only root sessions are listed).
    pub include_children: bool,
    /// Created at or after.
    pub created_after: Option<DateTime<Utc>>,
    /// Created strictly before.
    pub created_before: Option<DateTime<Utc>>,
    /// Sessions started from this bundle (any version).
    pub bundle: Option<BundleRef>,
    /// …and from this bundle version, a semver or a `sha256:` lock hash (requires `bundle`).
    pub bundle_version: Option<String>,
    /// Agent or bundle sessions only.
    pub kind: Option<SessionKind>,
}

/// A new root session id: `run_` + a random UUID.
#[must_use]
pub fn new_session_id() -> String {
    format!("run_{}", Uuid::new_v4().hyphenated())
}

/// Most metadata pairs a session may carry.
pub const MAX_METADATA_PAIRS: usize = 64;
const MAX_METADATA_KEY: usize = 128;
const MAX_METADATA_VALUE: usize = 4096;

pub(crate) fn validate_session_id(id: &str) -> Result<()> {
    let ok = id.strip_prefix("run_").is_some_and(|rest| {
        Uuid::parse_str(rest).is_ok_and(|u| u.hyphenated().to_string() == rest)
    });
    if ok {
        Ok(())
    } else {
        Err(LedgerError::invalid(format!(
            "session id {id:?} must be run_<uuid> (lower-case, hyphenated)"
        )))
    }
}

fn validate_metadata(metadata: &BTreeMap<String, String>) -> Result<()> {
    if metadata.len() > MAX_METADATA_PAIRS {
        return Err(LedgerError::invalid(format!(
            "metadata has {} pairs; at most {MAX_METADATA_PAIRS} are allowed",
            metadata.len()
        )));
    }
    for (key, value) in metadata {
        if key.trim().is_empty() {
            return Err(LedgerError::invalid("metadata keys must not be empty"));
        }
        if key.len() > MAX_METADATA_KEY || key.chars().any(char::is_control) {
            return Err(LedgerError::invalid(format!(
                "metadata key {key:?} must be at most {MAX_METADATA_KEY} bytes without control \
                 characters"
            )));
        }
        if value.len() > MAX_METADATA_VALUE {
            return Err(LedgerError::invalid(format!(
                "metadata value of {key:?} is {} bytes; at most {MAX_METADATA_VALUE} are allowed",
                value.len()
            )));
        }
    }
    Ok(())
}

impl NewSession {
    pub(crate) fn validate(&self) -> Result<()> {
        validate_session_id(&self.id)?;
        self.agent.validate()?;
        if !self.input.is_object() {
            return Err(LedgerError::invalid("input must be a JSON object"));
        }
        validate_metadata(&self.metadata)?;
        if self.actor.actor.trim().is_empty() {
            return Err(LedgerError::invalid("actor is required"));
        }
        if let Some(parent) = &self.parent_session_id {
            validate_session_id(parent)?;
            if parent == &self.id {
                return Err(LedgerError::invalid("a session cannot be its own parent"));
            }
        }
        secrets::validate_batch(&self.secrets)
    }
}

// ---------------------------------------------------------------------------------------------
// Event payloads.

fn event_type_for(to: SessionStatus) -> &'static str {
    match to {
        SessionStatus::Completed => types::SESSION_COMPLETED,
        SessionStatus::Failed => types::SESSION_FAILED,
        SessionStatus::Cancelled => types::SESSION_CANCELLED,
        _ => types::SESSION_STATUS_CHANGED,
    }
}

// ---------------------------------------------------------------------------------------------
// Reads.

async fn list(
    conn: &mut Conn<'_>,
    filter: &SessionFilter,
    page: &PageRequest,
) -> Result<Page<Session>> {
    let cursor = page
        .token
        .as_deref()
        .map(|t| decode_token("s", t))
        .transpose()?;
    let mut w = Where::default();
    if let Some(agent) = &filter.agent {
        agent.validate()?;
        let ns = w.bind(Arg::from(agent.namespace.as_str()));
        let name = w.bind(Arg::from(agent.name.as_str()));
        w.push(format!(
            "s.agent_namespace = {ns} AND s.agent_name = {name}"
        ));
    }
    if let Some(version) = &filter.agent_version {
        if filter.agent.is_none() {
            return Err(LedgerError::invalid(
                "the agent_version filter requires the agent filter",
            ));
        }
        let v = w.bind(Arg::from(version.as_str()));
        w.push(format!("s.agent_version = {v}"));
    }
    bundle_filters(&mut w, filter)?;
    if let Some(status) = filter.status {
        let st = w.bind(Arg::from(status.as_str()));
        w.push(format!("s.status = {st}"));
    }
    for (key, value) in &filter.metadata {
        let k = w.bind(Arg::from(key.as_str()));
        let v = w.bind(Arg::from(value.as_str()));
        w.push(format!(
            "EXISTS (SELECT 1 FROM session_metadata m \
             WHERE m.session_id = s.id AND m.key = {k} AND m.value = {v})"
        ));
    }
    match &filter.parent_session_id {
        Some(parent) => {
            let p = w.bind(Arg::from(parent.as_str()));
            w.push(format!("s.parent_session_id = {p}"));
        }
        None if !filter.include_children => w.push("s.parent_session_id IS NULL".to_owned()),
        None => {}
    }
    if let Some(after) = filter.created_after {
        let a = w.bind(Arg::from(after));
        w.push(format!("s.created_at >= {a}"));
    }
    if let Some(before) = filter.created_before {
        let b = w.bind(Arg::from(before));
        w.push(format!("s.created_at < {b}"));
    }
    if let Some(c) = cursor {
        w.after_cursor("s.created_at", "s.id", c.created_at, Arg::from(c.id));
    }
    let limit = page.limit();
    let l = w.bind(Arg::from(i64::from(limit) + 1));
    let sql = format!(
        "SELECT {SESSION_COLUMNS} FROM sessions s {} \
         ORDER BY s.created_at DESC, s.id DESC LIMIT {l}",
        w.sql()
    );
    let mut items = conn
        .fetch_all("list sessions", &sql, w.args)
        .await?
        .iter()
        .map(session_from_row)
        .collect::<Result<Vec<_>>>()?;
    let next_token = if items.len() > limit as usize {
        items.truncate(limit as usize);
        items
            .last()
            .map(|s| encode_token("s", &s.created_at, &s.id))
    } else {
        None
    };
    Ok(Page { items, next_token })
}

/// The `bundle`, `bundle_version` and `kind` filters.
fn bundle_filters(w: &mut Where, filter: &SessionFilter) -> Result<()> {
    match filter.kind {
        Some(SessionKind::Agent) => w.push("s.bundle_version_id IS NULL".to_owned()),
        Some(SessionKind::Bundle) => w.push("s.bundle_version_id IS NOT NULL".to_owned()),
        None => {}
    }
    if filter.bundle_version.is_some() && filter.bundle.is_none() {
        return Err(LedgerError::invalid(
            "the bundle_version filter requires the bundle filter",
        ));
    }
    if let Some(bundle) = &filter.bundle {
        bundle.validate()?;
        let ns = w.bind(Arg::from(bundle.namespace.as_str()));
        let name = w.bind(Arg::from(bundle.name.as_str()));
        let version = match &filter.bundle_version {
            Some(v) => {
                let v = w.bind(Arg::from(v.as_str()));
                format!(" AND (bv.version = {v} OR bv.lock_hash = {v})")
            }
            None => String::new(),
        };
        w.push(format!(
            "s.bundle_version_id IN (SELECT bv.id FROM bundle_versions bv \
             JOIN bundles b ON b.id = bv.bundle_id \
             WHERE b.namespace = {ns} AND b.name = {name}{version})"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Writes.

/// The first key of the PostgreSQL advisory lock that orders the session creates of one agent
/// with its retires and archives (the second is `hashtext` of its `namespace/name`). The two-key form never collides
/// with the one-key (bigint) locks of the migrator.
const CREATE_LOCK_CLASS: i32 = 0x7068_7273; // "phrs"

/// The live sessions (created, not yet ended) of the agent `$1/$2`: the sum of the agent's
/// rows of the counter `agent_live_sessions` (migration 0020), which triggers on `sessions`
/// move in the transaction of every change that starts, ends or deletes a session. At most
/// 16 rows (PostgreSQL's shards; one on SQLite), whatever the number of live sessions: the
/// `COUNT(*)` this replaces read one index entry per live session. A single row means
/// nothing on PostgreSQL (a session's +1 and -1 may land in different shards); only the sum
/// does. `SUM` of a PostgreSQL `bigint` is `numeric`, hence the cast.
const COUNT_LIVE_SESSIONS: &str = "SELECT CAST(COALESCE(SUM(live), 0) AS BIGINT) AS n \
     FROM agent_live_sessions WHERE agent_namespace = $1 AND agent_name = $2";

async fn count_live_sessions(conn: &mut Conn<'_>, namespace: &str, name: &str) -> Result<u64> {
    let n = conn
        .fetch_optional(
            "count the agent's live sessions",
            COUNT_LIVE_SESSIONS,
            args![namespace, name],
        )
        .await?
        .map(|row| row.int("n"))
        .transpose()?
        .unwrap_or(0);
    live_count(n, namespace, name)
}

/// The counter's sum as a count: only the triggers write the counter, so a negative sum means
/// someone else did.
fn live_count(n: i64, namespace: &str, name: &str) -> Result<u64> {
    u64::try_from(n).map_err(|_| {
        LedgerError::corrupt(format!(
            "the live-session counter of agent {namespace}/{name} is {n} \
             (table agent_live_sessions, migration 0020)"
        ))
    })
}

/// Serialises, on PostgreSQL, the transactions that end the sessions of the agent
/// `namespace/name` by retiring a version or archiving it with every transaction that creates
/// one of its sessions (an advisory lock held until commit, taken exclusively here; creates take
/// it through [`lock_agent_sessions_for_create`]). Without it a create could pass its checks
/// while an archive's cascade runs, and a session would live on after its agent was archived.
/// On SQLite, `BEGIN IMMEDIATE` already serialises every writer. Take it before any stream lock
/// (creates lock a session stream, archives the agent's stream and then its sessions'), so the
/// order is the same everywhere.
pub(crate) async fn lock_agent_sessions(tx: &mut Tx, namespace: &str, name: &str) -> Result<()> {
    if tx.backend() == Backend::Postgres {
        advisory_lock(tx, namespace, name, "pg_advisory_xact_lock").await?;
    }
    Ok(())
}

async fn advisory_lock(tx: &mut Tx, namespace: &str, name: &str, function: &str) -> Result<()> {
    let key = format!("{namespace}/{name}");
    let sql = format!(
        "SELECT 1 AS locked FROM (SELECT {function}({CREATE_LOCK_CLASS}, hashtext($1))) AS l"
    );
    tx.conn()
        .fetch_optional(
            "lock the agent's session creates",
            &sql,
            args![key.as_str()],
        )
        .await?;
    Ok(())
}

/// Whether the agent `$1/$2` is far from the bound `$3`: its committed live sessions plus the
/// most transactions the PostgreSQL server can run at once (`max_connections`: each transaction
/// holds one of its backends) is at most the bound; then no interleaving of concurrent creates
/// can pass it. An expression over the agent's rows of `agent_live_sessions`.
const FAR_FROM_BOUND: &str = "COALESCE(SUM(live), 0) \
     + CAST(current_setting('max_connections') AS BIGINT) <= $3";

/// Takes, for a session create of `agent`, the lock that orders it with the agent's retires and
/// archives ([`lock_agent_sessions`]), and refuses the create when the agent already has
/// `max` live sessions: two concurrent creates never both take the last slot.
///
/// On SQLite every write transaction is serialised anyway: the count is exact. On PostgreSQL
/// creates far from the bound run concurrently (the lock taken shared); only creates near it
/// queue one at a time (exclusive), so a busy agent's creates do not wait for each other's
/// commits. Far means the committed live sessions `n` plus `max_connections` is at most `max`:
/// every create in flight holds one of the server's backends, so however concurrent creates
/// interleave, the one that read last saw every other as committed or as one of at most
/// `max_connections - 1` in flight, and the total stays within `max` (a create is the only
/// change that raises the count; an end not yet committed is not subtracted yet, which can
/// refuse a create that would have fitted a moment later, never admit one too many). The
/// choice is made on a read in the statement that takes the lock (its snapshot predates the
/// lock; two round trips per create, as with the one exclusive lock before) and confirmed on a
/// read after it ([`FAR_FROM_BOUND`] in both); when a flood of creates crossed the line in
/// between, the attempt is a `Conflict`, which the write retries (exclusively, once the flood
/// committed). Near the bound the exclusive lock makes each create's read see every earlier
/// create's +1 (read committed: a snapshot per statement, taken after the lock).
async fn lock_agent_sessions_for_create(
    tx: &mut Tx,
    agent: &AgentVersionRef,
    max: Option<u64>,
) -> Result<()> {
    let (namespace, name) = (agent.namespace.as_str(), agent.name.as_str());
    if tx.backend() != Backend::Postgres {
        if let Some(max) = max {
            check_live_sessions(tx, agent, max).await?;
        }
        return Ok(());
    }
    let Some(max) = max else {
        return advisory_lock(tx, namespace, name, "pg_advisory_xact_lock_shared").await;
    };
    let bound = i64::try_from(max).unwrap_or(i64::MAX);
    // One statement reads the committed count and takes the lock in the mode it allows (its
    // snapshot is taken before the lock: the read that decides, not the one that confirms).
    let key = format!("{namespace}/{name}");
    let far = tx
        .conn()
        .fetch_optional(
            "lock the agent's session creates",
            &format!(
                "SELECT f.far FROM (SELECT {FAR_FROM_BOUND} AS far FROM agent_live_sessions \
                   WHERE agent_namespace = $1 AND agent_name = $2) AS f, \
                 LATERAL (SELECT CASE WHEN f.far \
                   THEN pg_advisory_xact_lock_shared({CREATE_LOCK_CLASS}, hashtext($4)) \
                   ELSE pg_advisory_xact_lock({CREATE_LOCK_CLASS}, hashtext($4)) END) AS l"
            ),
            args![namespace, name, bound, key.as_str()],
        )
        .await?
        .ok_or_else(no_aggregate_row)?
        .bool("far")?;
    if !far {
        return check_live_sessions(tx, agent, max).await;
    }
    // Confirmed after the lock, with the count checked as `count_live_sessions` checks it.
    let row = tx
        .conn()
        .fetch_optional(
            "count the agent's live sessions",
            &format!(
                "SELECT CAST(COALESCE(SUM(live), 0) AS BIGINT) AS n, {FAR_FROM_BOUND} AS far \
                 FROM agent_live_sessions WHERE agent_namespace = $1 AND agent_name = $2"
            ),
            args![namespace, name, bound],
        )
        .await?
        .ok_or_else(no_aggregate_row)?;
    live_count(row.int("n")?, namespace, name)?;
    if row.bool("far")? {
        return Ok(());
    }
    Err(LedgerError::Conflict {
        message: format!(
            "agent {namespace}/{name} came near its bound of {max} live sessions while this \
             create waited for its lock"
        ),
    })
}

fn no_aggregate_row() -> LedgerError {
    LedgerError::corrupt("an aggregate of agent_live_sessions returned no row")
}

/// Refuses the create when the agent already has `max` live sessions (see
/// [`lock_agent_sessions_for_create`], which calls it where the count is exact). The count is
/// the counter of migration 0020.
async fn check_live_sessions(tx: &mut Tx, agent: &AgentVersionRef, max: u64) -> Result<()> {
    let live = count_live_sessions(&mut tx.conn(), &agent.namespace, &agent.name).await?;
    if live >= max {
        return Err(LedgerError::ResourceExhausted {
            message: format!(
                "agent {}/{} has {live} live sessions (created and not yet ended); at most {max} \
                 may be live at once, so no session was started",
                agent.namespace, agent.name
            ),
        });
    }
    Ok(())
}

/// A top-level session of a published version may only start while the agent is not archived
/// and the version neither retired nor deprecated (the rule of [`Ledger::runnable_version`]) —
/// checked again here, in the create's transaction under [`lock_agent_sessions`], because the
/// caller's earlier check may have raced with an archive or a retire whose cascade then missed
/// the new session. `archived`: whether the version's agent is archived, read with the version
/// under that lock ([`rows::find_version_to_run`]).
fn check_still_runnable(version: &crate::model::AgentVersion, archived: bool) -> Result<()> {
    // The agent first, as `runnable_version` does (an archive also deprecates every version).
    if archived {
        return Err(rows::archived_cannot_run(&version.agent));
    }
    rows::version_cannot_run(version).map_or(Ok(()), Err)
}

/// A vendored version (a bundle member) runs only through its bundle: as a child session, or
/// as the root session of a bundle version whose root member it is. A published version is
/// never started as a bundle's session.
async fn check_bundle_member(
    tx: &mut Tx,
    new: &NewSession,
    version: &crate::model::AgentVersion,
) -> Result<()> {
    match (version.origin, new.bundle_version_id) {
        (VersionOrigin::Published, None) => Ok(()),
        (VersionOrigin::Published, Some(bundle_version)) => Err(LedgerError::invalid(format!(
            "bundle_version_id {bundle_version} is set but agent version {} is a published \
             version, not a bundle member",
            version.id
        ))),
        (VersionOrigin::Vendored, None) if new.parent_session_id.is_some() => Ok(()),
        (VersionOrigin::Vendored, None) => Err(LedgerError::precondition(format!(
            "agent version \"{}\" ({}@{}) is a bundle member and runs only through its bundle",
            version.id, version.agent, version.version
        ))),
        (VersionOrigin::Vendored, Some(bundle_version)) => {
            let root = tx
                .conn()
                .fetch_optional(
                    "read the bundle version's root",
                    "SELECT root_member_version_id FROM bundle_versions WHERE id = $1",
                    args![bundle_version],
                )
                .await?
                .ok_or_else(|| {
                    LedgerError::not_found(format!("bundle version \"{bundle_version}\" not found"))
                })?
                .opt_uuid("root_member_version_id")?;
            if root == Some(version.id) {
                Ok(())
            } else {
                Err(LedgerError::precondition(format!(
                    "agent version \"{}\" is not the root member of bundle version \"{}\"",
                    version.id, bundle_version
                )))
            }
        }
    }
}

/// Creates the session (`session.started`) and appends `opening` after it, chained on the same
/// head, in the caller's transaction.
pub(crate) async fn create(
    tx: &mut Tx,
    new: &NewSession,
    max_live_per_agent: Option<u64>,
    opening: &[NewEvent],
) -> Result<Session> {
    lock_agent_sessions_for_create(tx, &new.agent, max_live_per_agent).await?;
    let mut head = create_or_lock_stream(tx, &new.id).await?;
    if head.last_seq > 0 {
        return Err(if find_session(&mut tx.conn(), &new.id).await?.is_some() {
            LedgerError::AlreadyExists {
                message: format!("session {} already exists", new.id),
            }
        } else {
            LedgerError::precondition(format!(
                "event stream {} already has events and cannot become a session",
                new.id
            ))
        });
    }
    let (version, agent_archived) = rows::find_version_to_run(&mut tx.conn(), new.agent_version_id)
        .await?
        .ok_or_else(|| {
            LedgerError::not_found(format!(
                "agent version \"{}\" not found",
                new.agent_version_id
            ))
        })?;
    if version.agent != new.agent.agent() || version.version != new.agent.version {
        return Err(LedgerError::invalid(format!(
            "agent_ref {} does not match agent version {} ({}@{})",
            new.agent, new.agent_version_id, version.agent, version.version
        )));
    }
    if version.origin == VersionOrigin::Published && new.parent_session_id.is_none() {
        check_still_runnable(&version, agent_archived)?;
    }
    check_bundle_member(tx, new, &version).await?;
    let (root, depth) = match &new.parent_session_id {
        None => (new.id.clone(), 0),
        Some(parent_id) => {
            let parent = find_session(&mut tx.conn(), parent_id)
                .await?
                .ok_or_else(|| {
                    LedgerError::not_found(format!("parent session {parent_id} not found"))
                })?;
            if parent.status.is_terminal() {
                return Err(LedgerError::precondition(format!(
                    "parent session {parent_id} is {} and cannot start child sessions",
                    parent.status
                )));
            }
            (parent.root_session_id, parent.depth.saturating_add(1))
        }
    };
    let body = EventBody::SessionStarted(SessionStarted {
        session_id: new.id.clone(),
        agent_version_id: new.agent_version_id,
        agent_namespace: new.agent.namespace.clone(),
        agent_name: new.agent.name.clone(),
        agent_version: new.agent.version.clone(),
        mode: new.mode,
        input: new.input.clone(),
        metadata: new.metadata.clone(),
        parent_session_id: new.parent_session_id.clone(),
        root_session_id: root,
        depth,
        limits: new.limits.clone(),
        status: SessionStatus::Running,
        bundle_version_id: new.bundle_version_id,
    });
    // `session.started` and the opening events in one append (one head update and seal).
    let mut batch = Vec::with_capacity(1 + opening.len());
    batch.push(body.clone().into_new_event(&new.actor)?);
    batch.extend_from_slice(opening);
    let appended = crate::events::append_batch(tx, &mut head, batch).await?;
    let event = appended
        .first()
        .ok_or_else(|| LedgerError::corrupt("a session's opening append returned no event"))?;
    // The row as inserted: neither the secrets nor the opening events change it.
    let session = project(&mut tx.conn(), event, &body).await?;
    secrets::insert(&mut tx.conn(), &new.id, &new.secrets, event.ts).await?;
    Ok(session)
}

/// Whether session `id`, in `status`, may take `change` (its expected status, then
/// [`SessionStatus::can_change_to`]): `FailedPrecondition` naming both otherwise.
pub(crate) fn check_change(id: &str, status: SessionStatus, change: &StatusChange) -> Result<()> {
    if let Some(expected) = change.expect_from
        && status != expected
    {
        return Err(LedgerError::precondition(format!(
            "session {id} is {status}, not {expected}"
        )));
    }
    if !status.can_change_to(change.to) {
        return Err(LedgerError::precondition(format!(
            "session {id} cannot change status from {status} to {}",
            change.to
        )));
    }
    Ok(())
}

/// Appends and applies one status change of a locked session, nothing else: a terminal
/// change goes through `cascade::transition`, which first closes what the session held.
/// `from` is the status the change is recorded from: read under the stream's lock, or the one
/// the caller expects ([`StatusChange::expect_from`]), which the projection's conditional
/// `UPDATE` then checks — when the session is not in it, the change is refused
/// (`FailedPrecondition`, `NotFound` for no session) and the caller's transaction, with the
/// event it appended, is rolled back. Returns the session's row as the change wrote it.
pub(crate) async fn append_transition(
    tx: &mut Tx,
    head: &mut StreamHead,
    id: &str,
    from: SessionStatus,
    change: &StatusChange,
) -> Result<Session> {
    let transition = SessionTransition {
        from,
        to: change.to,
        reason: change.reason.clone(),
        message: change.error.clone(),
        output: change.output.clone(),
    };
    let body = match change.to {
        SessionStatus::Completed => EventBody::SessionCompleted(transition.clone()),
        SessionStatus::Failed => EventBody::SessionFailed(transition.clone()),
        SessionStatus::Cancelled => EventBody::SessionCancelled(transition.clone()),
        _ => EventBody::SessionStatusChanged(transition.clone()),
    };
    let event = append(tx, head, body.into_new_event(&change.actor)?).await?;
    match project_status(&mut tx.conn(), &event, &transition).await? {
        Ok(session) => Ok(session),
        Err(StatusFound(Some(now))) => Err(LedgerError::precondition(format!(
            "session {id} is {now}, not {from}"
        ))),
        Err(StatusFound(None)) => Err(rows::session_not_found(id)),
    }
}

/// Moves a locked session to `awaiting_approval` if it is not there yet (used when an approval
/// opens). Not a terminal change, so nothing cascades.
pub(crate) async fn ensure_awaiting_approval(
    tx: &mut Tx,
    head: &mut StreamHead,
    session: &Session,
    reason: String,
) -> Result<()> {
    let to = SessionStatus::AwaitingApproval;
    if session.status == to {
        return Ok(());
    }
    let change = StatusChange::to(to).because(reason);
    check_change(&session.id, session.status, &change)?;
    append_transition(tx, head, &session.id, session.status, &change)
        .await
        .map(drop)
}

// ---------------------------------------------------------------------------------------------
// Projection writes: a pure function of the event.

pub(crate) async fn apply(conn: &mut Conn<'_>, event: &Event, body: &EventBody) -> Result<()> {
    project(conn, event, body).await.map(drop)
}

/// `RETURNING` the columns [`session_from_row`] reads, for the projection's writes.
static RETURNING_SESSION: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!(" RETURNING {}", SESSION_COLUMNS.replace("s.", "")));

/// [`apply`], returning the session's row as the event's projection wrote it (no read-back).
async fn project(conn: &mut Conn<'_>, event: &Event, body: &EventBody) -> Result<Session> {
    let session = match body {
        EventBody::SessionStarted(p) => {
            let metadata = serde_json::to_value(&p.metadata)
                .map_err(|e| LedgerError::corrupt(format!("session metadata: {e}")))?;
            let limits = p
                .limits
                .as_ref()
                .map(serde_json::to_value)
                .transpose()
                .map_err(|e| LedgerError::corrupt(format!("session limits: {e}")))?;
            static INSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
                format!(
                    "INSERT INTO sessions (id, agent_version_id, parent_session_id, \
                     root_session_id, depth, mode, input, metadata, status, created_by, \
                     created_at, updated_at, agent_namespace, agent_name, agent_version, limits, \
                     created_by_verification, created_by_via, bundle_version_id) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11, $12, $13, $14, \
                     $15, $16, $17, $18){}",
                    *RETURNING_SESSION
                )
            });
            let row = conn
                .fetch_optional(
                    "project session",
                    &INSERT,
                    vec![
                        Arg::from(p.session_id.as_str()),
                        Arg::from(p.agent_version_id),
                        Arg::from(p.parent_session_id.clone()),
                        Arg::from(p.root_session_id.as_str()),
                        Arg::from(i64::from(p.depth)),
                        Arg::from(p.mode.as_str()),
                        Arg::Json(p.input.clone()),
                        Arg::Json(metadata),
                        Arg::from(p.status.as_str()),
                        Arg::from(event.actor.as_str()),
                        Arg::from(event.ts),
                        Arg::from(p.agent_namespace.as_str()),
                        Arg::from(p.agent_name.as_str()),
                        Arg::from(p.agent_version.as_str()),
                        Arg::OptJson(limits),
                        Arg::from(event.actor_verification.map(Verification::as_str)),
                        Arg::from(event.actor_via.clone()),
                        Arg::from(p.bundle_version_id),
                    ],
                )
                .await?
                .ok_or_else(|| {
                    LedgerError::corrupt(format!(
                        "stream {}: the session insert returned no row",
                        event.stream
                    ))
                })?;
            for (key, value) in &p.metadata {
                conn.execute(
                    "project session metadata",
                    "INSERT INTO session_metadata (session_id, key, value) VALUES ($1, $2, $3)",
                    args![p.session_id.as_str(), key.as_str(), value.as_str()],
                )
                .await?;
            }
            session_from_row(&row)?
        }
        EventBody::SessionStatusChanged(p)
        | EventBody::SessionCompleted(p)
        | EventBody::SessionFailed(p)
        | EventBody::SessionCancelled(p) => match project_status(conn, event, p).await? {
            Ok(session) => session,
            Err(StatusFound(current)) => {
                return Err(LedgerError::corrupt(format!(
                    "stream {} seq {}: {} from {} but the session is {}",
                    event.stream,
                    event.seq,
                    event.event_type,
                    p.from,
                    current.map_or("missing", SessionStatus::as_str)
                )));
            }
        },
        other => {
            return Err(LedgerError::corrupt(format!(
                "stream {} seq {}: {} is not a session event",
                event.stream,
                event.seq,
                other.event_type()
            )));
        }
    };
    Ok(session)
}

/// The status a session's row is in when a status change's projection did not apply: the
/// row is not in the change's `from` (`None`: there is no such session).
struct StatusFound(Option<SessionStatus>);

/// The projection of status change `p` (the payload of `event`): applied only from the status
/// it records (one statement; the row is read only to name what it found when it does not
/// match), returning the row as written, or what the row is in instead.
async fn project_status(
    conn: &mut Conn<'_>,
    event: &Event,
    p: &SessionTransition,
) -> Result<std::result::Result<Session, StatusFound>> {
    if event_type_for(p.to) != event.event_type {
        return Err(LedgerError::corrupt(format!(
            "stream {} seq {}: {} records status {}",
            event.stream, event.seq, event.event_type, p.to
        )));
    }
    static UPDATE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "UPDATE sessions SET status = $2, error = COALESCE($3, error), \
             output = COALESCE($4, output), updated_at = $5, ended_at = $6 \
             WHERE id = $1 AND status = $7{}",
            *RETURNING_SESSION
        )
    });
    let ended_at = p.to.is_terminal().then_some(event.ts);
    let row = conn
        .fetch_optional(
            "project session status",
            &UPDATE,
            vec![
                Arg::from(event.stream.as_str()),
                Arg::from(p.to.as_str()),
                Arg::from(p.message.clone()),
                Arg::OptJson(p.output.clone()),
                Arg::from(event.ts),
                Arg::from(ended_at),
                Arg::from(p.from.as_str()),
            ],
        )
        .await?;
    let Some(row) = row else {
        let current = conn
            .fetch_optional(
                "read session status",
                "SELECT status FROM sessions WHERE id = $1",
                args![event.stream.as_str()],
            )
            .await?
            .map(|r| r.text("status"))
            .transpose()?
            .map(|s| SessionStatus::parse_stored(&s))
            .transpose()?;
        return Ok(Err(StatusFound(current)));
    };
    if p.to.is_terminal() {
        secrets::purge(conn, &event.stream).await?;
        // User messages still queued for the driver (migration 0019): dropped with it.
        conn.execute(
            "purge queued user messages",
            "DELETE FROM session_inbox WHERE session_id = $1",
            args![event.stream.as_str()],
        )
        .await?;
    }
    session_from_row(&row).map(Ok)
}

// ---------------------------------------------------------------------------------------------
// Public API.

impl Ledger {
    /// Creates a session in status `running`: the `session.started` event (actor = `actor`,
    /// payload = the session as created), the row, its metadata and its sealed secrets, in one
    /// transaction. Root id and depth are derived from the parent.
    ///
    /// # Errors
    /// - `InvalidArgument`: malformed id, agent ref, input (`input must be a JSON object`),
    ///   metadata or secrets; an agent ref that does not match the published version;
    /// - `NotFound`: `agent version "id" not found`, `parent session X not found`;
    /// - `AlreadyExists`: `session X already exists`;
    /// - `FailedPrecondition`: a terminal parent.
    pub async fn create_session(&self, new: NewSession) -> Result<Session> {
        new.validate()?;
        write_tx!(self, |tx| create(&mut tx, &new, None, &[]))
    }

    /// [`Ledger::create_session`], refused when the agent (`namespace/name`, any version)
    /// already has `max_live_per_agent` live sessions: created and not yet `completed`,
    /// `failed` or `cancelled` (running, awaiting approval, input or a tool, parked
    /// conversations, child sessions). The count and the insert are one transaction, and
    /// concurrent creates of the same agent are serialised (on PostgreSQL by an advisory lock
    /// on the agent), so the bound holds under any concurrency: with `k` slots left, exactly
    /// `k` of any number of concurrent creates succeed.
    ///
    /// # Errors
    /// Those of [`Ledger::create_session`], and `ResourceExhausted` naming the agent, its live
    /// sessions and the bound; nothing is written then.
    pub async fn create_session_within(
        &self,
        new: NewSession,
        max_live_per_agent: u64,
    ) -> Result<Session> {
        new.validate()?;
        write_tx!(self, |tx| create(
            &mut tx,
            &new,
            Some(max_live_per_agent),
            &[]
        ))
    }

    /// How many live sessions (created, not yet ended) the agent `namespace/name` has, over
    /// all its versions: what [`Ledger::create_session_within`] compares with its bound.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed agent name; database errors.
    pub async fn live_sessions_of_agent(&self, agent: &AgentRef) -> Result<u64> {
        agent.validate()?;
        let mut conn = self.pool.acquire().await?;
        count_live_sessions(&mut conn.conn(), &agent.namespace, &agent.name).await
    }

    /// One session.
    ///
    /// # Errors
    /// `NotFound`: `session X not found`.
    pub async fn get_session(&self, id: &str) -> Result<Session> {
        let mut conn = self.pool.acquire().await?;
        require_session(&mut conn.conn(), id).await
    }

    /// Sessions matching `filter`, newest first (`created_at`, then id), one page at a time.
    /// Pagination is stable: rows created or updated meanwhile never shift a later page.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or foreign page token or an invalid filter.
    pub async fn list_sessions(
        &self,
        filter: &SessionFilter,
        page: &PageRequest,
    ) -> Result<Page<Session>> {
        let mut conn = self.pool.acquire().await?;
        list(&mut conn.conn(), filter, page).await
    }

    /// Every non-terminal session (roots and children), oldest first: what the daemon
    /// reconciles on start (§5.8).
    ///
    /// # Errors
    /// Database errors.
    pub async fn sessions_needing_recovery(&self) -> Result<Vec<Session>> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let page = self.sessions_needing_recovery_after(after, 1000).await?;
            let full = page.len() == 1000;
            after = page.last().map(|s| (s.created_at, s.id.clone()));
            all.extend(page);
            if !full {
                return Ok(all);
            }
        }
    }

    /// One page of [`Ledger::sessions_needing_recovery`]: at most `limit` (1..=10,000) of
    /// them, oldest first, after the session `after` (its `created_at` and id) when given.
    /// Recovery reads them page by page, so a restart with many sessions left holds one page
    /// in memory, not all of them.
    ///
    /// # Errors
    /// Database errors.
    pub async fn sessions_needing_recovery_after(
        &self,
        after: Option<(DateTime<Utc>, String)>,
        limit: u32,
    ) -> Result<Vec<Session>> {
        let mut conn = self.pool.acquire().await?;
        let limit = i64::from(limit.clamp(1, 10_000));
        let rows = match after {
            None => {
                let sql = format!(
                    "SELECT {SESSION_COLUMNS} FROM sessions s \
                     WHERE s.status NOT IN ('completed', 'failed', 'cancelled') \
                     ORDER BY s.created_at, s.id LIMIT $1"
                );
                conn.conn()
                    .fetch_all("list sessions to recover", &sql, args![limit])
                    .await?
            }
            Some((created_at, id)) => {
                let sql = format!(
                    "SELECT {SESSION_COLUMNS} FROM sessions s \
                     WHERE s.status NOT IN ('completed', 'failed', 'cancelled') \
                     AND (s.created_at > $1 OR (s.created_at = $1 AND s.id > $2)) \
                     ORDER BY s.created_at, s.id LIMIT $3"
                );
                conn.conn()
                    .fetch_all(
                        "list sessions to recover",
                        &sql,
                        args![created_at, id, limit],
                    )
                    .await?
            }
        };
        rows.iter().map(session_from_row).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_projection_returns_the_columns_a_session_is_read_from_unqualified() {
        let returning = RETURNING_SESSION.trim_start();
        assert!(
            returning.starts_with("RETURNING id, agent_version_id, "),
            "{returning}"
        );
        assert!(!returning.contains('.'), "{returning}");
        assert_eq!(
            returning.matches(", ").count(),
            SESSION_COLUMNS.matches(", ").count()
        );
    }

    #[test]
    fn transitions_follow_the_documented_table() {
        use SessionStatus as S;
        let allowed: Vec<(S, S)> = S::ALL
            .iter()
            .flat_map(|&f| S::ALL.iter().map(move |&t| (f, t)))
            .filter(|(f, t)| f.can_change_to(*t))
            .collect();
        let terminal = [S::Completed, S::Failed, S::Cancelled];
        let mut expected = Vec::new();
        for (from, tos) in [
            (S::Pending, vec![S::Running]),
            (
                S::Running,
                vec![S::AwaitingInput, S::AwaitingTool, S::AwaitingApproval],
            ),
            (S::AwaitingInput, vec![S::Running]),
            (
                S::AwaitingTool,
                vec![S::Running, S::AwaitingInput, S::AwaitingApproval],
            ),
            (
                S::AwaitingApproval,
                vec![S::Running, S::AwaitingInput, S::AwaitingTool],
            ),
        ] {
            for to in tos.into_iter().chain(terminal) {
                expected.push((from, to));
            }
        }
        let mut a = allowed.clone();
        a.sort();
        expected.sort();
        assert_eq!(a, expected);
    }

    #[test]
    fn session_ids_are_run_uuid() {
        assert!(validate_session_id(&new_session_id()).is_ok());
        for bad in [
            "",
            "run_",
            "run_x",
            "0b7c6c5e-8f0e-4c1a-9d43-2f1b8f2e9a11",
            "run_0B7C6C5E-8F0E-4C1A-9D43-2F1B8F2E9A11",
            "run_0b7c6c5e8f0e4c1a9d432f1b8f2e9a11",
        ] {
            assert!(validate_session_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn statuses_parse_with_a_helpful_error() {
        assert_eq!(
            "awaiting_approval".parse::<SessionStatus>().ok(),
            Some(SessionStatus::AwaitingApproval)
        );
        let err = "paused"
            .parse::<SessionStatus>()
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "unknown session status \"paused\"; expected one of: pending, running, \
                 awaiting_input, awaiting_tool, awaiting_approval, completed, failed, cancelled"
            )
        );
    }
}
