//! API token store cases: create, list, find by hash, revoke, and their audit events.

use phrony_auth::{Role, TokenSecret, ToolPattern};
use phrony_ledger::{EventBody, LedgerError, NewApiToken, TOKENS_STREAM};

use crate::harness::TestDb;

fn new_token(name: &str, seed: u8) -> (TokenSecret, NewApiToken) {
    let secret = TokenSecret::from_random([seed; 32]);
    let token = NewApiToken {
        name: name.to_owned(),
        secret_hash: secret.hash(),
        roles: vec![Role::Approver, Role::Viewer],
        routes: vec!["finance".to_owned()],
        tools: vec![ToolPattern::parse("payments.*@1.*").unwrap()],
        expires_at: None,
        created_by: "ops".to_owned(),
    };
    (secret, token)
}

pub(crate) async fn tokens_are_stored_hashed_found_by_hash_and_revoked(db: &TestDb) {
    let ledger = db.migrated().await;
    let (secret, new) = new_token("finance-approver", 1);
    let expires = chrono::Utc::now() + chrono::Duration::days(30);
    let created = ledger
        .create_api_token(NewApiToken {
            expires_at: Some(expires),
            ..new.clone()
        })
        .await
        .unwrap();
    assert_eq!(created.name, "finance-approver");
    assert_eq!(created.roles, vec![Role::Approver, Role::Viewer]);
    assert_eq!(created.routes, vec!["finance"]);
    assert_eq!(created.tools[0].to_string(), "payments.*@1.*");
    assert!(created.revoked_at.is_none());

    // Looked up by the hash of what a client presents; another secret finds nothing.
    let found = ledger
        .find_api_token_by_hash(&secret.hash())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found, created);
    let other = TokenSecret::from_random([2; 32]);
    assert!(
        ledger
            .find_api_token_by_hash(&other.hash())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        ledger.list_api_tokens().await.unwrap(),
        vec![created.clone()]
    );

    // The secret is nowhere in the database; the hash only in its row, never in an event.
    let rows = db
        .raw_strings("SELECT payload, actor, type FROM events")
        .await;
    for row in &rows {
        let text = format!("{row:?}");
        assert!(!text.contains(&secret.hash()), "{text}");
        assert!(!text.contains(secret.expose()), "{text}");
    }
    let stored = db.raw_strings("SELECT secret_hash FROM api_tokens").await;
    assert_eq!(stored, vec![vec![Some(secret.hash())]]);

    let revoked = ledger
        .revoke_api_token("FINANCE-approver", "ciso")
        .await
        .unwrap();
    assert_eq!(revoked.revoked_by.as_deref(), Some("ciso"));
    let found = ledger
        .find_api_token_by_hash(&secret.hash())
        .await
        .unwrap()
        .unwrap();
    assert!(
        found.revoked_at.is_some(),
        "revocation is visible to the next lookup"
    );

    // Both changes are chained events of the tokens stream, by who made them.
    let events = ledger.list_events(TOKENS_STREAM, 0, 100).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].actor, "ops");
    match events[0].body().unwrap() {
        EventBody::TokenCreated(c) => {
            assert_eq!(c.name, "finance-approver");
            assert_eq!(c.roles, vec!["approver", "viewer"]);
            assert_eq!(c.tools, vec!["payments.*@1.*"]);
            assert!(c.expires_at.is_some());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(events[1].actor, "ciso");
    assert!(
        matches!(events[1].body().unwrap(), EventBody::TokenRevoked(r) if r.name == "finance-approver")
    );
    let report = ledger.verify_stream(TOKENS_STREAM).await.unwrap();
    assert!(report.violation.is_none(), "{report:?}");

    // Rebuilding the projections keeps the tokens (they are not a projection).
    ledger.rebuild_projections().await.unwrap();
    assert_eq!(ledger.list_api_tokens().await.unwrap().len(), 1);
}

pub(crate) async fn token_names_are_unique_and_bad_requests_are_named(db: &TestDb) {
    let ledger = db.migrated().await;
    let (_, first) = new_token("deploy-bot", 3);
    ledger.create_api_token(first.clone()).await.unwrap();

    // The same name, ignoring case, with another secret.
    let (_, dup) = new_token("Deploy-Bot", 4);
    match ledger.create_api_token(dup).await {
        Err(LedgerError::AlreadyExists { message }) => {
            assert!(
                message.contains("\"deploy-bot\" already exists"),
                "{message}"
            );
        }
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    // Another name with the same secret.
    match ledger
        .create_api_token(NewApiToken {
            name: "other".into(),
            ..first.clone()
        })
        .await
    {
        Err(LedgerError::AlreadyExists { message }) => {
            assert!(message.contains("same secret"), "{message}");
        }
        other => panic!("expected AlreadyExists, got {other:?}"),
    }

    let invalid = |r: Result<phrony_ledger::ApiToken, LedgerError>| match r {
        Err(LedgerError::InvalidArgument { message }) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    let (_, base) = new_token("x", 5);
    let msg = invalid(
        ledger
            .create_api_token(NewApiToken {
                name: "system".into(),
                ..base.clone()
            })
            .await,
    );
    assert!(msg.contains("token name \"system\""), "{msg}");
    let msg = invalid(
        ledger
            .create_api_token(NewApiToken {
                name: " padded".into(),
                ..base.clone()
            })
            .await,
    );
    assert!(msg.contains("token name"), "{msg}");
    let msg = invalid(
        ledger
            .create_api_token(NewApiToken {
                secret_hash: "phr_plaintext".into(),
                ..base.clone()
            })
            .await,
    );
    assert!(msg.contains("64 lowercase hex"), "{msg}");
    let msg = invalid(
        ledger
            .create_api_token(NewApiToken {
                roles: vec![],
                ..base.clone()
            })
            .await,
    );
    assert!(msg.contains("at least one role"), "{msg}");
    let msg = invalid(
        ledger
            .create_api_token(NewApiToken {
                routes: vec![String::new()],
                ..base.clone()
            })
            .await,
    );
    assert!(msg.contains("route"), "{msg}");

    // Revoking a name nobody has is a clear NotFound; revoking twice says when and by whom.
    match ledger.revoke_api_token("ghost", "ciso").await {
        Err(LedgerError::NotFound { message }) => {
            assert!(
                message.contains("no API token named \"ghost\""),
                "{message}"
            );
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    ledger.revoke_api_token("deploy-bot", "ciso").await.unwrap();
    match ledger.revoke_api_token("deploy-bot", "ciso").await {
        Err(LedgerError::FailedPrecondition { message }) => {
            assert!(message.contains("already revoked"), "{message}");
            assert!(message.contains("by ciso"), "{message}");
        }
        other => panic!("expected FailedPrecondition, got {other:?}"),
    }
    // A revoked token keeps its name.
    let (_, again) = new_token("deploy-bot", 6);
    assert!(matches!(
        ledger.create_api_token(again).await,
        Err(LedgerError::AlreadyExists { .. })
    ));
    // Only the successful changes left events: one creation, one revocation.
    let events = ledger.list_events(TOKENS_STREAM, 0, 100).await.unwrap();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, vec!["token.created", "token.revoked"]);
    // The event log refuses token events from outside the ledger.
    assert!(
        ledger
            .append_session_event(
                TOKENS_STREAM,
                phrony_ledger::NewEvent::new(
                    "token.created",
                    "mallory",
                    serde_json::json!({"name": "mallory", "roles": ["admin"], "routes": [], "tools": []}),
                ),
            )
            .await
            .is_err()
    );
}

// ---------------------------------------------------------------------------------------------
// Worker descriptor pins (`workers.rs`).

fn pinned_agent(name: &str, version: &str, description: &str, tool_version: &str) -> String {
    use phrony_manifest::{AgentSpec, CompiledAgent, Metadata, ToolBinding};
    let agent = CompiledAgent {
        api_version: "phrony.com/v1".to_owned(),
        kind: "Agent".to_owned(),
        metadata: Metadata {
            name: name.to_owned(),
            namespace: "support".to_owned(),
            version: version.to_owned(),
            annotations: std::collections::BTreeMap::from([(
                phrony_manifest::ANNOTATION_POLICIES_COMPILED.to_owned(),
                "true".to_owned(),
            )]),
            ..Metadata::default()
        },
        secrets: std::collections::BTreeMap::new(),
        spec: AgentSpec {
            purpose: "Refunds.".to_owned(),
            tools: vec![ToolBinding {
                reference: "payments.issue-refund".to_owned(),
                description: description.to_owned(),
                version: tool_version.to_owned(),
                ..ToolBinding::default()
            }],
            ..AgentSpec::default()
        },
        output: None,
    };
    String::from_utf8(agent.snapshot_json()).unwrap()
}

fn pin(description: &str, tool_version: &str) -> String {
    phrony_manifest::descriptor_pin("payments.issue-refund", tool_version, description, None)
}

pub(crate) async fn descriptor_pins_follow_versions_and_refusals_are_audited(db: &TestDb) {
    use phrony_ledger::{
        AgentRef, AuditScope, NewAgentVersion, WORKERS_STREAM, WorkerDescriptorRefused,
    };
    db.migrated().await;
    let ledger = phrony_ledger::Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(phrony_ledger::AuditKey::from_bytes([7; 32]));
    ledger.start_audit(true).await.unwrap();
    let publish = |name: &str, version: &str, snapshot: String| NewAgentVersion {
        namespace: "support".to_owned(),
        name: name.to_owned(),
        version: version.to_owned(),
        owner: String::new(),
        labels: std::collections::BTreeMap::new(),
        content_hash: format!("hash-{name}-{version}"),
        snapshot_json: snapshot,
        actor: phrony_ledger::Attribution::unverified("alice".to_owned()),
    };
    for (name, version, description, tool_version) in [
        ("a", "1.0.0", "Contract A.", "1.0.0"),
        ("a", "2.0.0", "Contract B.", "1.0.0"),
        ("b", "1.0.0", "Contract B.", "1.0.0"),
        ("b", "2.0.0", "Contract C.", "2.0.0"),
    ] {
        ledger
            .publish_agent_version(publish(
                name,
                version,
                pinned_agent(name, version, description, tool_version),
            ))
            .await
            .unwrap();
    }
    // A stored snapshot this build cannot read holds no pin (and breaks nothing).
    ledger
        .publish_agent_version(publish(
            "c",
            "1.0.0",
            r#"{"kind":"Agent","spec":{"tools":"payments.issue-refund"}}"#.to_owned(),
        ))
        .await
        .unwrap();

    let mut both = vec![pin("Contract A.", "1.0.0"), pin("Contract B.", "1.0.0")];
    both.sort();
    assert_eq!(
        ledger
            .descriptor_pins("payments.issue-refund", "1.0.0")
            .await
            .unwrap(),
        both,
        "distinct and sorted"
    );
    assert_eq!(
        ledger
            .descriptor_pins("payments.issue-refund", "2.0.0")
            .await
            .unwrap(),
        [pin("Contract C.", "2.0.0")]
    );
    assert!(
        ledger
            .descriptor_pins("orders.lookup", "1.0.0")
            .await
            .unwrap()
            .is_empty()
    );
    // A retired version runs nothing, so its pin no longer counts.
    ledger
        .retire_version(
            &AgentRef::new("support", "a"),
            "1.0.0",
            &phrony_ledger::Attribution::unverified("ops"),
        )
        .await
        .unwrap();
    assert_eq!(
        ledger
            .descriptor_pins("payments.issue-refund", "1.0.0")
            .await
            .unwrap(),
        [pin("Contract B.", "1.0.0")]
    );

    // A refusal is one typed event in the workers stream; the log still verifies and the
    // projections rebuild.
    let refusal = WorkerDescriptorRefused {
        worker_id: "w-1".to_owned(),
        workload_identity: "refund-bot".to_owned(),
        image_digest: String::new(),
        verified_credential: Some("\"refund-bot\" (token)".to_owned()),
        tool: "payments.issue-refund".to_owned(),
        version: "1.0.0".to_owned(),
        received_hash: "sha256:forged".to_owned(),
        expected_pins: vec![pin("Contract B.", "1.0.0")],
        repeated: 0,
        unrecorded_refusals: 0,
    };
    ledger
        .record_descriptor_refusal(refusal.clone())
        .await
        .unwrap();
    let events = ledger.list_events(WORKERS_STREAM, 0, 10).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_type, "worker.descriptor_refused");
    assert_eq!(events[0].actor, "worker");
    assert_eq!(
        events[0].body().unwrap(),
        EventBody::WorkerDescriptorRefused(refusal.clone())
    );
    // Optional fields that are empty (or zero counts) are not stored.
    for absent in ["image_digest", "repeated", "unrecorded_refusals"] {
        assert!(
            events[0].payload.get(absent).is_none(),
            "{absent} in {}",
            events[0].payload
        );
    }
    // The counts of refusals folded into an event are stored and read back.
    let folded = WorkerDescriptorRefused {
        repeated: 59,
        unrecorded_refusals: 7,
        ..refusal.clone()
    };
    ledger
        .record_descriptor_refusal(folded.clone())
        .await
        .unwrap();
    let events = ledger.list_events(WORKERS_STREAM, 0, 10).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].payload["repeated"], 59);
    assert_eq!(
        events[1].body().unwrap(),
        EventBody::WorkerDescriptorRefused(folded)
    );
    assert!(
        ledger
            .record_descriptor_refusal(WorkerDescriptorRefused {
                worker_id: String::new(),
                ..refusal
            })
            .await
            .is_err()
    );
    ledger.rebuild_projections().await.unwrap();
    let report = ledger.verify_audit(AuditScope::All).await.unwrap();
    assert!(report.problem.is_none(), "{report:?}");
}
