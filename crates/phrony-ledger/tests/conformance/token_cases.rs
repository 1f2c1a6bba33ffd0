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
