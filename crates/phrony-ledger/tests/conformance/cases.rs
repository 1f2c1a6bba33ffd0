//! The backend-independent conformance cases. Each takes a fresh [`TestDb`].

use std::collections::{BTreeMap, BTreeSet};

use phrony_ledger::{
    AgentRef, Backend, DeploymentAction, GENESIS_HASH, Ledger, LedgerError, NewAgentVersion,
    NewEvent, VersionStatus, ViolationKind,
};
use serde_json::json;

use crate::harness::TestDb;

pub(crate) use crate::audit_cases::*;
pub(crate) use crate::bundle_cases::*;
pub(crate) use crate::commit_cases::*;
pub(crate) use crate::history_cases::*;
pub(crate) use crate::inbox_cases::*;
pub(crate) use crate::lease_cases::*;
pub(crate) use crate::plan_cases::*;
pub(crate) use crate::session_cases::*;
pub(crate) use crate::shadow_cases::*;
pub(crate) use crate::token_cases::*;
pub(crate) use crate::webhook_cases::*;

// ---------------------------------------------------------------------------------------------
// helpers

fn agent() -> AgentRef {
    AgentRef::new("support", "refund-agent")
}

fn snapshot(version: &str, extra: &str) -> String {
    format!(
        r#"{{"apiVersion":"phrony.com/v1","kind":"Agent","metadata":{{"namespace":"support","name":"refund-agent","version":"{version}"}},"spec":{{"instructions":"{extra}"}}}}"#
    )
}

fn new_version(agent: &AgentRef, version: &str, content: &str) -> NewAgentVersion {
    NewAgentVersion {
        namespace: agent.namespace.clone(),
        name: agent.name.clone(),
        version: version.to_owned(),
        owner: "payments-team".to_owned(),
        labels: BTreeMap::from([("tier".to_owned(), "gold".to_owned())]),
        snapshot_json: snapshot(version, content),
        content_hash: format!("hash-{version}-{content}"),
        actor: phrony_ledger::Attribution::unverified("alice".to_owned()),
    }
}

async fn publish(ledger: &Ledger, agent: &AgentRef, version: &str) {
    let p = ledger
        .publish_agent_version(new_version(agent, version, "v"))
        .await
        .unwrap();
    assert!(p.created);
}

#[track_caller]
fn assert_precondition(result: Result<impl std::fmt::Debug, LedgerError>, expected: &str) {
    match result {
        Err(LedgerError::FailedPrecondition { message }) => assert_eq!(message, expected),
        other => panic!("expected FailedPrecondition {expected:?}, got {other:?}"),
    }
}

#[track_caller]
fn assert_not_found(result: Result<impl std::fmt::Debug, LedgerError>, expected: &str) {
    match result {
        Err(LedgerError::NotFound { message }) => assert_eq!(message, expected),
        other => panic!("expected NotFound {expected:?}, got {other:?}"),
    }
}

#[track_caller]
fn assert_invalid(result: Result<impl std::fmt::Debug, LedgerError>, contains: &str) {
    match result {
        Err(LedgerError::InvalidArgument { message }) => {
            assert!(
                message.contains(contains),
                "{message:?} should contain {contains:?}"
            );
        }
        other => panic!("expected InvalidArgument containing {contains:?}, got {other:?}"),
    }
}

async fn event_types(ledger: &Ledger, stream: &str) -> Vec<(String, String)> {
    ledger
        .list_events(stream, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.event_type, e.actor))
        .collect()
}

async fn append_n(ledger: &Ledger, stream: &str, n: usize) {
    for i in 0..n {
        let mut e = NewEvent::new(
            "message.user",
            "user",
            json!({"role": "user", "content": format!("m{i}")}),
        );
        e.turn = Some(u32::try_from(i).unwrap());
        ledger.append_session_event(stream, e).await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// schema

pub(crate) async fn migrations_are_idempotent_and_versioned(db: &TestDb) {
    assert_eq!(db.ledger.schema_version().await.unwrap(), None);
    // Two replicas starting at the same moment both migrate the fresh database.
    let replica = Ledger::connect(&db.url).await.unwrap();
    let (a, b) = tokio::join!(db.ledger.migrate(), replica.migrate());
    a.unwrap();
    b.unwrap();
    // The version is the number of the last migration: adding `0008_*.sql` moves it to "8"
    // without anyone editing a constant.
    let latest = crate::harness::latest_schema_version(db.kind);
    assert_eq!(
        db.ledger.schema_version().await.unwrap().as_deref(),
        Some(latest.as_str())
    );
    db.ledger.migrate().await.unwrap();
    // A restart (a new pool) migrates again without error and keeps the data.
    publish(&db.ledger, &agent(), "1.0.0").await;
    let again = db.another_ledger().await;
    again.migrate().await.unwrap();
    assert_eq!(
        again.schema_version().await.unwrap().as_deref(),
        Some(latest.as_str())
    );
    assert_eq!(again.list_agents(None).await.unwrap().len(), 1);
    again.ping().await.unwrap();
    assert_eq!(again.backend(), db.kind);

    // A database migrated by a newer build is refused with an actionable message.
    let blob = match db.kind {
        Backend::Sqlite => "X'00'",
        Backend::Postgres => "'\\x00'::bytea",
    };
    db.raw_exec(&format!(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', TRUE, {blob}, 0)"
    ))
    .await;
    match again.migrate().await {
        Err(LedgerError::Migration { message, .. }) => assert_eq!(
            message,
            "the database has schema migration 9999, which this build does not know: it was \
             migrated by a newer phrony-runtime; upgrade this binary"
        ),
        other => panic!("expected a Migration error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// publish

pub(crate) async fn publish_creates_agent_and_immutable_version(db: &TestDb) {
    let ledger = db.migrated().await;
    let a = agent();
    let new = new_version(&a, "1.0.0", "first");
    let published = ledger.publish_agent_version(new.clone()).await.unwrap();
    assert!(published.created);
    assert_eq!(published.agent, a);
    assert_eq!(published.version, "1.0.0");
    assert_eq!(published.content_hash, new.content_hash);

    let v = ledger.get_agent_version(&a, "1.0.0").await.unwrap();
    assert_eq!(v.id, published.version_id);
    assert_eq!(v.agent_id, Some(published.agent_id));
    assert_eq!(
        v.snapshot_json, new.snapshot_json,
        "snapshot must be stored byte for byte"
    );
    assert_eq!(v.published_by, "alice");
    assert_eq!(v.status(), VersionStatus::Published);
    assert_eq!(ledger.get_agent_version_by_id(v.id).await.unwrap(), v);

    let agents = ledger.list_agents(None).await.unwrap();
    assert_eq!(agents.len(), 1);
    assert_eq!(agents[0].id, published.agent_id);
    assert_eq!(agents[0].owner, "payments-team");
    assert_eq!(
        agents[0].labels.get("tier").map(String::as_str),
        Some("gold")
    );
    assert!(agents[0].archived_at.is_none());

    // Publishing does not deploy.
    assert_precondition(
        ledger.active_version(&a).await,
        "no active deployment for agent support/refund-agent",
    );

    // The audit event carries the actor and a snake_case payload with the snapshot.
    let events = ledger.list_events(&a.stream(), 0, 100).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_type, "agent.version_published");
    assert_eq!(events[0].actor, "alice");
    assert_eq!(events[0].payload["version"], "1.0.0");
    assert_eq!(events[0].payload["content_hash"], new.content_hash.as_str());
    assert_eq!(
        events[0].payload["snapshot_json"],
        new.snapshot_json.as_str()
    );
}

pub(crate) async fn republish_is_idempotent_only_for_identical_content(db: &TestDb) {
    let ledger = db.migrated().await;
    let a = agent();
    let first = ledger
        .publish_agent_version(new_version(&a, "1.0.0", "x"))
        .await
        .unwrap();

    let mut same = new_version(&a, "1.0.0", "x");
    same.actor = "bob".into();
    let again = ledger.publish_agent_version(same).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.version_id, first.version_id);
    assert_eq!(again.agent_id, first.agent_id);
    assert_eq!(
        ledger
            .get_agent_version(&a, "1.0.0")
            .await
            .unwrap()
            .published_by,
        "alice",
        "an idempotent re-publish changes nothing"
    );
    assert_eq!(
        event_types(ledger, &a.stream()).await.len(),
        1,
        "no event for a no-op"
    );

    let changed = ledger
        .publish_agent_version(new_version(&a, "1.0.0", "y"))
        .await;
    match changed {
        Err(LedgerError::AlreadyExists { message }) => assert_eq!(
            message,
            "agent support/refund-agent version \"1.0.0\" is already deployed and cannot be \
             changed; increment metadata.version to publish configuration updates (deployed \
             content hash hash-1.0.0-x, manifest content hash hash-1.0.0-y)"
        ),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(ledger.list_agent_versions(&a).await.unwrap().len(), 1);
}

pub(crate) async fn publish_rejects_bad_input(db: &TestDb) {
    let ledger = db.migrated().await;
    let mut n = new_version(&agent(), "1.0.0", "x");
    n.namespace = String::new();
    assert_invalid(
        ledger.publish_agent_version(n).await,
        "agent_ref requires namespace and name",
    );

    let mut n = new_version(&agent(), "1.0.0", "x");
    n.name = "a/b".into();
    assert_invalid(
        ledger.publish_agent_version(n).await,
        "must not contain '/'",
    );

    // The manifest validator's rule (phrony_manifest::check_agent_name), word for word.
    let mut n = new_version(&agent(), "1.0.0", "x");
    n.name = "refund\u{7}agent".into();
    assert_invalid(
        ledger.publish_agent_version(n).await,
        "agent name \"refund\\u{7}agent\" must not contain control characters (U+0007 at byte 6)",
    );

    let mut n = new_version(&agent(), "1.0.0", "x");
    n.snapshot_json = "{not json".into();
    assert_invalid(
        ledger.publish_agent_version(n).await,
        "snapshot_json is not valid JSON",
    );

    let mut n = new_version(&agent(), "1.0.0", "x");
    n.snapshot_json = "[1]".into();
    assert_invalid(
        ledger.publish_agent_version(n).await,
        "snapshot_json must be a JSON object",
    );

    for field in ["version", "content_hash", "actor"] {
        let mut n = new_version(&agent(), "1.0.0", "x");
        match field {
            "version" => n.version.clear(),
            "content_hash" => n.content_hash.clear(),
            _ => n.actor.actor.clear(),
        }
        assert_invalid(
            ledger.publish_agent_version(n).await,
            &format!("{field} is required"),
        );
    }
    assert!(
        ledger.list_agents(None).await.unwrap().is_empty(),
        "nothing half-written"
    );
}

pub(crate) async fn publish_updates_owner_and_labels_of_the_agent(db: &TestDb) {
    let ledger = db.migrated().await;
    let a = agent();
    publish(ledger, &a, "1.0.0").await;
    let mut n = new_version(&a, "1.1.0", "v");
    n.owner = "risk-team".into();
    n.labels = BTreeMap::from([
        ("tier".into(), "silver".into()),
        ("pii".into(), "yes".into()),
    ]);
    ledger.publish_agent_version(n).await.unwrap();
    let got = ledger.get_agent(&a).await.unwrap();
    assert_eq!(got.owner, "risk-team");
    assert_eq!(got.labels.len(), 2);
    assert_eq!(got.labels["tier"], "silver");
    assert!(got.updated_at > got.created_at);
}

// ---------------------------------------------------------------------------------------------
// deploy / active / history

pub(crate) async fn deploy_activates_versions_and_records_history(db: &TestDb) {
    let ledger = db.migrated().await;
    let a = agent();
    assert_not_found(
        ledger
            .deploy(&a, "1.0.0", &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "agent support/refund-agent not found",
    );
    assert_not_found(
        ledger.active_version(&a).await,
        "agent support/refund-agent not found",
    );
    assert_not_found(
        ledger.list_deployments(&a).await,
        "agent support/refund-agent not found",
    );
    publish(ledger, &a, "1.0.0").await;
    publish(ledger, &a, "2.0.0").await;
    assert_not_found(
        ledger
            .deploy(&a, "9.9.9", &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "no published version \"9.9.9\" for agent support/refund-agent",
    );
    assert_invalid(
        ledger
            .deploy(&a, "", &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "requires namespace, name, and version",
    );
    assert_invalid(
        ledger
            .deploy(&a, "1.0.0", &phrony_ledger::Attribution::unverified(""))
            .await,
        "actor is required",
    );

    let d1 = ledger
        .deploy(&a, "1.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    assert_eq!(
        (d1.version.as_str(), d1.previous_version.as_deref()),
        ("1.0.0", None)
    );
    assert_eq!(d1.action, DeploymentAction::Deploy);
    let d2 = ledger
        .deploy(
            &a,
            "2.0.0",
            &phrony_ledger::Attribution::unverified("carol"),
        )
        .await
        .unwrap();
    assert_eq!(d2.previous_version.as_deref(), Some("1.0.0"));

    let active = ledger.active_version(&a).await.unwrap();
    assert_eq!(active, d2);
    assert_eq!(active.actor, "carol");

    // Re-deploying the active version is allowed and appends a row.
    let d3 = ledger
        .deploy(&a, "2.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    assert_eq!(d3.previous_version.as_deref(), Some("2.0.0"));
    let history = ledger.list_deployments(&a).await.unwrap();
    assert_eq!(history, vec![d3.clone(), d2, d1], "newest first");
    assert_eq!(
        ledger.runnable_version(&a, None).await.unwrap().version,
        "2.0.0"
    );

    let events = ledger.list_events(&a.stream(), 2, 100).await.unwrap();
    assert_eq!(events.len(), 3);
    assert_eq!(events[2].event_type, "agent.deployed");
    assert_eq!(events[2].payload["version"], "2.0.0");
    assert_eq!(events[2].payload["previous_version"], "2.0.0");
    assert_eq!(events[2].ts, d3.created_at);
}

pub(crate) async fn deploy_refuses_retired_and_deprecated_versions(db: &TestDb) {
    let ledger = db.migrated().await;
    let a = agent();
    for v in ["1.0.0", "2.0.0", "3.0.0"] {
        publish(ledger, &a, v).await;
    }
    ledger
        .retire_version(&a, "1.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    ledger
        .deprecate_version(&a, "2.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    assert_precondition(
        ledger
            .deploy(&a, "1.0.0", &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "agent support/refund-agent version \"1.0.0\" is retired and cannot be deployed",
    );
    assert_precondition(
        ledger
            .deploy(&a, "2.0.0", &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "agent support/refund-agent version \"2.0.0\" is deprecated and cannot be deployed \
         (deprecated versions cannot run; publish a new version instead)",
    );
    assert!(ledger.list_deployments(&a).await.unwrap().is_empty());
    ledger
        .deploy(&a, "3.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
}

pub(crate) async fn rollback_checks_every_branch(db: &TestDb) {
    let ledger = db.migrated().await;
    let a = agent();
    assert_not_found(
        ledger
            .rollback(&a, None, &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "agent support/refund-agent not found",
    );
    for v in ["1.0.0", "2.0.0", "3.0.0", "4.0.0"] {
        publish(ledger, &a, v).await;
    }
    assert_precondition(
        ledger
            .rollback(&a, None, &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "no active deployment for agent support/refund-agent",
    );
    ledger
        .deploy(&a, "1.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    assert_precondition(
        ledger
            .rollback(&a, None, &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "no previous deployment to roll back to for agent support/refund-agent",
    );
    ledger
        .deploy(&a, "2.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();

    let r = ledger
        .rollback(&a, None, &phrony_ledger::Attribution::unverified("dave"))
        .await
        .unwrap();
    assert_eq!(r.action, DeploymentAction::Rollback);
    assert_eq!(
        (r.version.as_str(), r.previous_version.as_deref()),
        ("1.0.0", Some("2.0.0"))
    );
    assert_eq!(r.actor, "dave");
    // Rolling back again toggles to the newest different version (2.0.0).
    assert_eq!(
        ledger
            .rollback(&a, None, &phrony_ledger::Attribution::unverified("dave"))
            .await
            .unwrap()
            .version,
        "2.0.0"
    );

    // Explicit target.
    assert_not_found(
        ledger
            .rollback(
                &a,
                Some("7.0.0"),
                &phrony_ledger::Attribution::unverified("ops"),
            )
            .await,
        "no published version \"7.0.0\" for agent support/refund-agent",
    );
    assert_eq!(
        ledger
            .rollback(
                &a,
                Some("3.0.0"),
                &phrony_ledger::Attribution::unverified("ops")
            )
            .await
            .unwrap()
            .version,
        "3.0.0"
    );
    // Rolling "to" the active version is allowed.
    assert_eq!(
        ledger
            .rollback(
                &a,
                Some("3.0.0"),
                &phrony_ledger::Attribution::unverified("ops")
            )
            .await
            .unwrap()
            .version,
        "3.0.0"
    );

    // Retired / deprecated targets are refused on both branches.
    ledger
        .retire_version(&a, "2.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    assert_precondition(
        ledger
            .rollback(
                &a,
                Some("2.0.0"),
                &phrony_ledger::Attribution::unverified("ops"),
            )
            .await,
        "agent support/refund-agent version \"2.0.0\" is retired and cannot be activated",
    );
    // Active 3.0.0; the newest different deployment is 2.0.0 (retired): refused, not skipped.
    assert_precondition(
        ledger
            .rollback(&a, None, &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "agent support/refund-agent version \"2.0.0\" is retired and cannot be activated",
    );
    ledger
        .deploy(&a, "4.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    ledger
        .deprecate_version(&a, "3.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    assert_precondition(
        ledger
            .rollback(&a, None, &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "agent support/refund-agent version \"3.0.0\" is deprecated and cannot be activated \
         (deprecated versions cannot run; publish a new version instead)",
    );
    assert_precondition(
        ledger
            .rollback(
                &a,
                Some("3.0.0"),
                &phrony_ledger::Attribution::unverified("ops"),
            )
            .await,
        "agent support/refund-agent version \"3.0.0\" is deprecated and cannot be activated \
         (deprecated versions cannot run; publish a new version instead)",
    );
    assert_eq!(ledger.active_version(&a).await.unwrap().version, "4.0.0");
}

// ---------------------------------------------------------------------------------------------
// deprecate / retire / archive

pub(crate) async fn deprecate_and_retire_follow_the_rules(db: &TestDb) {
    let ledger = db.migrated().await;
    let a = agent();
    for v in ["1.0.0", "2.0.0", "3.0.0"] {
        publish(ledger, &a, v).await;
    }
    ledger
        .deploy(&a, "3.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();

    assert_precondition(
        ledger
            .retire_version(&a, "3.0.0", &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "agent support/refund-agent version \"3.0.0\" is the active deployment and cannot be \
         retired; deploy or roll back to another version first",
    );
    assert_precondition(
        ledger
            .deprecate_version(&a, "3.0.0", &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "agent support/refund-agent version \"3.0.0\" is the active deployment and cannot be \
         deprecated; deploy or roll back to another version first",
    );

    let retired = ledger
        .retire_version(&a, "1.0.0", &phrony_ledger::Attribution::unverified("erin"))
        .await
        .unwrap()
        .version;
    assert_eq!(retired.status(), VersionStatus::Retired);
    assert_eq!(retired.retired_by.as_deref(), Some("erin"));
    assert!(retired.retired_at.is_some());
    assert_not_found(
        ledger
            .retire_version(&a, "1.0.0", &phrony_ledger::Attribution::unverified("erin"))
            .await,
        "no version \"1.0.0\" for agent support/refund-agent",
    );
    assert_not_found(
        ledger
            .retire_version(&a, "8.0.0", &phrony_ledger::Attribution::unverified("erin"))
            .await,
        "no version \"8.0.0\" for agent support/refund-agent",
    );

    let deprecated = ledger
        .deprecate_version(
            &a,
            "2.0.0",
            &phrony_ledger::Attribution::unverified("frank"),
        )
        .await
        .unwrap();
    assert_eq!(deprecated.status(), VersionStatus::Deprecated);
    assert_eq!(deprecated.deprecated_by.as_deref(), Some("frank"));
    assert_not_found(
        ledger
            .deprecate_version(
                &a,
                "2.0.0",
                &phrony_ledger::Attribution::unverified("frank"),
            )
            .await,
        "no active version \"2.0.0\" for agent support/refund-agent",
    );
    // A deprecated version can still be retired (retired wins in the status).
    assert_eq!(
        ledger
            .retire_version(&a, "2.0.0", &phrony_ledger::Attribution::unverified("ops"))
            .await
            .unwrap()
            .version
            .status(),
        VersionStatus::Retired
    );

    let versions = ledger.list_agent_versions(&a).await.unwrap();
    let summary: Vec<_> = versions
        .iter()
        .map(|v| (v.version.as_str(), v.status()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("3.0.0", VersionStatus::Published),
            ("2.0.0", VersionStatus::Retired),
            ("1.0.0", VersionStatus::Retired),
        ],
        "newest publish first"
    );
}

pub(crate) async fn archive_freezes_the_agent(db: &TestDb) {
    let ledger = db.migrated().await;
    let a = agent();
    assert_not_found(
        ledger
            .archive_agent(&a, &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "agent support/refund-agent not found",
    );
    for v in ["1.0.0", "2.0.0", "3.0.0"] {
        publish(ledger, &a, v).await;
    }
    ledger
        .deprecate_version(&a, "1.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    ledger
        .deploy(&a, "3.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();

    let archived = ledger
        .archive_agent(&a, &phrony_ledger::Attribution::unverified("grace"))
        .await
        .unwrap();
    assert_eq!(
        archived.deprecated_versions,
        vec!["2.0.0".to_owned(), "3.0.0".to_owned()]
    );
    for v in ledger.list_agent_versions(&a).await.unwrap() {
        assert_eq!(v.status(), VersionStatus::Deprecated, "{}", v.version);
    }
    let agents = ledger.list_agents(Some("support")).await.unwrap();
    assert_eq!(agents.len(), 1, "archived agents stay listed");
    assert_eq!(agents[0].archived_at, Some(archived.archived_at));
    assert_eq!(agents[0].archived_by.as_deref(), Some("grace"));

    let is_archived = "agent support/refund-agent is archived";
    assert_precondition(
        ledger
            .publish_agent_version(new_version(&a, "4.0.0", "v"))
            .await,
        "agent support/refund-agent is archived and cannot accept new versions",
    );
    assert_precondition(
        ledger
            .deploy(&a, "3.0.0", &phrony_ledger::Attribution::unverified("ops"))
            .await,
        is_archived,
    );
    assert_precondition(
        ledger
            .rollback(&a, None, &phrony_ledger::Attribution::unverified("ops"))
            .await,
        is_archived,
    );
    assert_precondition(
        ledger
            .deprecate_version(&a, "2.0.0", &phrony_ledger::Attribution::unverified("ops"))
            .await,
        is_archived,
    );
    assert_precondition(
        ledger
            .retire_version(&a, "2.0.0", &phrony_ledger::Attribution::unverified("ops"))
            .await,
        is_archived,
    );
    assert_precondition(
        ledger.runnable_version(&a, None).await,
        "agent support/refund-agent is archived and cannot be run",
    );
    assert_precondition(
        ledger
            .archive_agent(&a, &phrony_ledger::Attribution::unverified("ops"))
            .await,
        "agent support/refund-agent is already archived",
    );
    // Reads still work.
    assert_eq!(ledger.active_version(&a).await.unwrap().version, "3.0.0");
    assert_eq!(
        ledger.get_agent_version(&a, "1.0.0").await.unwrap().version,
        "1.0.0"
    );
}

pub(crate) async fn runnable_version_requires_a_healthy_active_deployment(db: &TestDb) {
    let ledger = db.migrated().await;
    let a = agent();
    assert_not_found(
        ledger.runnable_version(&a, None).await,
        "agent support/refund-agent not found",
    );
    publish(ledger, &a, "1.0.0").await;
    publish(ledger, &a, "2.0.0").await;
    assert_precondition(
        ledger.runnable_version(&a, None).await,
        "no active deployment for agent support/refund-agent",
    );
    ledger
        .deploy(&a, "2.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    let v = ledger.runnable_version(&a, None).await.unwrap();
    assert_eq!(v.version, "2.0.0");
    assert_eq!(ledger.runnable_version(&a, Some("2.0.0")).await.unwrap(), v);
    assert_precondition(
        ledger.runnable_version(&a, Some("1.0.0")).await,
        "version \"1.0.0\" is not the active deployment (active: \"2.0.0\")",
    );
    let missing = uuid::Uuid::new_v4();
    assert_not_found(
        ledger.get_agent_version_by_id(missing).await,
        &format!("agent version \"{missing}\" not found"),
    );
}

pub(crate) async fn every_change_appends_exactly_one_audit_event(db: &TestDb) {
    let ledger = db.migrated().await;
    let a = agent();
    publish(ledger, &a, "1.0.0").await;
    publish(ledger, &a, "2.0.0").await;
    ledger
        .deploy(&a, "1.0.0", &phrony_ledger::Attribution::unverified("u1"))
        .await
        .unwrap();
    ledger
        .deploy(&a, "2.0.0", &phrony_ledger::Attribution::unverified("u2"))
        .await
        .unwrap();
    ledger
        .rollback(&a, None, &phrony_ledger::Attribution::unverified("u3"))
        .await
        .unwrap();
    // Failed operations leave no trace.
    ledger
        .retire_version(&a, "1.0.0", &phrony_ledger::Attribution::unverified("u4"))
        .await
        .unwrap_err();
    ledger
        .deploy(&a, "5.0.0", &phrony_ledger::Attribution::unverified("u4"))
        .await
        .unwrap_err();
    ledger
        .retire_version(&a, "2.0.0", &phrony_ledger::Attribution::unverified("u5"))
        .await
        .unwrap();
    publish(ledger, &a, "3.0.0").await;
    ledger
        .deprecate_version(&a, "3.0.0", &phrony_ledger::Attribution::unverified("u6"))
        .await
        .unwrap();
    ledger
        .archive_agent(&a, &phrony_ledger::Attribution::unverified("u7"))
        .await
        .unwrap();

    let got = event_types(ledger, &a.stream()).await;
    let expected: Vec<(String, String)> = [
        ("agent.version_published", "alice"),
        ("agent.version_published", "alice"),
        ("agent.deployed", "u1"),
        ("agent.deployed", "u2"),
        ("agent.rolled_back", "u3"),
        ("agent.version_retired", "u5"),
        ("agent.version_published", "alice"),
        ("agent.version_deprecated", "u6"),
        ("agent.archived", "u7"),
    ]
    .iter()
    .map(|(t, a)| ((*t).to_owned(), (*a).to_owned()))
    .collect();
    assert_eq!(got, expected);
    let report = ledger.verify_stream(&a.stream()).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!((report.events_checked, report.head_seq), (9, 9));
}

// ---------------------------------------------------------------------------------------------
// event log

pub(crate) async fn session_events_form_a_hash_chain(db: &TestDb) {
    let ledger = db.migrated().await;
    let s = "run_0b7c6c5e-8f0e-4c1a-9d43-2f1b8f2e9a11";
    let mut first = NewEvent::new("audit.opened", "system", json!({"input": {"amount": 100}}));
    first.turn = Some(0);
    let e1 = ledger.append_session_event(s, first).await.unwrap();
    assert_eq!((e1.seq, e1.prev_hash.as_str()), (1, GENESIS_HASH));
    assert_eq!(e1.hash.len(), 64);
    let mut call = NewEvent::new(
        "audit.tool_seen",
        "agent",
        json!({"tool": "payments.refund", "args": {"b": 1, "a": 2}}),
    );
    call.call_id = Some("call-1".into());
    call.turn = Some(1);
    let e2 = ledger.append_session_event(s, call).await.unwrap();
    assert_eq!((e2.seq, e2.prev_hash.as_str()), (2, e1.hash.as_str()));

    let listed = ledger.list_events(s, 0, 10).await.unwrap();
    assert_eq!(listed, vec![e1.clone(), e2.clone()], "round-trips exactly");
    for e in &listed {
        assert_eq!(e.recompute_hash(), e.hash);
    }
    assert_eq!(
        ledger.list_events(s, 1, 10).await.unwrap(),
        vec![e2.clone()]
    );
    let report = ledger.verify_stream(s).await.unwrap();
    assert!(report.is_intact());
    assert_eq!(report.head_hash.as_deref(), Some(e2.hash.as_str()));
    assert_eq!(report.events_checked, 2);

    assert_invalid(
        ledger
            .append_session_event("", NewEvent::new("a.b", "x", json!({})))
            .await,
        "session_id is required",
    );
    assert_invalid(
        ledger
            .append_session_event("agent:support/x", NewEvent::new("a.b", "x", json!({})))
            .await,
        "must not contain ':'",
    );
    assert_invalid(
        ledger
            .append_session_event(s, NewEvent::new("Bad Type", "x", json!({})))
            .await,
        "event type",
    );
    // Ledger-owned types change projections and can only be written by the ledger itself.
    for owned in phrony_ledger::event_types::LEDGER_OWNED {
        assert_invalid(
            ledger
                .append_session_event(s, NewEvent::new(*owned, "x", json!({})))
                .await,
            "cannot be appended directly",
        );
    }
    assert_invalid(
        ledger
            .append_session_event(s, NewEvent::new("a.b", " ", json!({})))
            .await,
        "actor",
    );
    assert_not_found(
        ledger.list_events("run_missing", 0, 10).await,
        "event stream run_missing not found",
    );
    assert_not_found(
        ledger.verify_stream("run_missing").await,
        "event stream run_missing not found",
    );
    assert_eq!(
        ledger.verify_stream(s).await.unwrap().events_checked,
        2,
        "rejected appends left no trace"
    );
}

pub(crate) async fn event_log_refuses_update_and_delete(db: &TestDb) {
    let ledger = db.migrated().await;
    append_n(ledger, "run_guarded", 2).await;
    let update = db
        .raw_exec_err("UPDATE events SET actor = 'mallory' WHERE seq = 1")
        .await;
    assert!(update.contains("append-only"), "{update}");
    let delete = db.raw_exec_err("DELETE FROM events WHERE seq = 2").await;
    assert!(delete.contains("append-only"), "{delete}");
    assert!(
        ledger
            .verify_stream("run_guarded")
            .await
            .unwrap()
            .is_intact()
    );
}

pub(crate) async fn verify_detects_edits(db: &TestDb) {
    let ledger = db.migrated().await;
    append_n(ledger, "run_edit", 5).await;
    append_n(ledger, "run_other", 2).await;
    db.disable_append_only_guard().await;

    db.raw_exec(r#"UPDATE events SET payload = '{"content":"refund 14000","role":"user"}' WHERE stream = 'run_edit' AND seq = 3"#).await;
    let v = ledger
        .verify_stream("run_edit")
        .await
        .unwrap()
        .violation
        .expect("edit detected");
    assert_eq!(
        (v.seq, v.kind.clone()),
        (3, ViolationKind::HashMismatch),
        "{v:?}"
    );
    assert!(v.message.contains("run_edit seq 3"), "{}", v.message);

    // Other streams are unaffected; verify_all names the broken one.
    let all = ledger.verify_all_streams().await.unwrap();
    let broken: Vec<_> = all
        .iter()
        .filter(|r| !r.is_intact())
        .map(|r| r.stream.as_str())
        .collect();
    assert_eq!(broken, vec!["run_edit"]);
    assert!(matches!(
        ledger
            .verify_stream("run_edit")
            .await
            .unwrap()
            .into_result(),
        Err(LedgerError::Corrupt { .. })
    ));

    // Editing a non-payload column is caught too.
    db.raw_exec("UPDATE events SET actor = 'mallory' WHERE stream = 'run_other' AND seq = 1")
        .await;
    let v = ledger
        .verify_stream("run_other")
        .await
        .unwrap()
        .violation
        .unwrap();
    assert_eq!((v.seq, v.kind), (1, ViolationKind::HashMismatch));
}

pub(crate) async fn verify_detects_a_rehashed_edit(db: &TestDb) {
    let ledger = db.migrated().await;
    append_n(ledger, "run_rehash", 4).await;
    db.disable_append_only_guard().await;
    // An attacker who knows the hash format rewrites event 2 and recomputes its hash: the link
    // from event 3 breaks.
    let mut e2 = ledger
        .list_events("run_rehash", 1, 1)
        .await
        .unwrap()
        .remove(0);
    e2.payload = json!({"content": "forged", "role": "user"});
    let forged_hash = e2.recompute_hash();
    db.raw_exec(&format!(
        "UPDATE events SET payload = '{}', hash = '{forged_hash}' WHERE stream = 'run_rehash' AND seq = 2",
        phrony_ledger::canonical_json(&e2.payload)
    ))
    .await;
    let v = ledger
        .verify_stream("run_rehash")
        .await
        .unwrap()
        .violation
        .unwrap();
    assert_eq!((v.seq, v.kind), (3, ViolationKind::BrokenLink));
}

pub(crate) async fn verify_detects_deletions(db: &TestDb) {
    let ledger = db.migrated().await;
    append_n(ledger, "run_del_mid", 5).await;
    append_n(ledger, "run_del_tail", 5).await;
    append_n(ledger, "run_del_first", 3).await;
    db.disable_append_only_guard().await;

    db.raw_exec("DELETE FROM events WHERE stream = 'run_del_mid' AND seq = 2")
        .await;
    let report = ledger.verify_stream("run_del_mid").await.unwrap();
    let v = report.violation.unwrap();
    assert_eq!((v.seq, v.kind), (2, ViolationKind::SeqGap { expected: 2 }));
    assert_eq!(report.events_checked, 1);

    db.raw_exec("DELETE FROM events WHERE stream = 'run_del_tail' AND seq = 5")
        .await;
    let v = ledger
        .verify_stream("run_del_tail")
        .await
        .unwrap()
        .violation
        .unwrap();
    assert_eq!(
        (v.seq, v.kind),
        (5, ViolationKind::HeadMismatch { head_seq: 5 })
    );

    db.raw_exec("DELETE FROM events WHERE stream = 'run_del_first' AND seq = 1")
        .await;
    let v = ledger
        .verify_stream("run_del_first")
        .await
        .unwrap()
        .violation
        .unwrap();
    assert_eq!((v.seq, v.kind), (1, ViolationKind::SeqGap { expected: 1 }));

    // Deleting and renumbering to hide the gap still breaks the chain.
    db.raw_exec("UPDATE events SET seq = seq - 1 WHERE stream = 'run_del_mid' AND seq = 3")
        .await;
    let v = ledger
        .verify_stream("run_del_mid")
        .await
        .unwrap()
        .violation
        .unwrap();
    assert_eq!((v.seq, v.kind), (2, ViolationKind::BrokenLink));
}

pub(crate) async fn verify_detects_reordering(db: &TestDb) {
    let ledger = db.migrated().await;
    append_n(ledger, "run_swap", 5).await;
    db.disable_append_only_guard().await;
    // Swap events 2 and 3 (via a parking seq, because (stream, seq) is unique).
    db.raw_exec("UPDATE events SET seq = 1000 WHERE stream = 'run_swap' AND seq = 2")
        .await;
    db.raw_exec("UPDATE events SET seq = 2 WHERE stream = 'run_swap' AND seq = 3")
        .await;
    db.raw_exec("UPDATE events SET seq = 3 WHERE stream = 'run_swap' AND seq = 1000")
        .await;
    let v = ledger
        .verify_stream("run_swap")
        .await
        .unwrap()
        .violation
        .unwrap();
    assert_eq!((v.seq, v.kind), (2, ViolationKind::BrokenLink));

    // Swapping only the timestamps (same rows, same seqs) is an edit of both.
    append_n(ledger, "run_ts", 3).await;
    let ts = db
        .raw_strings("SELECT CAST(ts AS TEXT) FROM events WHERE stream = 'run_ts' ORDER BY seq")
        .await;
    let (t1, t3) = (ts[0][0].clone().unwrap(), ts[2][0].clone().unwrap());
    db.raw_exec(&format!(
        "UPDATE events SET ts = '{t3}' WHERE stream = 'run_ts' AND seq = 1"
    ))
    .await;
    db.raw_exec(&format!(
        "UPDATE events SET ts = '{t1}' WHERE stream = 'run_ts' AND seq = 3"
    ))
    .await;
    let v = ledger
        .verify_stream("run_ts")
        .await
        .unwrap()
        .violation
        .unwrap();
    assert_eq!((v.seq, v.kind), (1, ViolationKind::HashMismatch));
}

// ---------------------------------------------------------------------------------------------
// concurrency

pub(crate) async fn concurrent_appends_are_gap_free_across_pools(db: &TestDb) {
    const TASKS_PER_POOL: usize = 4;
    const EVENTS_PER_TASK: usize = 15;
    let first = db.migrated().await.clone();
    let second = db.another_ledger().await;
    let stream = "run_concurrent";
    let mut handles = Vec::new();
    for (pool_id, ledger) in [first.clone(), second.clone()].into_iter().enumerate() {
        for task in 0..TASKS_PER_POOL {
            let ledger = ledger.clone();
            handles.push(tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..EVENTS_PER_TASK {
                    let e = NewEvent::new(
                        "message.assistant",
                        format!("worker-{pool_id}-{task}"),
                        json!({"pool": pool_id, "task": task, "i": i}),
                    );
                    seqs.push(ledger.append_session_event(stream, e).await.unwrap().seq);
                }
                seqs
            }));
        }
    }
    let mut all_seqs = Vec::new();
    for h in handles {
        let seqs = h.await.unwrap();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "a writer's own appends stay ordered"
        );
        all_seqs.extend(seqs);
    }
    let total = 2 * TASKS_PER_POOL * EVENTS_PER_TASK;
    all_seqs.sort_unstable();
    assert_eq!(
        all_seqs,
        (1..=total as u64).collect::<Vec<_>>(),
        "unique and gap-free"
    );

    let events = second.list_events(stream, 0, 1000).await.unwrap();
    assert_eq!(events.len(), total);
    let distinct: BTreeSet<String> = events.iter().map(|e| e.payload.to_string()).collect();
    assert_eq!(distinct.len(), total, "no event lost or duplicated");
    let report = first.verify_stream(stream).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.head_seq, total as u64);
}

pub(crate) async fn concurrent_lifecycle_writes_are_serialised(db: &TestDb) {
    let first = db.migrated().await.clone();
    let second = db.another_ledger().await;
    let a = AgentRef::new("race", "agent");
    // Two replicas publish ten versions of a brand-new agent at once.
    let mut handles = Vec::new();
    for i in 0..10 {
        let ledger = if i % 2 == 0 {
            first.clone()
        } else {
            second.clone()
        };
        let a = a.clone();
        handles.push(tokio::spawn(async move {
            ledger
                .publish_agent_version(new_version(&a, &format!("1.{i}.0"), "c"))
                .await
        }));
    }
    let mut agent_ids = BTreeSet::new();
    for h in handles {
        agent_ids.insert(h.await.unwrap().unwrap().agent_id);
    }
    assert_eq!(agent_ids.len(), 1, "one agent row, whoever created it");
    assert_eq!(first.list_agent_versions(&a).await.unwrap().len(), 10);

    // Then both deploy concurrently: every deployment must see its true predecessor.
    let mut handles = Vec::new();
    for i in 0..10 {
        let ledger = if i % 2 == 0 {
            first.clone()
        } else {
            second.clone()
        };
        let a = a.clone();
        handles.push(tokio::spawn(async move {
            ledger
                .deploy(
                    &a,
                    &format!("1.{i}.0"),
                    &phrony_ledger::Attribution::unverified(format!("ops{i}")),
                )
                .await
                .unwrap()
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let history = second.list_deployments(&a).await.unwrap();
    assert_eq!(history.len(), 10);
    for pair in history.windows(2) {
        assert_eq!(
            pair[0].previous_version.as_deref(),
            Some(pair[1].version.as_str())
        );
    }
    assert_eq!(history[9].previous_version, None);
    assert!(first.verify_stream(&a.stream()).await.unwrap().is_intact());
    assert_eq!(first.verify_stream(&a.stream()).await.unwrap().head_seq, 20);
}

// ---------------------------------------------------------------------------------------------
// projections and durability

const PROJECTIONS: [&str; 3] = ["agents", "agent_versions", "deployments"];

async fn lifecycle_history(ledger: &Ledger) {
    let a = agent();
    let b = AgentRef::new("ops", "triage");
    for v in ["1.0.0", "1.1.0", "2.0.0"] {
        publish(ledger, &a, v).await;
    }
    publish(ledger, &b, "0.1.0").await;
    let mut relabel = new_version(&b, "0.2.0", "z");
    relabel.labels.insert("team".into(), "sre".into());
    relabel.owner = "sre".into();
    ledger.publish_agent_version(relabel).await.unwrap();
    ledger
        .deploy(&a, "1.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    ledger
        .deploy(&a, "2.0.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    ledger
        .rollback(&a, None, &phrony_ledger::Attribution::unverified("oncall"))
        .await
        .unwrap();
    ledger
        .rollback(
            &a,
            Some("2.0.0"),
            &phrony_ledger::Attribution::unverified("oncall"),
        )
        .await
        .unwrap();
    ledger
        .retire_version(&a, "1.0.0", &phrony_ledger::Attribution::unverified("sec"))
        .await
        .unwrap();
    ledger
        .deprecate_version(&a, "1.1.0", &phrony_ledger::Attribution::unverified("sec"))
        .await
        .unwrap();
    ledger
        .deploy(&b, "0.2.0", &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
    ledger
        .archive_agent(&b, &phrony_ledger::Attribution::unverified("ops"))
        .await
        .unwrap();
}

pub(crate) async fn rebuild_reproduces_projections_exactly(db: &TestDb) {
    let ledger = db.migrated().await;
    lifecycle_history(ledger).await;
    let mut before = Vec::new();
    for t in PROJECTIONS {
        let rows = db.table_snapshot(t).await;
        assert!(!rows.is_empty(), "{t} should have rows");
        before.push(rows);
    }

    // A session row referencing a published version must not block the rebuild (the foreign
    // key is checked at commit, when the version exists again).
    let version_id = ledger
        .get_agent_version(&agent(), "2.0.0")
        .await
        .unwrap()
        .id;
    db.raw_exec(&format!(
        "INSERT INTO sessions (id, agent_version_id, root_session_id, status, created_at, updated_at) \
         VALUES ('run_fk', '{version_id}', 'run_fk', 'running', '2025-01-01T00:00:00.000000Z', \
         '2025-01-01T00:00:00.000000Z')"
    ))
    .await;

    // Rebuilding over live projections is a no-op.
    let report = ledger.rebuild_projections().await.unwrap();
    assert_eq!(report.streams, 2);
    assert_eq!(report.events, 13);
    for (t, rows) in PROJECTIONS.iter().zip(&before) {
        assert_eq!(
            &db.table_snapshot(t).await,
            rows,
            "{t} after rebuild over live data"
        );
    }

    // Wipe them by hand, then rebuild from the log alone.
    db.raw_exec("DELETE FROM sessions").await;
    db.raw_exec("DELETE FROM deployments").await;
    db.raw_exec("DELETE FROM agent_versions").await;
    db.raw_exec("DELETE FROM agents").await;
    for t in PROJECTIONS {
        assert!(db.table_snapshot(t).await.is_empty());
    }
    ledger.rebuild_projections().await.unwrap();
    for (t, rows) in PROJECTIONS.iter().zip(&before) {
        assert_eq!(&db.table_snapshot(t).await, rows, "{t} rebuilt from events");
    }
    // And the API agrees.
    assert_eq!(
        ledger.active_version(&agent()).await.unwrap().version,
        "2.0.0"
    );
}

pub(crate) async fn rebuild_refuses_a_tampered_log_and_changes_nothing(db: &TestDb) {
    let ledger = db.migrated().await;
    lifecycle_history(ledger).await;
    let before: Vec<_> = {
        let mut v = Vec::new();
        for t in PROJECTIONS {
            v.push(db.table_snapshot(t).await);
        }
        v
    };
    db.disable_append_only_guard().await;
    db.raw_exec("UPDATE events SET actor = 'mallory' WHERE stream = 'agent:support/refund-agent' AND seq = 4").await;
    match ledger.rebuild_projections().await {
        Err(LedgerError::Corrupt { message }) => {
            assert!(
                message.contains("agent:support/refund-agent seq 4"),
                "{message}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    for (t, rows) in PROJECTIONS.iter().zip(&before) {
        assert_eq!(
            &db.table_snapshot(t).await,
            rows,
            "{t} untouched by a failed rebuild"
        );
    }
}

pub(crate) async fn committed_data_survives_reopening(db: &TestDb) {
    let ledger = db.migrated().await;
    lifecycle_history(ledger).await;
    append_n(ledger, "run_durable", 3).await;
    let agents = ledger.list_agents(None).await.unwrap();
    let history = ledger.list_deployments(&agent()).await.unwrap();
    ledger.close().await;

    let reopened = Ledger::connect(&db.url).await.unwrap();
    reopened.migrate().await.unwrap();
    assert_eq!(reopened.list_agents(None).await.unwrap(), agents);
    assert_eq!(reopened.list_deployments(&agent()).await.unwrap(), history);
    for r in reopened.verify_all_streams().await.unwrap() {
        assert!(r.is_intact(), "{r:?}");
    }
    assert_eq!(
        reopened
            .list_events("run_durable", 0, 10)
            .await
            .unwrap()
            .len(),
        3
    );
    if db.kind == Backend::Sqlite {
        let mode = db.raw_strings("PRAGMA journal_mode").await;
        assert_eq!(mode[0][0].as_deref(), Some("wal"));
    }
}

// ---------------------------------------------------------------------------------------------
// group commit

/// Many concurrent writers: every write lands and is acknowledged, on SQLite fewer `COMMIT`s
/// than writes (the group-commit writer batches them), and one write refused inside the batch
/// after it wrote something fails alone: its own changes are undone, the others' stay.
pub(crate) async fn concurrent_writes_share_commits_and_a_refusal_fails_only_its_caller(
    db: &TestDb,
) {
    const WRITERS: usize = 48;
    let ledger = db.migrated().await.clone();
    // A token row that exists without its `tokens` stream: creating a token of the same name
    // first creates the stream (a write), then is refused (the name is taken).
    db.raw_exec(
        "INSERT INTO api_tokens (name, secret_hash, roles, routes, tools, created_at, \
         created_by, expires_at) VALUES ('taken', \
         '0000000000000000000000000000000000000000000000000000000000000000', \
         '[\"viewer\"]', '[]', '[]', '2026-01-01T00:00:00Z', 'ops', NULL)",
    )
    .await;
    // Another connection pool: it sees only what was committed.
    let other = db.another_ledger().await;
    let before = ledger.group_commit_stats();
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(WRITERS + 1));
    let mut appends = Vec::new();
    for i in 0..WRITERS {
        let ledger = ledger.clone();
        let other = other.clone();
        let start = start.clone();
        appends.push(tokio::spawn(async move {
            start.wait().await;
            let stream = format!("run_batch_{i}");
            let event = NewEvent::new("message.assistant", "writer", json!({ "i": i }));
            let appended = ledger.append_session_event(&stream, event).await?;
            // Acknowledged only once committed: visible to the other pool the moment it returns.
            let seen = other.list_events(&stream, 0, 10).await?;
            assert_eq!(seen.len(), 1, "{stream} acknowledged before it committed");
            Ok::<_, LedgerError>(appended)
        }));
    }
    let refused = {
        let ledger = ledger.clone();
        let start = start.clone();
        tokio::spawn(async move {
            start.wait().await;
            // Queued behind some of the appends, so that it runs inside a batch.
            tokio::task::yield_now().await;
            ledger
                .create_api_token(phrony_ledger::NewApiToken {
                    name: "taken".to_owned(),
                    secret_hash: "1".repeat(64),
                    roles: vec![phrony_auth::Role::Viewer],
                    routes: Vec::new(),
                    tools: Vec::new(),
                    expires_at: None,
                    created_by: "ops".to_owned(),
                })
                .await
        })
    };
    for (i, handle) in appends.into_iter().enumerate() {
        let event = handle.await.unwrap().unwrap_or_else(|e| {
            panic!("append {i} failed next to a refused write: {e}");
        });
        assert_eq!(event.seq, 1, "append {i}");
    }
    match refused.await.unwrap() {
        Err(LedgerError::AlreadyExists { message }) => {
            assert!(message.contains("\"taken\" already exists"), "{message}");
        }
        other => panic!("expected the refused write's own error, got {other:?}"),
    }

    // Every acknowledged write is there.
    for i in 0..WRITERS {
        let stream = format!("run_batch_{i}");
        let events = other.list_events(&stream, 0, 10).await.unwrap();
        assert_eq!(events.len(), 1, "{stream}");
        assert_eq!(events[0].payload, json!({ "i": i }));
        assert!(other.verify_stream(&stream).await.unwrap().is_intact());
    }
    // The refused write's own change (the stream it created) was undone.
    let tokens_stream = db
        .raw_strings(&format!(
            "SELECT stream FROM streams WHERE stream = '{}'",
            phrony_ledger::TOKENS_STREAM
        ))
        .await;
    assert!(
        tokens_stream.is_empty(),
        "the refused write left its stream behind: {tokens_stream:?}"
    );

    match (db.kind, before, ledger.group_commit_stats()) {
        (Backend::Sqlite, Some(before), Some(after)) => {
            let writes = after.writes - before.writes;
            let commits = after.commits - before.commits;
            assert_eq!(
                writes, WRITERS as u64,
                "the refused write is not counted as committed"
            );
            assert!(
                commits < writes,
                "{commits} COMMITs for {writes} concurrent writes: no batching"
            );
        }
        (Backend::Postgres, None, None) => {}
        (kind, before, after) => panic!("group commit stats on {kind:?}: {before:?} {after:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// batch appends

fn batch(n: usize, from: usize) -> Vec<NewEvent> {
    (from..from + n)
        .map(|i| NewEvent::new("gate.decision", "agent", json!({"i": i})))
        .collect()
}

/// Makes the database itself refuse one event type mid-`INSERT`, so a batch fails after some
/// of its rows went in.
async fn poison_event_type(db: &TestDb, event_type: &str) {
    match db.kind {
        Backend::Sqlite => {
            db.raw_exec(&format!(
                "CREATE TRIGGER events_poison BEFORE INSERT ON events WHEN NEW.type = \
                 '{event_type}' BEGIN SELECT RAISE(ABORT, 'poisoned event'); END"
            ))
            .await;
        }
        Backend::Postgres => {
            db.raw_exec(&format!(
                "CREATE FUNCTION events_poison() RETURNS trigger AS $$ BEGIN \
                 IF NEW.type = '{event_type}' THEN RAISE EXCEPTION 'poisoned event'; END IF; \
                 RETURN NEW; END $$ LANGUAGE plpgsql"
            ))
            .await;
            db.raw_exec(
                "CREATE TRIGGER events_poison BEFORE INSERT ON events FOR EACH ROW \
                 EXECUTE FUNCTION events_poison()",
            )
            .await;
        }
    }
}

pub(crate) async fn a_batch_append_is_ordered_chained_and_all_or_nothing(db: &TestDb) {
    let ledger = db.migrated().await;
    let s = "gate-batch";
    assert_eq!(
        ledger.append_session_events(s, Vec::new()).await.unwrap(),
        vec![],
        "an empty batch writes nothing"
    );
    let first = ledger
        .append_session_event(s, NewEvent::new("gate.decision", "agent", json!({"i": 0})))
        .await
        .unwrap();
    // More rows than one multi-row INSERT takes.
    let written = ledger
        .append_session_events(s, batch(300, 1))
        .await
        .unwrap();
    assert_eq!(written.len(), 300);
    let mut prev = first.hash.clone();
    for (i, e) in written.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 2, "in order, gap-free");
        assert_eq!(e.payload, json!({"i": i + 1}));
        assert_eq!(e.prev_hash, prev, "seq {} chains to the one before", e.seq);
        assert_eq!(e.recompute_hash(), e.hash);
        prev = e.hash.clone();
    }
    let listed = ledger.list_events(s, 1, 1000).await.unwrap();
    assert_eq!(listed, written, "round-trips exactly");
    let report = ledger.verify_stream(s).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!((report.head_seq, report.events_checked), (301, 301));

    // A malformed event anywhere in the batch: nothing of it is written.
    let mut bad = batch(3, 301);
    bad.push(NewEvent::new("Bad Type", "agent", json!({})));
    assert_invalid(ledger.append_session_events(s, bad).await, "event type");
    let mut owned = batch(2, 301);
    owned.insert(
        1,
        NewEvent::new(phrony_ledger::event_types::LEDGER_OWNED[0], "x", json!({})),
    );
    assert_invalid(
        ledger.append_session_events(s, owned).await,
        "cannot be appended directly",
    );
    assert_invalid(
        ledger
            .append_session_events("agent:support/x", batch(1, 0))
            .await,
        "must not contain ':'",
    );
    assert_eq!(ledger.verify_stream(s).await.unwrap().head_seq, 301);

    // The database refuses a row of the second INSERT: the first INSERT's rows go too.
    poison_event_type(db, "gate.poison").await;
    let mut poisoned = batch(300, 301);
    poisoned[280] = NewEvent::new("gate.poison", "agent", json!({}));
    assert!(ledger.append_session_events(s, poisoned).await.is_err());
    assert_eq!(ledger.list_events(s, 301, 1000).await.unwrap(), vec![]);
    let report = ledger.verify_stream(s).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.head_seq, 301);

    // The next batch continues the chain where the last durable one ended.
    let next = ledger
        .append_session_events(s, batch(2, 301))
        .await
        .unwrap();
    assert_eq!(
        (next[0].seq, next[0].prev_hash.as_str(), next[1].seq),
        (302, prev.as_str(), 303)
    );
    let report = ledger.verify_stream(s).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.events_checked, 303);
}
