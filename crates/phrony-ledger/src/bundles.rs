//! Bundles: publish, deploy, rollback, and the reads that resolve a bundle run.
//!
//! The same pattern as the agent lifecycle (`lifecycle.rs`): every write locks the bundle's
//! stream (`bundle:<ns>/<name>`), checks the request against the projections, appends ONE
//! event and applies it with [`apply`], which [`Ledger::rebuild_projections`] replays. A
//! publish writes the bundle, its version, one vendored agent version per vendored member (no
//! `agents` row: the version row names the member's `metadata.namespace` / `metadata.name`) and
//! the member rows, all from the one `bundle.version_published` event, in one transaction. An
//! external member (`namespace.name@version`) gets no version of its own: its row points at the
//! published catalog version, which the publish checks exists and may be used.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use chrono::{DateTime, Utc};
use phrony_auth::Attribution;
use uuid::Uuid;

use crate::Ledger;
use crate::db::{Arg, Conn, Row, Tx, args};
use crate::error::{LedgerError, Result};
use crate::event_body::{
    BundleActivated, BundleActivationRefused, BundleMemberPublished, BundleVersionPublished,
    EventBody, SecretEndpointChange, SecretEndpointRecord, expect_rows,
};
use crate::events::{StreamHead, append, lock_stream};
use crate::model::{AgentVersion, BundleMemberOrigin, DeploymentAction, Event, VersionOrigin};
use crate::rows::{AgentVersionRef, find_version_by_id, version_cannot_run};

/// `namespace/name` of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BundleRef {
    /// The bundle's `metadata.namespace`.
    pub namespace: String,
    /// The bundle's `metadata.name`.
    pub name: String,
}

impl BundleRef {
    /// Builds a reference; see [`BundleRef::validate`].
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Checks that namespace and name are present and usable as a stream key, with the rule
    /// agents use ([`crate::AgentRef::validate`]).
    ///
    /// # Errors
    /// [`LedgerError::InvalidArgument`] naming the bad part.
    pub fn validate(&self) -> Result<()> {
        crate::model::validate_name_pair("bundle", &self.namespace, &self.name)
    }

    /// The bundle's event stream: `bundle:<namespace>/<name>`.
    #[must_use]
    pub fn stream(&self) -> String {
        format!("bundle:{self}")
    }
}

impl fmt::Display for BundleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Input of [`Ledger::publish_bundle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBundleVersion {
    /// The bundle (created on first publish).
    pub bundle: BundleRef,
    /// Its semver (`metadata.version`).
    pub version: String,
    /// `metadata.labels`; overwrite the bundle's labels on every new version.
    pub labels: BTreeMap<String, String>,
    /// The lock hash (`sha256:…`), as the caller computed it.
    pub lock_hash: String,
    /// The lock (`bundle.lock.json`) text, stored byte for byte; a JSON object.
    pub lock_json: String,
    /// The Bundle document as published, stored byte for byte; a JSON object.
    pub manifest_json: String,
    /// The closure: at least one member, exactly one of them the root.
    pub members: Vec<NewBundleMember>,
    /// Who published.
    pub actor: Attribution,
}

/// One member of a [`NewBundleVersion`]. A vendored member is stored as a new vendored agent
/// version; an external member names an existing published agent version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBundleMember {
    /// The member's name in the bundle (its `metadata.name`).
    pub child_name: String,
    /// Vendored (a new private version) or external (a published catalog version).
    pub origin: BundleMemberOrigin,
    /// The ref recorded in the lock.
    pub reference: String,
    /// Whether it is the root.
    pub is_root: bool,
    /// The content hash the lock recorded for it.
    pub lock_content_hash: String,
    /// Vendored: the id its vendored agent version gets, chosen by the caller (the members'
    /// snapshots are pinned to these ids before publish); must not name an existing version.
    /// External: the id of the published agent version it names; must name a published
    /// (catalog, not retired) version of `agent`, whose agent is not archived, with
    /// `content_hash`.
    pub version_id: Uuid,
    /// The member's `metadata.namespace/name@version` (external: the ref's).
    pub agent: AgentVersionRef,
    /// Its compiled snapshot (delegations pinned), stored byte for byte; a JSON object.
    /// Empty (and not stored) for an external member.
    pub snapshot_json: String,
    /// The snapshot's content hash (external: the published version's).
    pub content_hash: String,
}

/// Result of [`Ledger::publish_bundle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedBundle {
    /// The bundle's id.
    pub bundle_id: Uuid,
    /// The (new or existing) bundle version's id.
    pub version_id: Uuid,
    /// The bundle.
    pub bundle: BundleRef,
    /// The semver.
    pub version: String,
    /// The lock hash.
    pub lock_hash: String,
    /// The stored lock.
    pub lock_json: String,
    /// `false` when the same semver with the same lock hash was already published.
    pub created: bool,
}

/// A bundle (`bundles` row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    /// Id (UUID v4).
    pub id: Uuid,
    /// Namespace and name.
    pub bundle: BundleRef,
    /// Owner (always empty: a Bundle document has none).
    pub owner: String,
    /// Labels of the latest version.
    pub labels: BTreeMap<String, String>,
    /// First publish.
    pub created_at: DateTime<Utc>,
    /// Last event.
    pub updated_at: DateTime<Utc>,
}

/// An immutable bundle version (`bundle_versions` row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleVersion {
    /// Id (UUID v4).
    pub id: Uuid,
    /// The bundle's id.
    pub bundle_id: Uuid,
    /// The bundle.
    pub bundle: BundleRef,
    /// Semver.
    pub version: String,
    /// Lock hash (`sha256:…`).
    pub lock_hash: String,
    /// The lock text as published.
    pub lock_json: String,
    /// The Bundle document as published.
    pub manifest_json: String,
    /// The root member's agent version.
    pub root_member_version_id: Uuid,
    /// Who published it.
    pub published_by: String,
    /// When.
    pub published_at: DateTime<Utc>,
}

/// A member of a bundle version (`bundle_members` row with its agent version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleMember {
    /// The member's name in the bundle.
    pub child_name: String,
    /// Vendored or external.
    pub origin: BundleMemberOrigin,
    /// The ref recorded in the lock.
    pub reference: String,
    /// Its agent version.
    pub member_version_id: Uuid,
    /// Whether it is the root.
    pub is_root: bool,
    /// Its `namespace/name@version`.
    pub agent: AgentVersionRef,
    /// The content hash the lock recorded.
    pub lock_content_hash: String,
    /// The stored snapshot.
    pub snapshot_json: String,
}

/// One row of a bundle's append-only deployment history; the newest is active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleDeployment {
    /// Id (UUID v4).
    pub id: Uuid,
    /// The bundle's id.
    pub bundle_id: Uuid,
    /// The activated bundle version.
    pub version_id: Uuid,
    /// Its semver.
    pub version: String,
    /// Its lock hash.
    pub lock_hash: String,
    /// The version active before, if any.
    pub previous_version: Option<String>,
    /// Its lock hash.
    pub previous_lock_hash: Option<String>,
    /// Deploy or rollback.
    pub action: DeploymentAction,
    /// Who did it.
    pub actor: String,
    /// When.
    pub created_at: DateTime<Utc>,
}

/// What a bundle run starts: the active bundle version, its root member's agent version (the
/// session's version) and every member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnableBundle {
    /// The bundle version.
    pub version: BundleVersion,
    /// Its root member's agent version.
    pub root: AgentVersion,
    /// Its members, root first.
    pub members: Vec<BundleMember>,
}

// ---------------------------------------------------------------------------------------------
// Validation and messages.

fn require_text(what: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        return Err(LedgerError::invalid(format!("{what} is required")));
    }
    Ok(())
}

fn require_json_object(what: &str, text: &str) -> Result<()> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err(LedgerError::invalid(format!(
            "{what} must be a JSON object"
        ))),
        Err(e) => Err(LedgerError::invalid(format!(
            "{what} is not valid JSON: {e}"
        ))),
    }
}

impl NewBundleVersion {
    pub(crate) fn validate(&self) -> Result<()> {
        self.bundle.validate()?;
        require_text("version", &self.version)?;
        require_text("lock_hash", &self.lock_hash)?;
        require_text("actor", &self.actor.actor)?;
        require_json_object("lock_json", &self.lock_json)?;
        require_json_object("manifest_json", &self.manifest_json)?;
        if self.members.is_empty() {
            return Err(LedgerError::invalid("members is required"));
        }
        let roots = self.members.iter().filter(|m| m.is_root).count();
        if roots != 1 {
            return Err(LedgerError::invalid(format!(
                "members must include exactly one is_root member (got {roots})"
            )));
        }
        let mut names = BTreeSet::new();
        let mut ids = BTreeSet::new();
        for (i, m) in self.members.iter().enumerate() {
            require_text(&format!("members[{i}].child_name"), &m.child_name)?;
            if !names.insert(m.child_name.as_str()) {
                return Err(LedgerError::invalid(format!(
                    "duplicate members[{i}].child_name {:?}",
                    m.child_name
                )));
            }
            if m.version_id.is_nil() || !ids.insert(m.version_id) {
                return Err(LedgerError::invalid(format!(
                    "members[{i}].version_id {} must be a fresh id, unique in the bundle",
                    m.version_id
                )));
            }
            m.agent.validate()?;
            require_text(&format!("members[{i}].content_hash"), &m.content_hash)?;
            match m.origin {
                BundleMemberOrigin::Vendored => {
                    require_json_object(&format!("members[{i}].snapshot_json"), &m.snapshot_json)?;
                }
                BundleMemberOrigin::External => {
                    if m.is_root {
                        return Err(LedgerError::invalid(format!(
                            "members[{i}] {:?}: an external member cannot be the root",
                            m.child_name
                        )));
                    }
                    if !m.snapshot_json.is_empty() {
                        return Err(LedgerError::invalid(format!(
                            "members[{i}] {:?}: an external member carries no snapshot",
                            m.child_name
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

fn require_version_or_lock_hash(version: &str) -> Result<()> {
    if version.is_empty() {
        return Err(LedgerError::invalid(
            "bundle_ref requires namespace, name, and version (semver or lock hash)",
        ));
    }
    Ok(())
}

fn bundle_not_found(bundle: &BundleRef) -> LedgerError {
    LedgerError::not_found(format!("bundle {bundle} not found"))
}

fn no_published_version(bundle: &BundleRef, version: &str) -> LedgerError {
    LedgerError::not_found(format!(
        "no published version {version:?} for bundle {bundle}"
    ))
}

fn no_active_deployment(bundle: &BundleRef) -> LedgerError {
    LedgerError::precondition(format!("no active deployment for bundle {bundle}"))
}

// ---------------------------------------------------------------------------------------------
// Projection reads.

const BUNDLE_COLUMNS: &str = "id, namespace, name, owner, labels, created_at, updated_at";

fn bundle_from_row(row: &Row) -> Result<Bundle> {
    let labels: BTreeMap<String, String> = serde_json::from_value(row.json("labels")?)
        .map_err(|e| LedgerError::corrupt(format!("bundles.labels: {e}")))?;
    Ok(Bundle {
        id: row.uuid("id")?,
        bundle: BundleRef::new(row.text("namespace")?, row.text("name")?),
        owner: row.text("owner")?,
        labels,
        created_at: row.ts("created_at")?,
        updated_at: row.ts("updated_at")?,
    })
}

async fn find_bundle(conn: &mut Conn<'_>, bundle: &BundleRef) -> Result<Option<Bundle>> {
    let sql = format!("SELECT {BUNDLE_COLUMNS} FROM bundles WHERE namespace = $1 AND name = $2");
    conn.fetch_optional("read bundle", &sql, args![&bundle.namespace, &bundle.name])
        .await?
        .map(|row| bundle_from_row(&row))
        .transpose()
}

async fn require_bundle(conn: &mut Conn<'_>, bundle: &BundleRef) -> Result<Bundle> {
    find_bundle(conn, bundle)
        .await?
        .ok_or_else(|| bundle_not_found(bundle))
}

const VERSION_SELECT: &str = "SELECT bv.id, bv.bundle_id, b.namespace, b.name, bv.version, \
     bv.lock_hash, bv.lock, bv.manifest, bv.root_member_version_id, bv.published_by, \
     bv.created_at FROM bundle_versions bv JOIN bundles b ON b.id = bv.bundle_id";

fn version_from_row(row: &Row) -> Result<BundleVersion> {
    let id = row.uuid("id")?;
    Ok(BundleVersion {
        id,
        bundle_id: row.uuid("bundle_id")?,
        bundle: BundleRef::new(row.text("namespace")?, row.text("name")?),
        version: row.text("version")?,
        lock_hash: row.text("lock_hash")?,
        lock_json: row.text("lock")?,
        manifest_json: row.text("manifest")?,
        root_member_version_id: row.opt_uuid("root_member_version_id")?.ok_or_else(|| {
            LedgerError::corrupt(format!("bundle version {id} has no root member"))
        })?,
        published_by: row.text("published_by")?,
        published_at: row.ts("created_at")?,
    })
}

/// Which column names a bundle version.
#[derive(Debug, Clone, Copy)]
enum VersionKey {
    /// The semver.
    Semver,
    /// The lock hash.
    LockHash,
    /// Either (a semver never starts with `sha256:`).
    Either,
}

async fn find_version(
    conn: &mut Conn<'_>,
    bundle_id: Uuid,
    key: VersionKey,
    value: &str,
) -> Result<Option<BundleVersion>> {
    let predicate = match key {
        VersionKey::Semver => "bv.version = $2",
        VersionKey::LockHash => "bv.lock_hash = $2",
        VersionKey::Either => "(bv.version = $2 OR bv.lock_hash = $2)",
    };
    let sql = format!("{VERSION_SELECT} WHERE bv.bundle_id = $1 AND {predicate}");
    conn.fetch_optional("read bundle version", &sql, args![bundle_id, value])
        .await?
        .map(|row| version_from_row(&row))
        .transpose()
}

async fn find_bundle_version(conn: &mut Conn<'_>, id: Uuid) -> Result<Option<BundleVersion>> {
    let sql = format!("{VERSION_SELECT} WHERE bv.id = $1");
    conn.fetch_optional("read bundle version", &sql, args![id])
        .await?
        .map(|row| version_from_row(&row))
        .transpose()
}

/// A bundle version a stored row points at: missing means the projections are corrupt.
async fn find_version_by_bundle_version_id(conn: &mut Conn<'_>, id: Uuid) -> Result<BundleVersion> {
    find_bundle_version(conn, id)
        .await?
        .ok_or_else(|| LedgerError::corrupt(format!("bundle version {id} is missing")))
}

async fn list_versions(conn: &mut Conn<'_>, bundle_id: Uuid) -> Result<Vec<BundleVersion>> {
    let sql = format!("{VERSION_SELECT} WHERE bv.bundle_id = $1 ORDER BY bv.event_seq DESC");
    conn.fetch_all("list bundle versions", &sql, args![bundle_id])
        .await?
        .iter()
        .map(version_from_row)
        .collect()
}

async fn list_members(conn: &mut Conn<'_>, version_id: Uuid) -> Result<Vec<BundleMember>> {
    conn.fetch_all(
        "list bundle members",
        "SELECT m.child_name, m.origin, m.ref, m.member_version_id, m.is_root, \
         m.lock_content_hash, COALESCE(a.namespace, v.member_namespace) AS namespace, \
         COALESCE(a.name, v.member_name) AS name, v.version, v.snapshot \
         FROM bundle_members m JOIN agent_versions v ON v.id = m.member_version_id \
         LEFT JOIN agents a ON a.id = v.agent_id \
         WHERE m.bundle_version_id = $1 ORDER BY m.is_root DESC, m.child_name",
        args![version_id],
    )
    .await?
    .iter()
    .map(|row| {
        Ok(BundleMember {
            child_name: row.text("child_name")?,
            origin: BundleMemberOrigin::parse(&row.text("origin")?)?,
            reference: row.text("ref")?,
            member_version_id: row.uuid("member_version_id")?,
            is_root: row.bool("is_root")?,
            agent: AgentVersionRef::new(
                row.text("namespace")?,
                row.text("name")?,
                row.text("version")?,
            ),
            lock_content_hash: row.text("lock_content_hash")?,
            snapshot_json: row.text("snapshot")?,
        })
    })
    .collect()
}

const DEPLOYMENT_SELECT: &str = "SELECT d.id, d.bundle_id, d.bundle_version_id, v.version, \
     v.lock_hash, p.version AS previous_version, p.lock_hash AS previous_lock_hash, d.action, \
     d.actor, d.created_at \
     FROM bundle_deployments d JOIN bundle_versions v ON v.id = d.bundle_version_id \
     LEFT JOIN bundle_versions p ON p.id = d.previous_version_id";

fn deployment_from_row(row: &Row) -> Result<BundleDeployment> {
    Ok(BundleDeployment {
        id: row.uuid("id")?,
        bundle_id: row.uuid("bundle_id")?,
        version_id: row.uuid("bundle_version_id")?,
        version: row.text("version")?,
        lock_hash: row.text("lock_hash")?,
        previous_version: row.opt_text("previous_version")?,
        previous_lock_hash: row.opt_text("previous_lock_hash")?,
        action: DeploymentAction::parse(&row.text("action")?)?,
        actor: row.text("actor")?,
        created_at: row.ts("created_at")?,
    })
}

async fn list_deployments(conn: &mut Conn<'_>, bundle_id: Uuid) -> Result<Vec<BundleDeployment>> {
    let sql = format!("{DEPLOYMENT_SELECT} WHERE d.bundle_id = $1 ORDER BY d.event_seq DESC");
    conn.fetch_all("list bundle deployments", &sql, args![bundle_id])
        .await?
        .iter()
        .map(deployment_from_row)
        .collect()
}

async fn active_deployment(
    conn: &mut Conn<'_>,
    bundle_id: Uuid,
) -> Result<Option<BundleDeployment>> {
    let sql =
        format!("{DEPLOYMENT_SELECT} WHERE d.bundle_id = $1 ORDER BY d.event_seq DESC LIMIT 1");
    conn.fetch_optional("read active bundle deployment", &sql, args![bundle_id])
        .await?
        .map(|row| deployment_from_row(&row))
        .transpose()
}

/// The version `version` names (semver or lock hash), or the active one when `None`, with
/// whether it is active.
async fn resolve_version(
    conn: &mut Conn<'_>,
    bundle_ref: &BundleRef,
    version: Option<&str>,
) -> Result<(BundleVersion, bool)> {
    let bundle = require_bundle(conn, bundle_ref).await?;
    let active = active_deployment(conn, bundle.id).await?;
    let target = match version {
        Some(v) => find_version(conn, bundle.id, VersionKey::Either, v)
            .await?
            .ok_or_else(|| no_published_version(bundle_ref, v))?,
        None => {
            let active = active
                .as_ref()
                .ok_or_else(|| no_active_deployment(bundle_ref))?;
            find_version_by_bundle_version_id(conn, active.version_id).await?
        }
    };
    let is_active = active.is_some_and(|a| a.version_id == target.id);
    Ok((target, is_active))
}

/// Resolves what a bundle session runs (see [`Ledger::runnable_bundle`]).
async fn runnable(
    conn: &mut Conn<'_>,
    bundle_ref: &BundleRef,
    version: Option<&str>,
) -> Result<RunnableBundle> {
    let bundle = require_bundle(conn, bundle_ref).await?;
    let active = active_deployment(conn, bundle.id)
        .await?
        .ok_or_else(|| no_active_deployment(bundle_ref))?;
    if let Some(requested) = version
        && requested != active.version
        && requested != active.lock_hash
    {
        return Err(LedgerError::precondition(format!(
            "version {requested:?} is not the active bundle deployment (active: {:?})",
            active.version
        )));
    }
    let target = find_version_by_bundle_version_id(conn, active.version_id).await?;
    let root = find_version_by_id(conn, target.root_member_version_id)
        .await?
        .ok_or_else(|| {
            LedgerError::precondition(format!(
                "bundle {bundle_ref} version {:?} has no root member",
                target.version
            ))
        })?;
    if let Some(refusal) = version_cannot_run(&root) {
        return Err(refusal);
    }
    let members = list_members(conn, target.id).await?;
    Ok(RunnableBundle {
        version: target,
        root,
        members,
    })
}

// ---------------------------------------------------------------------------------------------
// Writes (inside a write transaction).

async fn publish(tx: &mut Tx, new: &NewBundleVersion) -> Result<PublishedBundle> {
    let mut head = lock_stream(tx, &new.bundle.stream()).await?;
    let existing = find_bundle(&mut tx.conn(), &new.bundle).await?;
    if let Some(bundle) = &existing {
        let same_semver =
            find_version(&mut tx.conn(), bundle.id, VersionKey::Semver, &new.version).await?;
        if let Some(v) = &same_semver
            && v.lock_hash == new.lock_hash
        {
            return Ok(PublishedBundle {
                bundle_id: bundle.id,
                version_id: v.id,
                bundle: new.bundle.clone(),
                version: v.version.clone(),
                lock_hash: v.lock_hash.clone(),
                lock_json: v.lock_json.clone(),
                created: false,
            });
        }
        if let Some(v) = find_version(
            &mut tx.conn(),
            bundle.id,
            VersionKey::LockHash,
            &new.lock_hash,
        )
        .await?
        {
            return Err(LedgerError::AlreadyExists {
                message: format!(
                    "bundle lock hash {:?} is already published as version {:?} and cannot be \
                     changed",
                    new.lock_hash, v.version
                ),
            });
        }
        if let Some(v) = same_semver {
            return Err(LedgerError::AlreadyExists {
                message: format!(
                    "bundle {} version {:?} is already published and cannot be changed; \
                     increment metadata.version to publish a new closure (published lock hash \
                     {}, lock hash {})",
                    new.bundle, new.version, v.lock_hash, new.lock_hash
                ),
            });
        }
    }
    for m in &new.members {
        let found = find_version_by_id(&mut tx.conn(), m.version_id).await?;
        match m.origin {
            BundleMemberOrigin::Vendored => {
                if found.is_some() {
                    return Err(LedgerError::AlreadyExists {
                        message: format!(
                            "bundle member {:?}: agent version {} already exists",
                            m.child_name, m.version_id
                        ),
                    });
                }
            }
            BundleMemberOrigin::External => check_external(tx, m, found).await?,
        }
    }
    let payload = published_payload(new, existing.map_or_else(Uuid::new_v4, |b| b.id))?;
    let event = append(
        tx,
        &mut head,
        EventBody::BundleVersionPublished(payload.clone()).into_new_event(&new.actor)?,
    )
    .await?;
    apply(&mut tx.conn(), &event).await?;
    Ok(PublishedBundle {
        bundle_id: payload.bundle_id,
        version_id: payload.version_id,
        bundle: new.bundle.clone(),
        version: payload.version,
        lock_hash: payload.lock_hash,
        lock_json: payload.lock_json,
        created: true,
    })
}

/// An external member must name a published catalog version of its agent, with its content
/// hash, neither retired nor of an archived agent.
async fn check_external(
    tx: &mut Tx,
    m: &NewBundleMember,
    found: Option<AgentVersion>,
) -> Result<()> {
    let refused = |why: String| {
        LedgerError::precondition(format!(
            "external bundle member {:?} ({}): {why}",
            m.child_name, m.agent
        ))
    };
    let Some(v) = found else {
        return Err(refused(format!(
            "agent version {} does not exist",
            m.version_id
        )));
    };
    if v.origin != VersionOrigin::Published {
        return Err(refused(format!(
            "agent version {} is a vendored bundle member, not a published version",
            m.version_id
        )));
    }
    if v.agent.namespace != m.agent.namespace
        || v.agent.name != m.agent.name
        || v.version != m.agent.version
    {
        return Err(refused(format!(
            "agent version {} is {}@{}",
            m.version_id, v.agent, v.version
        )));
    }
    if v.content_hash != m.content_hash {
        return Err(refused(format!(
            "content hash {:?} differs from the published version's {:?}",
            m.content_hash, v.content_hash
        )));
    }
    if v.retired_at.is_some() {
        return Err(refused("the version is retired".to_owned()));
    }
    let agent = crate::rows::find_agent(&mut tx.conn(), &v.agent).await?;
    if agent.is_none_or(|a| a.archived_at.is_some()) {
        return Err(refused(format!("agent {} is archived", v.agent)));
    }
    Ok(())
}

fn published_payload(new: &NewBundleVersion, bundle_id: Uuid) -> Result<BundleVersionPublished> {
    let root =
        new.members.iter().find(|m| m.is_root).ok_or_else(|| {
            LedgerError::invalid("members must include exactly one is_root member")
        })?;
    Ok(BundleVersionPublished {
        bundle_id,
        namespace: new.bundle.namespace.clone(),
        name: new.bundle.name.clone(),
        labels: new.labels.clone(),
        version_id: Uuid::new_v4(),
        version: new.version.clone(),
        lock_hash: new.lock_hash.clone(),
        lock_json: new.lock_json.clone(),
        manifest_json: new.manifest_json.clone(),
        root_member_version_id: root.version_id,
        members: new
            .members
            .iter()
            .map(|m| BundleMemberPublished {
                child_name: m.child_name.clone(),
                origin: m.origin,
                reference: m.reference.clone(),
                is_root: m.is_root,
                version_id: m.version_id,
                namespace: m.agent.namespace.clone(),
                name: m.agent.name.clone(),
                version: m.agent.version.clone(),
                lock_content_hash: m.lock_content_hash.clone(),
                content_hash: m.content_hash.clone(),
                snapshot_json: (m.origin == BundleMemberOrigin::Vendored)
                    .then(|| m.snapshot_json.clone()),
            })
            .collect(),
    })
}

async fn activate(
    tx: &mut Tx,
    head: &mut StreamHead,
    bundle: &Bundle,
    target: &BundleVersion,
    action: DeploymentAction,
    actor: &Attribution,
    secrets: Option<&SecretEndpointRecord>,
) -> Result<BundleDeployment> {
    let previous = active_deployment(&mut tx.conn(), bundle.id).await?;
    let payload = BundleActivated {
        bundle_id: bundle.id,
        deployment_id: Uuid::new_v4(),
        version_id: target.id,
        version: target.version.clone(),
        lock_hash: target.lock_hash.clone(),
        previous_version_id: previous.as_ref().map(|p| p.version_id),
        previous_version: previous.as_ref().map(|p| p.version.clone()),
        previous_lock_hash: previous.map(|p| p.lock_hash),
        secret_endpoints: secrets.map(|s| s.endpoints.clone()),
        secret_endpoint_changes: secrets.map(|s| s.changes.clone()).unwrap_or_default(),
    };
    let body = match action {
        DeploymentAction::Deploy => EventBody::BundleDeployed(payload.clone()),
        DeploymentAction::Rollback => EventBody::BundleRolledBack(payload.clone()),
    };
    let event = append(tx, head, body.into_new_event(actor)?).await?;
    apply(&mut tx.conn(), &event).await?;
    Ok(BundleDeployment {
        id: payload.deployment_id,
        bundle_id: bundle.id,
        version_id: target.id,
        version: payload.version,
        lock_hash: payload.lock_hash,
        previous_version: payload.previous_version,
        previous_lock_hash: payload.previous_lock_hash,
        action,
        actor: actor.actor.clone(),
        created_at: event.ts,
    })
}

async fn deploy(
    tx: &mut Tx,
    bundle_ref: &BundleRef,
    version: &str,
    actor: &Attribution,
    secrets: Option<&SecretEndpointRecord>,
) -> Result<BundleDeployment> {
    let mut head = lock_stream(tx, &bundle_ref.stream()).await?;
    let bundle = require_bundle(&mut tx.conn(), bundle_ref).await?;
    let target = find_version(&mut tx.conn(), bundle.id, VersionKey::Either, version)
        .await?
        .ok_or_else(|| no_published_version(bundle_ref, version))?;
    activate(
        tx,
        &mut head,
        &bundle,
        &target,
        DeploymentAction::Deploy,
        actor,
        secrets,
    )
    .await
}

/// Records a refused deploy or rollback of `version` (semver or lock hash; see
/// [`BundleActivationRefused`]). The version must exist; nothing but the event is written.
async fn record_activation_refused(
    tx: &mut Tx,
    bundle_ref: &BundleRef,
    version: &str,
    action: DeploymentAction,
    changes: &[SecretEndpointChange],
    actor: &Attribution,
) -> Result<()> {
    let mut head = lock_stream(tx, &bundle_ref.stream()).await?;
    let bundle = require_bundle(&mut tx.conn(), bundle_ref).await?;
    let target = find_version(&mut tx.conn(), bundle.id, VersionKey::Either, version)
        .await?
        .ok_or_else(|| no_published_version(bundle_ref, version))?;
    let body = EventBody::BundleActivationRefused(BundleActivationRefused {
        bundle_id: bundle.id,
        version_id: target.id,
        version: target.version,
        lock_hash: target.lock_hash,
        action,
        changes: changes.to_vec(),
    });
    let event = append(tx, &mut head, body.into_new_event(actor)?).await?;
    apply(&mut tx.conn(), &event).await
}

async fn rollback(
    tx: &mut Tx,
    bundle_ref: &BundleRef,
    to: Option<&str>,
    actor: &Attribution,
    secrets: Option<&SecretEndpointRecord>,
) -> Result<BundleDeployment> {
    let mut head = lock_stream(tx, &bundle_ref.stream()).await?;
    let bundle = require_bundle(&mut tx.conn(), bundle_ref).await?;
    let current = active_deployment(&mut tx.conn(), bundle.id)
        .await?
        .ok_or_else(|| no_active_deployment(bundle_ref))?;
    let target = match to {
        Some(version) => find_version(&mut tx.conn(), bundle.id, VersionKey::Either, version)
            .await?
            .ok_or_else(|| no_published_version(bundle_ref, version))?,
        None => {
            // The newest deployment of a different version than the active one.
            let row = tx
                .conn()
                .fetch_optional(
                    "find previous bundle deployment",
                    "SELECT bundle_version_id FROM bundle_deployments \
                     WHERE bundle_id = $1 AND bundle_version_id <> $2 \
                     ORDER BY event_seq DESC LIMIT 1",
                    args![bundle.id, current.version_id],
                )
                .await?
                .ok_or_else(|| {
                    LedgerError::precondition(format!(
                        "no previous deployment to roll back to for bundle {bundle_ref}"
                    ))
                })?;
            find_version_by_bundle_version_id(&mut tx.conn(), row.uuid("bundle_version_id")?)
                .await?
        }
    };
    activate(
        tx,
        &mut head,
        &bundle,
        &target,
        DeploymentAction::Rollback,
        actor,
        secrets,
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// Projection writes: a pure function of the event.

/// Applies one event of a bundle stream to the projections (live and on rebuild).
pub(crate) async fn apply(conn: &mut Conn<'_>, event: &Event) -> Result<()> {
    let seq = i64::try_from(event.seq)
        .map_err(|_| LedgerError::corrupt(format!("seq {} out of range", event.seq)))?;
    match event.body()? {
        EventBody::BundleVersionPublished(p) => apply_published(conn, event, seq, &p).await,
        EventBody::BundleDeployed(p) => {
            apply_activated(conn, event, seq, DeploymentAction::Deploy, &p).await
        }
        EventBody::BundleRolledBack(p) => {
            apply_activated(conn, event, seq, DeploymentAction::Rollback, &p).await
        }
        // A refusal changes no projection; the event is the record.
        EventBody::BundleActivationRefused(_) => Ok(()),
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
        | EventBody::AgentVersionPublished(_)
        | EventBody::AgentDeployed(_)
        | EventBody::AgentRolledBack(_)
        | EventBody::AgentActivationRefused(_)
        | EventBody::AgentVersionDeprecated(_)
        | EventBody::AgentVersionRetired(_)
        | EventBody::AgentArchived(_)
        | EventBody::TokenCreated(_)
        | EventBody::TokenRevoked(_)
        | EventBody::WebhookRetryRequested(_)
        | EventBody::WebhookUnconfigured(_)
        | EventBody::AuditKeyIntroduced(_)
        | EventBody::AuditUnverifiedLogAllowed(_)
        | EventBody::WorkerDescriptorRefused(_)
        | EventBody::PolicyShadow(_) => Err(LedgerError::corrupt(format!(
            "stream {} seq {}: event {} does not belong in a bundle stream",
            event.stream, event.seq, event.event_type
        ))),
    }
}

async fn apply_published(
    conn: &mut Conn<'_>,
    event: &Event,
    seq: i64,
    p: &BundleVersionPublished,
) -> Result<()> {
    let labels = serde_json::to_value(&p.labels)
        .map_err(|e| LedgerError::corrupt(format!("labels: {e}")))?;
    conn.execute(
        "project bundle",
        "INSERT INTO bundles (id, namespace, name, owner, labels, created_at, updated_at) \
         VALUES ($1, $2, $3, '', $4, $5, $5) \
         ON CONFLICT (namespace, name) DO UPDATE \
         SET labels = excluded.labels, updated_at = excluded.updated_at",
        vec![
            Arg::from(p.bundle_id),
            Arg::from(&p.namespace),
            Arg::from(&p.name),
            Arg::Json(labels),
            Arg::from(event.ts),
        ],
    )
    .await?;
    conn.execute(
        "project bundle version",
        "INSERT INTO bundle_versions (id, bundle_id, version, lock_hash, lock, manifest, \
         root_member_version_id, published_by, created_at, event_seq) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        args![
            p.version_id,
            p.bundle_id,
            &p.version,
            &p.lock_hash,
            &p.lock_json,
            &p.manifest_json,
            p.root_member_version_id,
            &event.actor,
            event.ts,
            seq
        ],
    )
    .await?;
    for m in &p.members {
        if m.origin == BundleMemberOrigin::Vendored {
            let snapshot = m.snapshot_json.as_deref().ok_or_else(|| {
                LedgerError::corrupt(format!(
                    "stream {} seq {}: vendored member {:?} has no snapshot",
                    event.stream, event.seq, m.child_name
                ))
            })?;
            conn.execute(
                "project vendored agent version",
                "INSERT INTO agent_versions (id, agent_id, version, content_hash, snapshot, \
                 origin, bundle_version_id, published_by, published_at, event_seq, \
                 member_namespace, member_name) \
                 VALUES ($1, NULL, $2, $3, $4, 'vendored', $5, $6, $7, $8, $9, $10)",
                args![
                    m.version_id,
                    &m.version,
                    &m.content_hash,
                    snapshot,
                    p.version_id,
                    &event.actor,
                    event.ts,
                    seq,
                    &m.namespace,
                    &m.name
                ],
            )
            .await?;
        }
        conn.execute(
            "project bundle member",
            "INSERT INTO bundle_members (bundle_version_id, child_name, member_version_id, ref, \
             origin, is_root, lock_content_hash) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            args![
                p.version_id,
                &m.child_name,
                m.version_id,
                &m.reference,
                m.origin.as_str(),
                m.is_root,
                &m.lock_content_hash
            ],
        )
        .await?;
    }
    Ok(())
}

async fn apply_activated(
    conn: &mut Conn<'_>,
    event: &Event,
    seq: i64,
    action: DeploymentAction,
    p: &BundleActivated,
) -> Result<()> {
    conn.execute(
        "project bundle deployment",
        "INSERT INTO bundle_deployments (id, bundle_id, bundle_version_id, previous_version_id, \
         action, actor, created_at, event_seq) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        args![
            p.deployment_id,
            p.bundle_id,
            p.version_id,
            p.previous_version_id,
            action.as_str(),
            &event.actor,
            event.ts,
            seq
        ],
    )
    .await?;
    let rows = conn
        .execute(
            "project bundle update time",
            "UPDATE bundles SET updated_at = $2 WHERE id = $1",
            args![p.bundle_id, event.ts],
        )
        .await?;
    expect_rows(rows, 1, event)
}

// ---------------------------------------------------------------------------------------------
// Public API.

impl Ledger {
    /// Publishes an immutable bundle version (creating the bundle on first publish): the
    /// bundle version, one vendored agent version per vendored member (with the caller's
    /// version ids), the member rows (an external member's row names the published version it
    /// refers to) and the root, from one `bundle.version_published` event, in one
    /// transaction. Does not deploy it. Re-publishing the same semver with the same lock hash
    /// returns the existing version (`created = false`) and writes nothing.
    ///
    /// # Errors
    /// - `InvalidArgument`: a bad bundle or member ref, empty fields, a lock, manifest or
    ///   snapshot that is not a JSON object, no members (`members is required`), not exactly
    ///   one root, duplicate child names or version ids;
    /// - `AlreadyExists`: `bundle lock hash "…" is already published as version "…" and cannot
    ///   be changed`; `bundle ns/name version "v" is already published and cannot be changed;
    ///   increment metadata.version …`; a vendored member version id that already exists;
    /// - `FailedPrecondition`: an external member whose version id does not name a published
    ///   (not vendored, not retired) version of its agent with its content hash, or whose agent
    ///   is archived (`external bundle member "x" (ns/name@v): …`). An external member that is
    ///   the root or carries a snapshot is `InvalidArgument`.
    pub async fn publish_bundle(&self, new: &NewBundleVersion) -> Result<PublishedBundle> {
        new.validate()?;
        write_tx!(self, |tx| publish(&mut tx, new))
    }

    /// Activates a bundle version named by its semver or its `sha256:` lock hash (appends a
    /// `deploy` row; re-deploying the active version is allowed).
    ///
    /// # Errors
    /// `NotFound`: `bundle ns/name not found`, `no published version "v" for bundle ns/name`.
    pub async fn deploy_bundle(
        &self,
        bundle: &BundleRef,
        version_or_lock_hash: &str,
        actor: &Attribution,
    ) -> Result<BundleDeployment> {
        self.deploy_bundle_recording(bundle, version_or_lock_hash, actor, None)
            .await
    }

    /// [`Ledger::deploy_bundle`], recording where the version's members send their secrets
    /// (`secrets`, computed by the caller) in the `bundle.deployed` event.
    ///
    /// # Errors
    /// As [`Ledger::deploy_bundle`].
    pub async fn deploy_bundle_recording(
        &self,
        bundle: &BundleRef,
        version_or_lock_hash: &str,
        actor: &Attribution,
        secrets: Option<&SecretEndpointRecord>,
    ) -> Result<BundleDeployment> {
        bundle.validate()?;
        require_version_or_lock_hash(version_or_lock_hash)?;
        require_text("actor", &actor.actor)?;
        write_tx!(self, |tx| deploy(
            &mut tx,
            bundle,
            version_or_lock_hash,
            actor,
            secrets
        ))
    }

    /// Records that a deploy or rollback of `version_or_lock_hash` was refused because its
    /// members would send the secrets in `changes` to endpoints no earlier deployment of the
    /// bundle used (`bundle.activation_refused` on the bundle's stream, by `actor`). Nothing
    /// else changes.
    ///
    /// # Errors
    /// `NotFound` (bundle or version), `InvalidArgument` (empty version or actor), the
    /// database's errors.
    pub async fn record_bundle_activation_refused(
        &self,
        bundle: &BundleRef,
        version_or_lock_hash: &str,
        action: DeploymentAction,
        changes: &[SecretEndpointChange],
        actor: &Attribution,
    ) -> Result<()> {
        bundle.validate()?;
        require_version_or_lock_hash(version_or_lock_hash)?;
        require_text("actor", &actor.actor)?;
        write_tx!(self, |tx| record_activation_refused(
            &mut tx,
            bundle,
            version_or_lock_hash,
            action,
            changes,
            actor
        ))
    }

    /// Re-activates `to` (semver or lock hash), or (when `None`) the version of the newest
    /// deployment that differs from the active one. Records a `rollback` row.
    ///
    /// # Errors
    /// `NotFound` (bundle or version); `FailedPrecondition`: `no active deployment for bundle
    /// ns/name`, `no previous deployment to roll back to for bundle ns/name`.
    pub async fn rollback_bundle(
        &self,
        bundle: &BundleRef,
        to: Option<&str>,
        actor: &Attribution,
    ) -> Result<BundleDeployment> {
        bundle.validate()?;
        require_text("actor", &actor.actor)?;
        let to = to.filter(|v| !v.is_empty());
        write_tx!(self, |tx| rollback(&mut tx, bundle, to, actor, None))
    }

    /// [`Ledger::rollback_bundle`] to `to` (semver or lock hash), recording where that
    /// version's members send their secrets (`secrets`, computed by the caller) in the
    /// `bundle.rolled_back` event.
    ///
    /// # Errors
    /// As [`Ledger::rollback_bundle`]; `InvalidArgument` for an empty `to`.
    pub async fn rollback_bundle_recording(
        &self,
        bundle: &BundleRef,
        to: &str,
        actor: &Attribution,
        secrets: &SecretEndpointRecord,
    ) -> Result<BundleDeployment> {
        bundle.validate()?;
        require_version_or_lock_hash(to)?;
        require_text("actor", &actor.actor)?;
        write_tx!(self, |tx| rollback(
            &mut tx,
            bundle,
            Some(to),
            actor,
            Some(secrets)
        ))
    }

    /// The active bundle deployment (the newest deploy or rollback row).
    ///
    /// # Errors
    /// `NotFound` for an unknown bundle; `FailedPrecondition`: `no active deployment for
    /// bundle ns/name`.
    pub async fn active_bundle(&self, bundle: &BundleRef) -> Result<BundleDeployment> {
        bundle.validate()?;
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let b = require_bundle(&mut c, bundle).await?;
        active_deployment(&mut c, b.id)
            .await?
            .ok_or_else(|| no_active_deployment(bundle))
    }

    /// Bundles, ordered by namespace then name.
    ///
    /// # Errors
    /// Database errors only.
    pub async fn list_bundles(&self, namespace: Option<&str>) -> Result<Vec<Bundle>> {
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let rows = match namespace.filter(|n| !n.is_empty()) {
            Some(ns) => {
                let sql = format!(
                    "SELECT {BUNDLE_COLUMNS} FROM bundles WHERE namespace = $1 \
                     ORDER BY namespace, name"
                );
                c.fetch_all("list bundles", &sql, args![ns]).await?
            }
            None => {
                let sql = format!("SELECT {BUNDLE_COLUMNS} FROM bundles ORDER BY namespace, name");
                c.fetch_all("list bundles", &sql, vec![]).await?
            }
        };
        rows.iter().map(bundle_from_row).collect()
    }

    /// A bundle's versions, newest publish first.
    ///
    /// # Errors
    /// `NotFound` for an unknown bundle.
    pub async fn list_bundle_versions(&self, bundle: &BundleRef) -> Result<Vec<BundleVersion>> {
        bundle.validate()?;
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let b = require_bundle(&mut c, bundle).await?;
        list_versions(&mut c, b.id).await
    }

    /// A bundle's deployment history, newest first.
    ///
    /// # Errors
    /// `NotFound` for an unknown bundle.
    pub async fn list_bundle_deployments(
        &self,
        bundle: &BundleRef,
    ) -> Result<Vec<BundleDeployment>> {
        bundle.validate()?;
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let b = require_bundle(&mut c, bundle).await?;
        list_deployments(&mut c, b.id).await
    }

    /// One bundle version, by semver or `sha256:` lock hash (`None`: the active one), with its
    /// members (root first) and whether it is the active deployment.
    ///
    /// # Errors
    /// `NotFound` (bundle; `no published version "v" for bundle ns/name`);
    /// `FailedPrecondition` (`no active deployment for bundle ns/name`, `None` only).
    pub async fn get_bundle_version(
        &self,
        bundle: &BundleRef,
        version: Option<&str>,
    ) -> Result<(BundleVersion, Vec<BundleMember>, bool)> {
        bundle.validate()?;
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let (target, active) =
            resolve_version(&mut c, bundle, version.filter(|v| !v.is_empty())).await?;
        let members = list_members(&mut c, target.id).await?;
        Ok((target, members, active))
    }

    /// What a bundle session runs: the active bundle deployment's version, its root member's
    /// agent version and its members. An explicit `version` (semver or lock hash) must name
    /// the active one.
    ///
    /// # Errors
    /// `NotFound` (`bundle ns/name not found`); `FailedPrecondition` (`no active deployment
    /// for bundle ns/name`, `version "x" is not the active bundle deployment (active: "y")`,
    /// a root version that cannot run).
    pub async fn runnable_bundle(
        &self,
        bundle: &BundleRef,
        version: Option<&str>,
    ) -> Result<RunnableBundle> {
        bundle.validate()?;
        let mut conn = self.pool.acquire().await?;
        runnable(&mut conn.conn(), bundle, version.filter(|v| !v.is_empty())).await
    }

    /// The members of the bundle version with id `version_id` (root first), each with its
    /// stored snapshot; empty for an id that names no bundle version.
    ///
    /// # Errors
    /// Database errors, and `Corrupt` for a member row that does not read.
    pub async fn list_bundle_members(&self, version_id: Uuid) -> Result<Vec<BundleMember>> {
        let mut conn = self.pool.acquire().await?;
        list_members(&mut conn.conn(), version_id).await
    }

    /// One bundle version by its id (what a bundle session records).
    ///
    /// # Errors
    /// `NotFound`: `bundle version "id" not found`.
    pub async fn get_bundle_version_by_id(&self, id: Uuid) -> Result<BundleVersion> {
        let mut conn = self.pool.acquire().await?;
        find_bundle_version(&mut conn.conn(), id)
            .await?
            .ok_or_else(|| LedgerError::not_found(format!("bundle version \"{id}\" not found")))
    }
}
