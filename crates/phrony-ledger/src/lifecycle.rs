//! Agent lifecycle: publish, deploy, rollback, deprecate, retire, archive.
//!
//! Every write follows the same pattern inside one transaction: lock the agent's stream
//! (`agent:<ns>/<name>`), check the request against the projections, append one event, and
//! apply that event to the projections with [`apply`] — the same function
//! [`crate::Ledger::rebuild_projections`] replays, so live state and rebuilt state cannot drift.

use phrony_auth::Attribution;

use uuid::Uuid;

use crate::db::{Arg, Conn, Row, Tx, args};
use crate::error::{LedgerError, Result};
use crate::events::{append, lock_stream};
use crate::model::{
    Agent, AgentRef, AgentVersion, ArchivedAgent, Deployment, DeploymentAction, Event,
    NewAgentVersion, Published, RetiredVersion,
};
use crate::rows::{
    VERSION_SELECT, archived_cannot_run, find_version_by_id, version_cannot_run, version_from_row,
};

use crate::event_body::{
    AgentActivated, AgentActivationRefused, AgentArchived, AgentVersionChanged,
    AgentVersionPublished, EventBody, SecretEndpointChange, SecretEndpointRecord,
};

// ---------------------------------------------------------------------------------------------
// Projection reads.

pub(crate) use crate::rows::{AGENT_COLUMNS, agent_from_row, find_agent};

pub(crate) async fn require_agent(conn: &mut Conn<'_>, agent: &AgentRef) -> Result<Agent> {
    find_agent(conn, agent)
        .await?
        .ok_or_else(|| LedgerError::not_found(format!("agent {agent} not found")))
}

pub(crate) async fn list_agents(
    conn: &mut Conn<'_>,
    namespace: Option<&str>,
) -> Result<Vec<Agent>> {
    let rows = match namespace {
        Some(ns) => {
            let sql = format!(
                "SELECT {AGENT_COLUMNS} FROM agents WHERE namespace = $1 ORDER BY namespace, name"
            );
            conn.fetch_all("list agents", &sql, args![ns]).await?
        }
        None => {
            let sql = format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY namespace, name");
            conn.fetch_all("list agents", &sql, vec![]).await?
        }
    };
    rows.iter().map(agent_from_row).collect()
}

pub(crate) async fn find_version(
    conn: &mut Conn<'_>,
    agent_id: Uuid,
    version: &str,
) -> Result<Option<AgentVersion>> {
    let sql = format!("{VERSION_SELECT} WHERE v.agent_id = $1 AND v.version = $2");
    conn.fetch_optional("read agent version", &sql, args![agent_id, version])
        .await?
        .map(|row| version_from_row(&row))
        .transpose()
}

pub(crate) async fn list_versions(
    conn: &mut Conn<'_>,
    agent_id: Uuid,
) -> Result<Vec<AgentVersion>> {
    let sql = format!(
        "{VERSION_SELECT} WHERE v.agent_id = $1 AND v.origin = 'published' \
         ORDER BY v.event_seq DESC"
    );
    conn.fetch_all("list agent versions", &sql, args![agent_id])
        .await?
        .iter()
        .map(version_from_row)
        .collect()
}

const DEPLOYMENT_SELECT: &str = "SELECT d.id, d.agent_id, d.agent_version_id, v.version, \
     p.version AS previous_version, d.action, d.actor, d.created_at \
     FROM deployments d JOIN agent_versions v ON v.id = d.agent_version_id \
     LEFT JOIN agent_versions p ON p.id = d.previous_version_id";

fn deployment_from_row(row: &Row) -> Result<Deployment> {
    Ok(Deployment {
        id: row.uuid("id")?,
        agent_id: row.uuid("agent_id")?,
        version_id: row.uuid("agent_version_id")?,
        version: row.text("version")?,
        previous_version: row.opt_text("previous_version")?,
        action: DeploymentAction::parse(&row.text("action")?)?,
        actor: row.text("actor")?,
        created_at: row.ts("created_at")?,
    })
}

pub(crate) async fn list_deployments(
    conn: &mut Conn<'_>,
    agent_id: Uuid,
) -> Result<Vec<Deployment>> {
    let sql = format!("{DEPLOYMENT_SELECT} WHERE d.agent_id = $1 ORDER BY d.event_seq DESC");
    conn.fetch_all("list deployments", &sql, args![agent_id])
        .await?
        .iter()
        .map(deployment_from_row)
        .collect()
}

pub(crate) async fn active_deployment(
    conn: &mut Conn<'_>,
    agent_id: Uuid,
) -> Result<Option<Deployment>> {
    let sql =
        format!("{DEPLOYMENT_SELECT} WHERE d.agent_id = $1 ORDER BY d.event_seq DESC LIMIT 1");
    conn.fetch_optional("read active deployment", &sql, args![agent_id])
        .await?
        .map(|row| deployment_from_row(&row))
        .transpose()
}

// ---------------------------------------------------------------------------------------------
// Messages (Appendix A wording where it exists).

fn no_published_version(agent: &AgentRef, version: &str) -> LedgerError {
    LedgerError::not_found(format!(
        "no published version {version:?} for agent {agent}"
    ))
}

fn no_active_deployment(agent: &AgentRef) -> LedgerError {
    LedgerError::precondition(format!("no active deployment for agent {agent}"))
}

fn archived(agent: &AgentRef) -> LedgerError {
    LedgerError::precondition(format!("agent {agent} is archived"))
}

/// Refuses to activate a retired or deprecated version (`verb`: deployed | activated).
fn check_activatable(agent: &AgentRef, version: &AgentVersion, verb: &str) -> Result<()> {
    if version.retired_at.is_some() {
        return Err(LedgerError::precondition(format!(
            "agent {agent} version {:?} is retired and cannot be {verb}",
            version.version
        )));
    }
    if version.deprecated_at.is_some() {
        return Err(LedgerError::precondition(format!(
            "agent {agent} version {:?} is deprecated and cannot be {verb} \
             (deprecated versions cannot run; publish a new version instead)",
            version.version
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Write operations (called inside a write transaction by `Ledger`).

pub(crate) async fn publish(tx: &mut Tx, new: &NewAgentVersion) -> Result<Published> {
    let agent_ref = new.agent_ref();
    let mut head = lock_stream(tx, &agent_ref.stream()).await?;
    let existing_agent = find_agent(&mut tx.conn(), &agent_ref).await?;
    if let Some(agent) = &existing_agent {
        if agent.archived_at.is_some() {
            return Err(LedgerError::precondition(format!(
                "agent {} is archived and cannot accept new versions",
                agent_ref
            )));
        }
        if let Some(existing) = find_version(&mut tx.conn(), agent.id, &new.version).await? {
            if existing.content_hash == new.content_hash {
                return Ok(Published {
                    agent_id: agent.id,
                    version_id: existing.id,
                    agent: agent_ref.clone(),
                    version: existing.version,
                    content_hash: existing.content_hash,
                    created: false,
                });
            }
            return Err(LedgerError::AlreadyExists {
                message: format!(
                    "agent {} version {:?} is already deployed and cannot be changed; \
                     increment metadata.version to publish configuration updates \
                     (deployed content hash {}, manifest content hash {})",
                    agent_ref, new.version, existing.content_hash, new.content_hash
                ),
            });
        }
    }
    let agent_id = existing_agent.as_ref().map_or_else(Uuid::new_v4, |a| a.id);
    let payload = AgentVersionPublished {
        agent_id,
        namespace: new.namespace.clone(),
        name: new.name.clone(),
        owner: new.owner.clone(),
        labels: new.labels.clone(),
        version_id: Uuid::new_v4(),
        version: new.version.clone(),
        content_hash: new.content_hash.clone(),
        snapshot_json: new.snapshot_json.clone(),
    };
    let event = append(
        tx,
        &mut head,
        EventBody::AgentVersionPublished(payload.clone()).into_new_event(&new.actor)?,
    )
    .await?;
    apply(&mut tx.conn(), &event).await?;
    Ok(Published {
        agent_id,
        version_id: payload.version_id,
        agent: agent_ref.clone(),
        version: payload.version,
        content_hash: payload.content_hash,
        created: true,
    })
}

async fn activate(
    tx: &mut Tx,
    head: &mut crate::events::StreamHead,
    agent: &Agent,
    target: &AgentVersion,
    action: DeploymentAction,
    actor: &Attribution,
    secrets: Option<&SecretEndpointRecord>,
) -> Result<Deployment> {
    let previous = active_deployment(&mut tx.conn(), agent.id).await?;
    let payload = AgentActivated {
        agent_id: agent.id,
        deployment_id: Uuid::new_v4(),
        version_id: target.id,
        version: target.version.clone(),
        previous_version_id: previous.as_ref().map(|p| p.version_id),
        previous_version: previous.map(|p| p.version),
        secret_endpoints: secrets.map(|s| s.endpoints.clone()),
        secret_endpoint_changes: secrets.map(|s| s.changes.clone()).unwrap_or_default(),
    };
    let body = match action {
        DeploymentAction::Deploy => EventBody::AgentDeployed(payload.clone()),
        DeploymentAction::Rollback => EventBody::AgentRolledBack(payload.clone()),
    };
    let event = append(tx, head, body.into_new_event(actor)?).await?;
    apply(&mut tx.conn(), &event).await?;
    Ok(Deployment {
        id: payload.deployment_id,
        agent_id: agent.id,
        version_id: target.id,
        version: payload.version,
        previous_version: payload.previous_version,
        action,
        actor: actor.actor.clone(),
        created_at: event.ts,
    })
}

pub(crate) async fn deploy(
    tx: &mut Tx,
    agent_ref: &AgentRef,
    version: &str,
    actor: &Attribution,
    secrets: Option<&SecretEndpointRecord>,
) -> Result<Deployment> {
    let mut head = lock_stream(tx, &agent_ref.stream()).await?;
    let agent = require_agent(&mut tx.conn(), agent_ref).await?;
    if agent.archived_at.is_some() {
        return Err(archived(agent_ref));
    }
    let target = find_version(&mut tx.conn(), agent.id, version)
        .await?
        .ok_or_else(|| no_published_version(agent_ref, version))?;
    check_activatable(agent_ref, &target, "deployed")?;
    activate(
        tx,
        &mut head,
        &agent,
        &target,
        DeploymentAction::Deploy,
        actor,
        secrets,
    )
    .await
}

/// Records a refused deploy or rollback of `version` (see [`AgentActivationRefused`]). The
/// version must exist; nothing but the event is written.
pub(crate) async fn record_activation_refused(
    tx: &mut Tx,
    agent_ref: &AgentRef,
    version: &str,
    action: DeploymentAction,
    changes: &[SecretEndpointChange],
    actor: &Attribution,
) -> Result<()> {
    let mut head = lock_stream(tx, &agent_ref.stream()).await?;
    let agent = require_agent(&mut tx.conn(), agent_ref).await?;
    let target = find_version(&mut tx.conn(), agent.id, version)
        .await?
        .ok_or_else(|| no_published_version(agent_ref, version))?;
    let body = EventBody::AgentActivationRefused(AgentActivationRefused {
        agent_id: agent.id,
        version_id: target.id,
        version: target.version,
        action,
        changes: changes.to_vec(),
    });
    let event = append(tx, &mut head, body.into_new_event(actor)?).await?;
    apply(&mut tx.conn(), &event).await
}

pub(crate) async fn rollback(
    tx: &mut Tx,
    agent_ref: &AgentRef,
    to: Option<&str>,
    actor: &Attribution,
    secrets: Option<&SecretEndpointRecord>,
) -> Result<Deployment> {
    let mut head = lock_stream(tx, &agent_ref.stream()).await?;
    let agent = require_agent(&mut tx.conn(), agent_ref).await?;
    if agent.archived_at.is_some() {
        return Err(archived(agent_ref));
    }
    let current = active_deployment(&mut tx.conn(), agent.id)
        .await?
        .ok_or_else(|| no_active_deployment(agent_ref))?;
    let target = match to {
        Some(version) => find_version(&mut tx.conn(), agent.id, version)
            .await?
            .ok_or_else(|| no_published_version(agent_ref, version))?,
        None => {
            // The newest deployment of a different version than the current one.
            let row = tx
                .conn()
                .fetch_optional(
                    "find previous deployment",
                    "SELECT agent_version_id FROM deployments \
                     WHERE agent_id = $1 AND agent_version_id <> $2 \
                     ORDER BY event_seq DESC LIMIT 1",
                    args![agent.id, current.version_id],
                )
                .await?
                .ok_or_else(|| {
                    LedgerError::precondition(format!(
                        "no previous deployment to roll back to for agent {agent_ref}"
                    ))
                })?;
            let id = row.uuid("agent_version_id")?;
            find_version_by_id(&mut tx.conn(), id)
                .await?
                .ok_or_else(|| {
                    LedgerError::corrupt(format!("deployment references missing version {id}"))
                })?
        }
    };
    // Both branches refuse retired and deprecated targets (the reference skipped this check
    // when rolling back to the previous deployment).
    check_activatable(agent_ref, &target, "activated")?;
    activate(
        tx,
        &mut head,
        &agent,
        &target,
        DeploymentAction::Rollback,
        actor,
        secrets,
    )
    .await
}

pub(crate) async fn deprecate(
    tx: &mut Tx,
    agent_ref: &AgentRef,
    version: &str,
    actor: &Attribution,
) -> Result<AgentVersion> {
    retire_or_deprecate(tx, agent_ref, version, actor, VersionChange::Deprecate).await
}

pub(crate) async fn retire(
    tx: &mut Tx,
    agent_ref: &AgentRef,
    version: &str,
    actor: &Attribution,
) -> Result<AgentVersion> {
    retire_or_deprecate(tx, agent_ref, version, actor, VersionChange::Retire).await
}

/// The two ways a version is taken out of use; they differ only in what they record and say.
#[derive(Debug, Clone, Copy)]
enum VersionChange {
    Deprecate,
    Retire,
}

impl VersionChange {
    /// Whether `v` already had this change.
    fn applied_to(self, v: &AgentVersion) -> bool {
        match self {
            Self::Deprecate => v.deprecated_at.is_some(),
            Self::Retire => v.retired_at.is_some(),
        }
    }

    /// The reference's message for a missing (or already changed) version.
    fn not_found(self, agent_ref: &AgentRef, version: &str) -> LedgerError {
        LedgerError::not_found(match self {
            Self::Deprecate => format!("no active version {version:?} for agent {agent_ref}"),
            Self::Retire => format!("no version {version:?} for agent {agent_ref}"),
        })
    }

    fn body(self, changed: AgentVersionChanged) -> EventBody {
        match self {
            Self::Deprecate => EventBody::AgentVersionDeprecated(changed),
            Self::Retire => EventBody::AgentVersionRetired(changed),
        }
    }

    fn participle(self) -> &'static str {
        match self {
            Self::Deprecate => "deprecated",
            Self::Retire => "retired",
        }
    }
}

async fn retire_or_deprecate(
    tx: &mut Tx,
    agent_ref: &AgentRef,
    version: &str,
    actor: &Attribution,
    change: VersionChange,
) -> Result<AgentVersion> {
    let mut head = lock_stream(tx, &agent_ref.stream()).await?;
    let agent = require_agent(&mut tx.conn(), agent_ref).await?;
    if agent.archived_at.is_some() {
        return Err(archived(agent_ref));
    }
    let target = find_version(&mut tx.conn(), agent.id, version)
        .await?
        .filter(|v| !change.applied_to(v))
        .ok_or_else(|| change.not_found(agent_ref, version))?;
    refuse_if_active(tx, agent_ref, &agent, &target, change.participle()).await?;
    change_version(tx, &mut head, &agent, target, change, actor).await
}

/// Retires a version and, in the same transaction, fails its live sessions (their pending
/// approvals closed and open calls cancelled, so nothing they held is dispatched).
pub(crate) async fn retire_ending_sessions(
    tx: &mut Tx,
    agent_ref: &AgentRef,
    version: &str,
    actor: &Attribution,
) -> Result<RetiredVersion> {
    crate::sessions::lock_agent_sessions(tx, &agent_ref.namespace, &agent_ref.name).await?;
    let retired = retire(tx, agent_ref, version, actor).await?;
    let reason = format!(
        "agent version {agent_ref}@{} retired by {}",
        retired.version, actor.actor
    );
    let ended_sessions =
        crate::cascade::end_for_versions(tx, &[retired.id], &reason, actor).await?;
    Ok(RetiredVersion {
        version: retired,
        ended_sessions,
    })
}

/// Retiring or deprecating the active version would leave the agent deployed but unable to
/// run (a reference defect); the user must move the deployment first.
async fn refuse_if_active(
    tx: &mut Tx,
    agent_ref: &AgentRef,
    agent: &Agent,
    target: &AgentVersion,
    verb: &str,
) -> Result<()> {
    let active = active_deployment(&mut tx.conn(), agent.id).await?;
    if active.is_some_and(|a| a.version_id == target.id) {
        return Err(LedgerError::precondition(format!(
            "agent {agent_ref} version {:?} is the active deployment and cannot be {verb}; \
             deploy or roll back to another version first",
            target.version
        )));
    }
    Ok(())
}

async fn change_version(
    tx: &mut Tx,
    head: &mut crate::events::StreamHead,
    agent: &Agent,
    target: AgentVersion,
    change: VersionChange,
    actor: &Attribution,
) -> Result<AgentVersion> {
    let version_id = target.id;
    let body = change.body(AgentVersionChanged {
        agent_id: agent.id,
        version_id,
        version: target.version,
    });
    let event = append(tx, head, body.into_new_event(actor)?).await?;
    apply(&mut tx.conn(), &event).await?;
    find_version_by_id(&mut tx.conn(), version_id)
        .await?
        .ok_or_else(|| LedgerError::corrupt(format!("version {version_id} vanished")))
}

pub(crate) async fn archive(
    tx: &mut Tx,
    agent_ref: &AgentRef,
    actor: &Attribution,
) -> Result<ArchivedAgent> {
    // Before the stream lock: the order every session create takes them in.
    crate::sessions::lock_agent_sessions(tx, &agent_ref.namespace, &agent_ref.name).await?;
    let mut head = lock_stream(tx, &agent_ref.stream()).await?;
    let agent = require_agent(&mut tx.conn(), agent_ref).await?;
    if agent.archived_at.is_some() {
        return Err(LedgerError::precondition(format!(
            "agent {agent_ref} is already archived"
        )));
    }
    let mut to_deprecate: Vec<AgentVersion> = list_versions(&mut tx.conn(), agent.id)
        .await?
        .into_iter()
        .filter(|v| v.deprecated_at.is_none())
        .collect();
    to_deprecate.reverse(); // oldest first
    let payload = AgentArchived {
        agent_id: agent.id,
        deprecated_version_ids: to_deprecate.iter().map(|v| v.id).collect(),
        deprecated_versions: to_deprecate.into_iter().map(|v| v.version).collect(),
    };
    let event = append(
        tx,
        &mut head,
        EventBody::AgentArchived(payload.clone()).into_new_event(actor)?,
    )
    .await?;
    apply(&mut tx.conn(), &event).await?;
    let all: Vec<Uuid> = list_versions(&mut tx.conn(), agent.id)
        .await?
        .into_iter()
        .map(|v| v.id)
        .collect();
    let reason = format!("agent {agent_ref} archived by {}", actor.actor);
    let ended_sessions = crate::cascade::end_for_versions(tx, &all, &reason, actor).await?;
    Ok(ArchivedAgent {
        agent_id: agent.id,
        deprecated_versions: payload.deprecated_versions,
        archived_at: event.ts,
        ended_sessions,
    })
}

/// Resolves the version a new session may run (see [`crate::Ledger::runnable_version`]).
pub(crate) async fn runnable(
    conn: &mut Conn<'_>,
    agent_ref: &AgentRef,
    version: Option<&str>,
) -> Result<AgentVersion> {
    // One read: the agent, and the version of its latest deployment (none: `v.id` is NULL; a
    // deployment's version always exists, `deployments.agent_version_id` references it).
    const SQL: &str = concat!(
        "SELECT g.archived_at AS agent_archived_at, ",
        crate::rows::version_columns!(),
        " FROM agents g \
         LEFT JOIN agent_versions v ON v.id = (SELECT d.agent_version_id FROM deployments d \
         WHERE d.agent_id = g.id ORDER BY d.event_seq DESC LIMIT 1) \
         LEFT JOIN agents a ON a.id = v.agent_id \
         WHERE g.namespace = $1 AND g.name = $2"
    );
    let row = conn
        .fetch_optional(
            "read the runnable version",
            SQL,
            args![agent_ref.namespace.as_str(), agent_ref.name.as_str()],
        )
        .await?
        .ok_or_else(|| LedgerError::not_found(format!("agent {agent_ref} not found")))?;
    if row.opt_ts("agent_archived_at")?.is_some() {
        return Err(archived_cannot_run(agent_ref));
    }
    if row.opt_uuid("id")?.is_none() {
        return Err(no_active_deployment(agent_ref));
    }
    let target = version_from_row(&row)?;
    if let Some(requested) = version
        && requested != target.version
    {
        return Err(LedgerError::precondition(format!(
            "version {requested:?} is not the active deployment (active: {:?})",
            target.version
        )));
    }
    match version_cannot_run(&target) {
        Some(refusal) => Err(refusal),
        None => Ok(target),
    }
}

// ---------------------------------------------------------------------------------------------
// Projection writes: a pure function of the event (its ts, actor, seq and payload).

/// Applies one lifecycle event to the projection tables.
pub(crate) async fn apply(conn: &mut Conn<'_>, event: &Event) -> Result<()> {
    let seq = i64::try_from(event.seq)
        .map_err(|_| LedgerError::corrupt(format!("seq {} out of range", event.seq)))?;
    match event.body()? {
        EventBody::AgentVersionPublished(p) => {
            let labels = serde_json::to_value(&p.labels)
                .map_err(|e| LedgerError::corrupt(format!("labels: {e}")))?;
            conn.execute(
                "project agent",
                "INSERT INTO agents (id, namespace, name, owner, labels, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $6) \
                 ON CONFLICT (namespace, name) DO UPDATE \
                 SET owner = excluded.owner, labels = excluded.labels, \
                     updated_at = excluded.updated_at",
                vec![
                    Arg::from(p.agent_id),
                    Arg::from(&p.namespace),
                    Arg::from(&p.name),
                    Arg::from(&p.owner),
                    Arg::Json(labels),
                    Arg::from(event.ts),
                ],
            )
            .await?;
            conn.execute(
                "project agent version",
                "INSERT INTO agent_versions (id, agent_id, version, content_hash, snapshot, \
                 origin, published_by, published_at, event_seq) \
                 VALUES ($1, $2, $3, $4, $5, 'published', $6, $7, $8)",
                args![
                    p.version_id,
                    p.agent_id,
                    p.version,
                    p.content_hash,
                    p.snapshot_json,
                    &event.actor,
                    event.ts,
                    seq
                ],
            )
            .await?;
        }
        EventBody::AgentDeployed(p) => {
            apply_activated(conn, event, seq, DeploymentAction::Deploy, &p).await?
        }
        EventBody::AgentRolledBack(p) => {
            apply_activated(conn, event, seq, DeploymentAction::Rollback, &p).await?
        }
        // A refusal changes no projection; the event is the record.
        EventBody::AgentActivationRefused(_) => {}
        EventBody::AgentVersionDeprecated(p) => {
            apply_version_change(conn, event, VersionChange::Deprecate, &p).await?
        }
        EventBody::AgentVersionRetired(p) => {
            apply_version_change(conn, event, VersionChange::Retire, &p).await?
        }
        EventBody::AgentArchived(p) => {
            for id in &p.deprecated_version_ids {
                expect_one(
                    conn.execute(
                        "project archive",
                        "UPDATE agent_versions SET deprecated_at = $2, deprecated_by = $3 \
                         WHERE id = $1",
                        args![*id, event.ts, &event.actor],
                    )
                    .await?,
                    event,
                )?;
            }
            expect_one(
                conn.execute(
                    "project archive",
                    "UPDATE agents SET archived_at = $2, archived_by = $3, updated_at = $2 \
                     WHERE id = $1",
                    args![p.agent_id, event.ts, &event.actor],
                )
                .await?,
                event,
            )?;
        }
        EventBody::SessionStarted(_)
        | EventBody::SessionStatusChanged(_)
        | EventBody::SessionCompleted(_)
        | EventBody::SessionFailed(_)
        | EventBody::SessionCancelled(_)
        | EventBody::SessionPrincipal(_)
        | EventBody::MessageUser(_)
        | EventBody::MessageAssistant(_)
        | EventBody::ModelCompletion(_)
        | EventBody::OutputInvalid(_)
        | EventBody::OutputAccepted(_)
        | EventBody::EvidenceRecorded(_)
        | EventBody::ToolRequested(_)
        | EventBody::ToolQueued(_)
        | EventBody::ToolDispatched(_)
        | EventBody::ToolCompleted(_)
        | EventBody::ToolLateResult(_)
        | EventBody::ToolIndeterminate(_)
        | EventBody::ToolPolicyDenied(_)
        | EventBody::ToolCancelled(_)
        | EventBody::ApprovalRequired(_)
        | EventBody::ApprovalVote(_)
        | EventBody::ApprovalDecided(_)
        | EventBody::ApprovalEscalated(_)
        | EventBody::BundleVersionPublished(_)
        | EventBody::BundleDeployed(_)
        | EventBody::BundleRolledBack(_)
        | EventBody::BundleActivationRefused(_)
        | EventBody::TokenCreated(_)
        | EventBody::TokenRevoked(_)
        | EventBody::WebhookRetryRequested(_)
        | EventBody::WebhookUnconfigured(_)
        | EventBody::AuditKeyIntroduced(_)
        | EventBody::AuditUnverifiedLogAllowed(_)
        | EventBody::WorkerDescriptorRefused(_)
        | EventBody::PolicyShadow(_) => {
            return Err(LedgerError::corrupt(format!(
                "stream {} seq {}: event {} does not belong in an agent lifecycle stream",
                event.stream, event.seq, event.event_type
            )));
        }
    }
    Ok(())
}

async fn apply_activated(
    conn: &mut Conn<'_>,
    event: &Event,
    seq: i64,
    action: DeploymentAction,
    p: &AgentActivated,
) -> Result<()> {
    conn.execute(
        "project deployment",
        "INSERT INTO deployments (id, agent_id, agent_version_id, previous_version_id, \
                 action, actor, created_at, event_seq) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        args![
            p.deployment_id,
            p.agent_id,
            p.version_id,
            p.previous_version_id,
            action.as_str(),
            &event.actor,
            event.ts,
            seq
        ],
    )
    .await?;
    touch_agent(conn, p.agent_id, event).await?;
    Ok(())
}

async fn apply_version_change(
    conn: &mut Conn<'_>,
    event: &Event,
    change: VersionChange,
    p: &AgentVersionChanged,
) -> Result<()> {
    let sql = match change {
        VersionChange::Deprecate => {
            "UPDATE agent_versions SET deprecated_at = $2, deprecated_by = $3 WHERE id = $1"
        }
        VersionChange::Retire => {
            "UPDATE agent_versions SET retired_at = $2, retired_by = $3 WHERE id = $1"
        }
    };
    expect_one(
        conn.execute(
            "project version status",
            sql,
            args![p.version_id, event.ts, &event.actor],
        )
        .await?,
        event,
    )?;
    touch_agent(conn, p.agent_id, event).await?;
    Ok(())
}

async fn touch_agent(conn: &mut Conn<'_>, agent_id: Uuid, event: &Event) -> Result<()> {
    let n = conn
        .execute(
            "project agent update time",
            "UPDATE agents SET updated_at = $2 WHERE id = $1",
            args![agent_id, event.ts],
        )
        .await?;
    expect_one(n, event)
}

fn expect_one(rows: u64, event: &Event) -> Result<()> {
    if rows == 1 {
        Ok(())
    } else {
        Err(LedgerError::corrupt(format!(
            "stream {} seq {}: {} matched {rows} projection rows instead of 1",
            event.stream, event.seq, event.event_type
        )))
    }
}
