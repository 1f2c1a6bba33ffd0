//! Conformance cases for bundles: publish (vendored and external members), deploy, rollback, the
//! reads, bundle sessions and the rebuild of bundle streams.

use std::collections::BTreeMap;

use phrony_ledger::{
    AgentVersion, AgentVersionRef, Attribution, AuditKey, AuditScope, BundleMemberOrigin,
    BundleRef, DeploymentAction, EventBody, Ledger, LedgerError, NewAgentVersion, NewBundleMember,
    NewBundleVersion, NewSession, PageRequest, SecretEndpoint, SecretEndpointChange,
    SecretEndpointRecord, SessionFilter, SessionKind, SessionMode, VersionOrigin, new_session_id,
};
use serde_json::json;
use uuid::Uuid;

use crate::harness::TestDb;
use crate::session_cases::{deploy_agent, refund_agent};

fn bundle() -> BundleRef {
    BundleRef::new("support", "refund-desk")
}

fn alice() -> Attribution {
    Attribution::unverified("alice")
}

fn lock_hash(tag: &str) -> String {
    format!("sha256:{tag:0>64}")
}

fn member(child: &str, version: &str, is_root: bool) -> NewBundleMember {
    let snapshot = format!(
        r#"{{"kind":"Agent","metadata":{{"namespace":"support","name":"{child}","version":"{version}"}}}}"#
    );
    NewBundleMember {
        child_name: child.to_owned(),
        origin: BundleMemberOrigin::Vendored,
        reference: format!("./{child}/agent.yaml"),
        is_root,
        lock_content_hash: format!("sha256:lock-{child}-{version}"),
        version_id: Uuid::new_v4(),
        agent: AgentVersionRef::new("support", child, version),
        snapshot_json: snapshot,
        content_hash: format!("sha256:{child}-{version}"),
    }
}

/// A bundle version with a root (`triage`) and one specialist (`refunds`).
fn new_bundle(version: &str, lock: &str) -> NewBundleVersion {
    NewBundleVersion {
        bundle: bundle(),
        version: version.to_owned(),
        labels: BTreeMap::from([("tier".to_owned(), "gold".to_owned())]),
        lock_hash: lock_hash(lock),
        lock_json: format!(r#"{{"lock":"{lock}"}}"#),
        manifest_json: format!(r#"{{"kind":"Bundle","metadata":{{"version":"{version}"}}}}"#),
        members: vec![
            member("triage", version, true),
            member("refunds", version, false),
        ],
        actor: alice(),
    }
}

#[track_caller]
fn message(result: Result<impl std::fmt::Debug, LedgerError>) -> (&'static str, String) {
    match result {
        Err(LedgerError::NotFound { message }) => ("NotFound", message),
        Err(LedgerError::FailedPrecondition { message }) => ("FailedPrecondition", message),
        Err(LedgerError::AlreadyExists { message }) => ("AlreadyExists", message),
        Err(LedgerError::InvalidArgument { message }) => ("InvalidArgument", message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn stream_types(ledger: &Ledger, stream: &str) -> Vec<String> {
    ledger
        .list_events(stream, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect()
}

fn session_on(version_id: Uuid, agent: AgentVersionRef) -> NewSession {
    NewSession {
        id: new_session_id(),
        agent_version_id: version_id,
        agent,
        input: json!({}),
        metadata: BTreeMap::new(),
        mode: SessionMode::Task,
        parent_session_id: None,
        limits: None,
        bundle_version_id: None,
        secrets: Vec::new(),
        actor: alice(),
    }
}

// ---------------------------------------------------------------------------------------------
// cases

pub(crate) async fn a_bundle_publish_vendors_its_members_and_is_immutable(db: &TestDb) {
    let ledger = db.migrated().await;
    let new = new_bundle("1.0.0", "a");
    let published = ledger.publish_bundle(&new).await.unwrap();
    assert!(published.created);
    assert_eq!(published.bundle, bundle());
    assert_eq!(
        (published.version.as_str(), published.lock_hash.as_str()),
        ("1.0.0", lock_hash("a").as_str())
    );
    assert_eq!(published.lock_json, new.lock_json);

    // Every member is a vendored version, readable by id with its own ns/name/version.
    for m in &new.members {
        let v = ledger.get_agent_version_by_id(m.version_id).await.unwrap();
        assert_eq!(v.origin, VersionOrigin::Vendored);
        assert_eq!(v.agent_id, None);
        assert_eq!(
            (v.agent.namespace.as_str(), v.agent.name.as_str()),
            ("support", m.child_name.as_str())
        );
        assert_eq!(v.version, "1.0.0");
        assert_eq!(v.snapshot_json, m.snapshot_json);
        assert_eq!(v.content_hash, m.content_hash);
        assert_eq!(v.bundle_version_id, Some(published.version_id));
        assert_eq!(v.published_by, "alice");
    }
    // No agent is created for a vendored member.
    assert!(ledger.list_agents(None).await.unwrap().is_empty());
    let bundles = ledger.list_bundles(None).await.unwrap();
    assert_eq!(bundles.len(), 1);
    assert_eq!(bundles[0].id, published.bundle_id);
    assert_eq!(bundles[0].labels["tier"], "gold");
    assert!(ledger.list_bundles(Some("other")).await.unwrap().is_empty());
    assert_eq!(
        stream_types(ledger, "bundle:support/refund-desk").await,
        ["bundle.version_published"]
    );

    // The same semver and lock: the existing ids, nothing written.
    let again = ledger
        .publish_bundle(&new_bundle("1.0.0", "a"))
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(
        (again.bundle_id, again.version_id),
        (published.bundle_id, published.version_id)
    );
    assert_eq!(
        stream_types(ledger, "bundle:support/refund-desk")
            .await
            .len(),
        1
    );

    // The same lock under another semver, and the same semver with another lock.
    assert_eq!(
        message(ledger.publish_bundle(&new_bundle("1.1.0", "a")).await),
        (
            "AlreadyExists",
            format!(
                "bundle lock hash \"{}\" is already published as version \"1.0.0\" and cannot \
                 be changed",
                lock_hash("a")
            )
        )
    );
    assert_eq!(
        message(ledger.publish_bundle(&new_bundle("1.0.0", "b")).await),
        (
            "AlreadyExists",
            format!(
                "bundle support/refund-desk version \"1.0.0\" is already published and cannot \
                 be changed; increment metadata.version to publish a new closure (published \
                 lock hash {}, lock hash {})",
                lock_hash("a"),
                lock_hash("b")
            )
        )
    );

    // Malformed requests.
    let mut none = new_bundle("2.0.0", "c");
    none.members.clear();
    assert_eq!(
        message(ledger.publish_bundle(&none).await),
        ("InvalidArgument", "members is required".to_owned())
    );
    let mut two_roots = new_bundle("2.0.0", "c");
    two_roots.members[1].is_root = true;
    assert_eq!(
        message(ledger.publish_bundle(&two_roots).await),
        (
            "InvalidArgument",
            "members must include exactly one is_root member (got 2)".to_owned()
        )
    );
    let mut reused = new_bundle("2.0.0", "c");
    reused.members[0].version_id = new.members[0].version_id;
    assert_eq!(
        message(ledger.publish_bundle(&reused).await).0,
        "AlreadyExists"
    );

    // A second version: newest first.
    let second = ledger
        .publish_bundle(&new_bundle("2.0.0", "c"))
        .await
        .unwrap();
    let versions = ledger.list_bundle_versions(&bundle()).await.unwrap();
    assert_eq!(
        versions
            .iter()
            .map(|v| v.version.as_str())
            .collect::<Vec<_>>(),
        ["2.0.0", "1.0.0"]
    );
    assert_eq!(versions[0].id, second.version_id);
    assert_eq!(
        versions[1].root_member_version_id,
        new.members[0].version_id
    );
    assert_eq!(versions[1].manifest_json, new.manifest_json);
    assert_eq!(versions[1].published_by, "alice");
}

pub(crate) async fn bundle_deploy_rollback_and_history_follow_the_rules(db: &TestDb) {
    let ledger = db.migrated().await;
    assert_eq!(
        message(ledger.deploy_bundle(&bundle(), "1.0.0", &alice()).await),
        (
            "NotFound",
            "bundle support/refund-desk not found".to_owned()
        )
    );
    let one = ledger
        .publish_bundle(&new_bundle("1.0.0", "a"))
        .await
        .unwrap();
    let two = ledger
        .publish_bundle(&new_bundle("2.0.0", "b"))
        .await
        .unwrap();
    let no_active = (
        "FailedPrecondition",
        "no active deployment for bundle support/refund-desk".to_owned(),
    );
    assert_eq!(message(ledger.active_bundle(&bundle()).await), no_active);
    assert_eq!(
        message(ledger.rollback_bundle(&bundle(), None, &alice()).await),
        no_active
    );
    assert_eq!(
        message(ledger.runnable_bundle(&bundle(), None).await),
        no_active
    );
    assert_eq!(
        message(ledger.get_bundle_version(&bundle(), None).await),
        no_active
    );
    assert_eq!(
        message(ledger.deploy_bundle(&bundle(), "3.0.0", &alice()).await),
        (
            "NotFound",
            "no published version \"3.0.0\" for bundle support/refund-desk".to_owned()
        )
    );

    // Deploy by semver, then by lock hash.
    let first = ledger
        .deploy_bundle(&bundle(), "1.0.0", &alice())
        .await
        .unwrap();
    assert_eq!(first.version_id, one.version_id);
    assert_eq!(
        (first.previous_version, first.previous_lock_hash),
        (None, None)
    );
    let second = ledger
        .deploy_bundle(&bundle(), &lock_hash("b"), &Attribution::unverified("bob"))
        .await
        .unwrap();
    assert_eq!(second.version, "2.0.0");
    assert_eq!(second.version_id, two.version_id);
    assert_eq!(second.previous_version.as_deref(), Some("1.0.0"));
    assert_eq!(second.previous_lock_hash, Some(lock_hash("a")));
    assert_eq!(ledger.active_bundle(&bundle()).await.unwrap(), second);

    // Rollback without `to`: the newest earlier deployment of another version.
    let back = ledger
        .rollback_bundle(&bundle(), None, &alice())
        .await
        .unwrap();
    assert_eq!(back.action, DeploymentAction::Rollback);
    assert_eq!(back.version, "1.0.0");
    assert_eq!(back.lock_hash, lock_hash("a"));
    assert_eq!(back.previous_version.as_deref(), Some("2.0.0"));
    assert_eq!(
        message(
            ledger
                .rollback_bundle(&bundle(), Some("9.9.9"), &alice())
                .await
        ),
        (
            "NotFound",
            "no published version \"9.9.9\" for bundle support/refund-desk".to_owned()
        )
    );
    let history = ledger.list_bundle_deployments(&bundle()).await.unwrap();
    assert_eq!(
        history
            .iter()
            .map(|d| (d.action, d.version.as_str(), d.actor.as_str()))
            .collect::<Vec<_>>(),
        [
            (DeploymentAction::Rollback, "1.0.0", "alice"),
            (DeploymentAction::Deploy, "2.0.0", "bob"),
            (DeploymentAction::Deploy, "1.0.0", "alice"),
        ]
    );
    assert_eq!(history[0], back);

    // get_bundle_version: by semver, by lock hash, the active one.
    let (v, members, active) = ledger
        .get_bundle_version(&bundle(), Some("2.0.0"))
        .await
        .unwrap();
    assert_eq!((v.id, active), (two.version_id, false));
    assert_eq!(members.len(), 2);
    assert!(members[0].is_root, "root first");
    assert_eq!(members[0].child_name, "triage");
    assert_eq!(members[0].origin, BundleMemberOrigin::Vendored);
    assert_eq!(
        members[0].agent,
        AgentVersionRef::new("support", "triage", "2.0.0")
    );
    assert_eq!(members[0].member_version_id, v.root_member_version_id);
    assert_eq!(members[1].lock_content_hash, "sha256:lock-refunds-2.0.0");
    assert_eq!(members[1].reference, "./refunds/agent.yaml");
    let (by_hash, _, active) = ledger
        .get_bundle_version(&bundle(), Some(&lock_hash("a")))
        .await
        .unwrap();
    assert_eq!((by_hash.id, active), (one.version_id, true));
    let (current, _, active) = ledger.get_bundle_version(&bundle(), None).await.unwrap();
    assert_eq!((current.id, active), (one.version_id, true));
    assert_eq!(
        message(ledger.get_bundle_version(&bundle(), Some("7.0.0")).await).0,
        "NotFound"
    );

    // runnable_bundle: the active version, named by semver or lock hash, or not at all.
    let runnable = ledger.runnable_bundle(&bundle(), None).await.unwrap();
    assert_eq!(runnable.version.id, one.version_id);
    assert_eq!(runnable.root.id, runnable.version.root_member_version_id);
    assert_eq!(runnable.root.origin, VersionOrigin::Vendored);
    assert_eq!(runnable.members.len(), 2);
    for name in ["1.0.0", lock_hash("a").as_str()] {
        let r = ledger.runnable_bundle(&bundle(), Some(name)).await.unwrap();
        assert_eq!(r, runnable);
    }
    assert_eq!(
        message(ledger.runnable_bundle(&bundle(), Some("2.0.0")).await),
        (
            "FailedPrecondition",
            "version \"2.0.0\" is not the active bundle deployment (active: \"1.0.0\")".to_owned()
        )
    );

    // A bundle deployed only ever at one version has nothing to roll back to.
    let solo = BundleRef::new("support", "solo");
    let mut new = new_bundle("1.0.0", "s");
    new.bundle = solo.clone();
    ledger.publish_bundle(&new).await.unwrap();
    ledger
        .deploy_bundle(&solo, "1.0.0", &alice())
        .await
        .unwrap();
    ledger
        .deploy_bundle(&solo, "1.0.0", &alice())
        .await
        .unwrap();
    assert_eq!(
        message(ledger.rollback_bundle(&solo, None, &alice()).await),
        (
            "FailedPrecondition",
            "no previous deployment to roll back to for bundle support/solo".to_owned()
        )
    );
    assert_eq!(
        stream_types(ledger, "bundle:support/refund-desk").await,
        [
            "bundle.version_published",
            "bundle.version_published",
            "bundle.deployed",
            "bundle.deployed",
            "bundle.rolled_back",
        ]
    );
}

pub(crate) async fn a_bundle_session_runs_the_root_member_and_lists_by_kind(db: &TestDb) {
    let ledger = db.migrated().await;
    let published = deploy_agent(ledger, &refund_agent(), "1.0.0").await;
    let new = new_bundle("1.0.0", "a");
    let bundle_version = ledger.publish_bundle(&new).await.unwrap().version_id;
    ledger
        .deploy_bundle(&bundle(), "1.0.0", &alice())
        .await
        .unwrap();
    let runnable = ledger.runnable_bundle(&bundle(), None).await.unwrap();
    let root_ref = AgentVersionRef::new("support", "triage", "1.0.0");
    let specialist = &new.members[1];

    // The root member, started as the bundle's session.
    let mut root = session_on(runnable.root.id, root_ref.clone());
    root.bundle_version_id = Some(bundle_version);
    let root = ledger.create_session(root).await.unwrap();
    assert_eq!(root.bundle_version_id, Some(bundle_version));
    assert_eq!(root.agent, root_ref);

    // A vendored member runs only through its bundle.
    assert_eq!(
        message(
            ledger
                .create_session(session_on(runnable.root.id, root_ref.clone()))
                .await
        ),
        (
            "FailedPrecondition",
            format!(
                "agent version \"{}\" (support/triage@1.0.0) is a bundle member and runs only \
                 through its bundle",
                runnable.root.id
            )
        )
    );
    let mut not_root = session_on(specialist.version_id, specialist.agent.clone());
    not_root.bundle_version_id = Some(bundle_version);
    assert_eq!(
        message(ledger.create_session(not_root).await),
        (
            "FailedPrecondition",
            format!(
                "agent version \"{}\" is not the root member of bundle version \"{bundle_version}\"",
                specialist.version_id
            )
        )
    );
    let mut unknown = session_on(runnable.root.id, root_ref.clone());
    unknown.bundle_version_id = Some(Uuid::new_v4());
    assert_eq!(message(ledger.create_session(unknown).await).0, "NotFound");
    let mut wrong_ref = session_on(runnable.root.id, specialist.agent.clone());
    wrong_ref.bundle_version_id = Some(bundle_version);
    assert_eq!(
        message(ledger.create_session(wrong_ref).await).0,
        "InvalidArgument"
    );
    // A published version is never a bundle's session.
    let mut published_in_bundle = session_on(
        published.id,
        AgentVersionRef::new("support", "refund-agent", "1.0.0"),
    );
    published_in_bundle.bundle_version_id = Some(bundle_version);
    assert_eq!(
        message(ledger.create_session(published_in_bundle).await).0,
        "InvalidArgument"
    );
    // A delegated child of the root may run another member.
    let mut child = session_on(specialist.version_id, specialist.agent.clone());
    child.parent_session_id = Some(root.id.clone());
    let child = ledger.create_session(child).await.unwrap();
    assert_eq!(child.bundle_version_id, None);
    let agent_session = ledger
        .create_session(session_on(
            published.id,
            AgentVersionRef::new("support", "refund-agent", "1.0.0"),
        ))
        .await
        .unwrap();

    let list = |filter: SessionFilter| async move {
        ledger
            .list_sessions(&filter, &PageRequest::default())
            .await
            .map(|page| page.items.into_iter().map(|s| s.id).collect::<Vec<_>>())
    };
    assert_eq!(
        list(SessionFilter {
            kind: Some(SessionKind::Bundle),
            ..SessionFilter::default()
        })
        .await
        .unwrap(),
        vec![root.id.clone()]
    );
    assert_eq!(
        list(SessionFilter {
            kind: Some(SessionKind::Agent),
            ..SessionFilter::default()
        })
        .await
        .unwrap(),
        vec![agent_session.id.clone()]
    );
    assert_eq!(
        list(SessionFilter {
            kind: Some(SessionKind::Agent),
            include_children: true,
            ..SessionFilter::default()
        })
        .await
        .unwrap(),
        [agent_session.id.clone(), child.id.clone()]
    );
    for version in [None, Some("1.0.0".to_owned()), Some(lock_hash("a"))] {
        assert_eq!(
            list(SessionFilter {
                bundle: Some(bundle()),
                bundle_version: version.clone(),
                ..SessionFilter::default()
            })
            .await
            .unwrap(),
            vec![root.id.clone()],
            "{version:?}"
        );
    }
    assert!(
        list(SessionFilter {
            bundle: Some(bundle()),
            bundle_version: Some("9.9.9".to_owned()),
            ..SessionFilter::default()
        })
        .await
        .unwrap()
        .is_empty()
    );
    assert!(
        list(SessionFilter {
            bundle: Some(BundleRef::new("support", "other")),
            ..SessionFilter::default()
        })
        .await
        .unwrap()
        .is_empty()
    );
    assert_eq!(
        message(
            list(SessionFilter {
                bundle_version: Some("1.0.0".to_owned()),
                ..SessionFilter::default()
            })
            .await
        ),
        (
            "InvalidArgument",
            "the bundle_version filter requires the bundle filter".to_owned()
        )
    );
    // The started event records the bundle version; an agent session's omits it.
    let started = &ledger.list_events(&root.id, 0, 1).await.unwrap()[0];
    assert_eq!(
        started.payload["bundle_version_id"],
        json!(bundle_version.to_string())
    );
    let started = &ledger.list_events(&agent_session.id, 0, 1).await.unwrap()[0];
    assert!(started.payload.get("bundle_version_id").is_none());
}

const BUNDLE_PROJECTIONS: [&str; 6] = [
    "bundles",
    "bundle_versions",
    "bundle_members",
    "bundle_deployments",
    "agent_versions",
    "sessions",
];

pub(crate) async fn rebuild_reproduces_bundle_projections_exactly(db: &TestDb) {
    db.migrated().await;
    let ledger = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(AuditKey::from_bytes([7; 32]));
    ledger.start_audit(true).await.unwrap();
    deploy_agent(&ledger, &refund_agent(), "1.0.0").await;
    ledger
        .publish_bundle(&new_bundle("1.0.0", "a"))
        .await
        .unwrap();
    ledger
        .publish_bundle(&new_bundle("2.0.0", "b"))
        .await
        .unwrap();
    ledger
        .deploy_bundle(&bundle(), "1.0.0", &alice())
        .await
        .unwrap();
    // A refusal and a deploy that records a member's new endpoint are part of the stream: the
    // chain and the rebuild take them as they come (the refusal changes no projection).
    let change = SecretEndpointChange {
        member: Some("triage".into()),
        secret: "openai".into(),
        from_env: "OPENAI_API_KEY".into(),
        endpoint: "http://b.example/v1".into(),
        previous: vec!["http://a.example/v1".into()],
    };
    ledger
        .record_bundle_activation_refused(
            &bundle(),
            &lock_hash("b"),
            DeploymentAction::Deploy,
            std::slice::from_ref(&change),
            &alice(),
        )
        .await
        .unwrap();
    let record = SecretEndpointRecord {
        endpoints: vec![SecretEndpoint {
            member: change.member.clone(),
            secret: change.secret.clone(),
            from_env: change.from_env.clone(),
            endpoint: change.endpoint.clone(),
        }],
        changes: vec![change.clone()],
    };
    ledger
        .deploy_bundle_recording(&bundle(), "2.0.0", &alice(), Some(&record))
        .await
        .unwrap();
    ledger
        .rollback_bundle(&bundle(), None, &alice())
        .await
        .unwrap();
    let recorded: Vec<EventBody> = ledger
        .export_events(None, None, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.stream == bundle().stream())
        .map(|e| e.body().unwrap())
        .filter(|b| !matches!(b, EventBody::BundleVersionPublished(_)))
        .collect();
    let [
        EventBody::BundleDeployed(first),
        EventBody::BundleActivationRefused(refused),
        EventBody::BundleDeployed(second),
        EventBody::BundleRolledBack(back),
    ] = recorded.as_slice()
    else {
        panic!("{recorded:?}");
    };
    assert_eq!(
        (&refused.version, refused.action, &refused.changes),
        (&"2.0.0".to_owned(), DeploymentAction::Deploy, &vec![change])
    );
    assert_eq!(
        first.secret_endpoints, None,
        "deploy_bundle records nothing"
    );
    assert_eq!(second.secret_endpoints.as_ref(), Some(&record.endpoints));
    assert_eq!(second.secret_endpoint_changes, record.changes);
    assert_eq!(back.secret_endpoints, None);
    let runnable = ledger.runnable_bundle(&bundle(), None).await.unwrap();
    let mut root = session_on(
        runnable.root.id,
        AgentVersionRef::new("support", "triage", "1.0.0"),
    );
    root.bundle_version_id = Some(runnable.version.id);
    ledger.create_session(root).await.unwrap();

    let mut before = Vec::new();
    for t in BUNDLE_PROJECTIONS {
        let rows = db.table_snapshot(t).await;
        assert!(!rows.is_empty(), "{t} should have rows");
        before.push(rows);
    }
    // The stored projections equal the events re-folded.
    let report = ledger.verify_audit(AuditScope::All).await.unwrap();
    assert_eq!(report.problem, None);

    // Tamper with the projections; the rebuild restores them from the bundle stream.
    db.raw_exec("UPDATE bundle_versions SET lock = '{}'").await;
    db.raw_exec("UPDATE bundle_members SET lock_content_hash = 'x'")
        .await;
    db.raw_exec("UPDATE agent_versions SET member_name = 'x' WHERE origin = 'vendored'")
        .await;
    db.raw_exec("DELETE FROM bundle_deployments WHERE action = 'rollback'")
        .await;
    let problem = ledger
        .verify_audit(AuditScope::All)
        .await
        .unwrap()
        .problem
        .expect("the tampered projections differ from the events");
    assert!(
        problem.message.contains("projection"),
        "{}",
        problem.message
    );
    let report = ledger.rebuild_projections().await.unwrap();
    assert_eq!(report.streams, 3, "agent, bundle and session streams");
    for (t, rows) in BUNDLE_PROJECTIONS.iter().zip(&before) {
        assert_eq!(&db.table_snapshot(t).await, rows, "{t} after rebuild");
    }
    assert_eq!(
        ledger.verify_audit(AuditScope::All).await.unwrap().problem,
        None
    );
    assert_eq!(
        ledger.active_bundle(&bundle()).await.unwrap().action,
        DeploymentAction::Rollback
    );
}

/// A change to one member (a refusal case).
type MemberEdit = Box<dyn Fn(&mut NewBundleMember)>;

/// A member naming the published version `v` (`support.refund-agent@…`).
fn external_member(v: &AgentVersion) -> NewBundleMember {
    NewBundleMember {
        child_name: v.agent.name.clone(),
        origin: BundleMemberOrigin::External,
        reference: format!("{}.{}@{}", v.agent.namespace, v.agent.name, v.version),
        is_root: false,
        lock_content_hash: v.content_hash.clone(),
        version_id: v.id,
        agent: AgentVersionRef::new(&v.agent.namespace, &v.agent.name, &v.version),
        snapshot_json: String::new(),
        content_hash: v.content_hash.clone(),
    }
}

/// `triage` (vendored root) and `refund-agent` (external, `v`).
fn bundle_with_external(version: &str, lock: &str, v: &AgentVersion) -> NewBundleVersion {
    let mut new = new_bundle(version, lock);
    new.members[1] = external_member(v);
    new
}

pub(crate) async fn an_external_bundle_member_names_a_published_version(db: &TestDb) {
    let ledger = db.migrated().await;
    let published = deploy_agent(ledger, &refund_agent(), "1.0.0").await;
    let agent_versions_before = ledger
        .list_agent_versions(&refund_agent())
        .await
        .unwrap()
        .len();

    // Every way an external member can fail to name a usable published version is refused,
    // and nothing is written.
    let refusals: Vec<(&str, MemberEdit, &str)> = vec![
        (
            "FailedPrecondition",
            Box::new(|m| m.version_id = Uuid::new_v4()),
            "does not exist",
        ),
        (
            "FailedPrecondition",
            Box::new(|m| m.content_hash = "sha256:other".to_owned()),
            "differs from the published version's",
        ),
        (
            "FailedPrecondition",
            Box::new(|m| m.agent.version = "9.9.9".to_owned()),
            "is support/refund-agent@1.0.0",
        ),
        (
            "InvalidArgument",
            Box::new(|m| m.snapshot_json = "{}".to_owned()),
            "an external member carries no snapshot",
        ),
    ];
    for (code, mutate, fragment) in refusals {
        let mut new = bundle_with_external("1.0.0", "ext", &published);
        mutate(&mut new.members[1]);
        let (got_code, got) = message(ledger.publish_bundle(&new).await);
        assert_eq!(got_code, code, "{got}");
        assert!(
            got.contains("\"refund-agent\"") && got.contains(fragment),
            "{fragment}: {got}"
        );
    }
    let mut root_external = bundle_with_external("1.0.0", "ext", &published);
    root_external.members.swap(0, 1);
    root_external.members[0].is_root = true;
    root_external.members[1].is_root = false;
    let (code, got) = message(ledger.publish_bundle(&root_external).await);
    assert_eq!(
        (code, got.as_str()),
        (
            "InvalidArgument",
            "members[0] \"refund-agent\": an external member cannot be the root"
        )
    );
    assert!(ledger.list_bundles(None).await.unwrap().is_empty());

    // A vendored version is not a published one.
    ledger
        .publish_bundle(&new_bundle("0.1.0", "vendored"))
        .await
        .unwrap();
    let (_, members, _) = ledger
        .get_bundle_version(&bundle(), Some("0.1.0"))
        .await
        .unwrap();
    let vendored_id = members[0].member_version_id;
    let vendored_version = ledger.get_agent_version_by_id(vendored_id).await.unwrap();
    let mut new = bundle_with_external("0.2.0", "vendored-as-external", &published);
    new.members[1].version_id = vendored_id;
    new.members[1].agent = AgentVersionRef::new(
        &vendored_version.agent.namespace,
        &vendored_version.agent.name,
        &vendored_version.version,
    );
    new.members[1].content_hash = vendored_version.content_hash.clone();
    let (code, got) = message(ledger.publish_bundle(&new).await);
    assert_eq!(code, "FailedPrecondition", "{got}");
    assert!(
        got.contains("is a vendored bundle member, not a published version"),
        "{got}"
    );

    // The valid publication: no version is created for the external member; its row points at
    // the published version; the event records it as external, without a snapshot.
    let new = bundle_with_external("1.0.0", "ext", &published);
    let done = ledger.publish_bundle(&new).await.unwrap();
    assert!(done.created);
    assert_eq!(
        ledger
            .list_agent_versions(&refund_agent())
            .await
            .unwrap()
            .len(),
        agent_versions_before
    );
    let unchanged = ledger.get_agent_version_by_id(published.id).await.unwrap();
    assert_eq!(unchanged.origin, VersionOrigin::Published);
    assert_eq!(unchanged.bundle_version_id, None);
    let (_, members, _) = ledger
        .get_bundle_version(&bundle(), Some("1.0.0"))
        .await
        .unwrap();
    let external = members
        .iter()
        .find(|m| m.child_name == "refund-agent")
        .unwrap();
    assert_eq!(external.origin, BundleMemberOrigin::External);
    assert_eq!(external.member_version_id, published.id);
    assert_eq!(external.reference, "support.refund-agent@1.0.0");
    assert_eq!(external.snapshot_json, published.snapshot_json);
    assert_eq!(external.lock_content_hash, published.content_hash);
    let events = ledger
        .list_events("bundle:support/refund-desk", 0, 1000)
        .await
        .unwrap();
    let payload = &events.last().unwrap().payload;
    let recorded = &payload["members"][1];
    assert_eq!(recorded["origin"], "external", "{payload}");
    assert_eq!(recorded["version_id"], published.id.to_string());
    assert!(recorded.get("snapshot_json").is_none(), "{payload}");

    // The bundle deploys and runs; a rebuild reproduces the external member row.
    ledger
        .deploy_bundle(&bundle(), "1.0.0", &alice())
        .await
        .unwrap();
    let runnable = ledger.runnable_bundle(&bundle(), None).await.unwrap();
    assert!(
        runnable
            .members
            .iter()
            .any(|m| m.member_version_id == published.id)
    );
    let before = db.table_snapshot("bundle_members").await;
    ledger.rebuild_projections().await.unwrap();
    assert_eq!(db.table_snapshot("bundle_members").await, before);

    // A retired version, or a version of an archived agent, cannot be named.
    ledger
        .publish_agent_version(NewAgentVersion {
            namespace: "support".to_owned(),
            name: "refund-agent".to_owned(),
            version: "1.1.0".to_owned(),
            owner: "payments-team".to_owned(),
            labels: BTreeMap::new(),
            snapshot_json: r#"{"kind":"Agent","version":"1.1.0"}"#.to_owned(),
            content_hash: "sha256:refund-1.1.0".to_owned(),
            actor: alice(),
        })
        .await
        .unwrap();
    ledger
        .retire_version(&refund_agent(), "1.1.0", &alice())
        .await
        .unwrap();
    let retired = ledger
        .get_agent_version(&refund_agent(), "1.1.0")
        .await
        .unwrap();
    let (code, got) = message(
        ledger
            .publish_bundle(&bundle_with_external("1.1.0", "retired", &retired))
            .await,
    );
    assert_eq!(code, "FailedPrecondition", "{got}");
    assert!(got.ends_with("the version is retired"), "{got}");
    ledger
        .archive_agent(&refund_agent(), &alice())
        .await
        .unwrap();
    let (code, got) = message(
        ledger
            .publish_bundle(&bundle_with_external("1.2.0", "archived", &published))
            .await,
    );
    assert_eq!(code, "FailedPrecondition", "{got}");
    assert!(
        got.ends_with("agent support/refund-agent is archived"),
        "{got}"
    );
}
