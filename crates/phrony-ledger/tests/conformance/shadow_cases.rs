//! Shadow decisions: `policy.shadow` events in their policy's stream, indexed for the report and
//! recorded once per call and policy.

use phrony_ledger::{
    AuditKey, AuditScope, EventBody, Ledger, LedgerError, PolicyShadowed, PolicyVerdict,
    ShadowDecisionFilter, shadow_stream,
};

use crate::harness::TestDb;

fn shadowed(call: &str, policy: &str, shadow: PolicyVerdict) -> PolicyShadowed {
    PolicyShadowed {
        session_id: "s-1".to_owned(),
        call_id: call.to_owned(),
        agent: "payments/refunds@1.0.0".to_owned(),
        tool: "payments.issue-refund".to_owned(),
        args_digest: "d".repeat(64),
        enforced: PolicyVerdict::Allow,
        enforced_policy: None,
        shadow,
        policy: policy.to_owned(),
        reason: Some("gold is off limits".to_owned()),
    }
}

fn filter(
    name: &str,
    since: Option<chrono::DateTime<chrono::Utc>>,
    limit: u32,
) -> ShadowDecisionFilter {
    ShadowDecisionFilter {
        namespace: "payments".to_owned(),
        name: name.to_owned(),
        since,
        limit,
    }
}

pub(crate) async fn shadow_decisions_are_recorded_once_indexed_and_verified(db: &TestDb) {
    db.migrated().await;
    let ledger = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(AuditKey::from_bytes([9; 32]));
    ledger.start_audit(true).await.unwrap();

    let first = shadowed("c-1", "payments/no-gold@1.0.0", PolicyVerdict::Deny);
    let event = ledger
        .record_shadow_decision(first.clone())
        .await
        .unwrap()
        .expect("the first record writes an event");
    assert_eq!(event.stream, shadow_stream("payments", "no-gold"));
    assert_eq!(event.stream, "shadow:payments/no-gold");
    assert_eq!(event.event_type, "policy.shadow");
    assert_eq!(event.actor, "policy");
    assert_eq!(event.call_id.as_deref(), Some("c-1"));
    assert_eq!(
        event.body().unwrap(),
        EventBody::PolicyShadow(first.clone())
    );
    assert_eq!(event.payload["enforced"], "allow");
    assert_eq!(event.payload["shadow"], "deny");
    assert!(
        event.payload.get("enforced_policy").is_none(),
        "{}",
        event.payload
    );

    // The same call and policy again (a re-decide after a crash): nothing more is written.
    assert!(
        ledger
            .record_shadow_decision(first.clone())
            .await
            .unwrap()
            .is_none()
    );
    let second = PolicyShadowed {
        enforced_policy: Some("payments/big@1.0.0".to_owned()),
        enforced: PolicyVerdict::RequireApproval,
        ..shadowed("c-2", "payments/no-gold@1.1.0", PolicyVerdict::Deny)
    };
    ledger.record_shadow_decision(second.clone()).await.unwrap();
    // Another policy, another stream; not in the first policy's report.
    let other = shadowed("c-1", "payments/mid@1.0.0", PolicyVerdict::RequireApproval);
    ledger.record_shadow_decision(other.clone()).await.unwrap();
    let events = ledger
        .list_events(&shadow_stream("payments", "no-gold"), 0, 10)
        .await
        .unwrap();
    assert_eq!(events.len(), 2, "one event per call: {events:?}");

    // The report of one policy (every version), oldest first, since a time, bounded.
    let all = ledger
        .shadow_decisions(&filter("no-gold", None, 100))
        .await
        .unwrap();
    let decided: Vec<&PolicyShadowed> = all.iter().map(|d| &d.decision).collect();
    assert_eq!(decided, [&first, &second]);
    assert_eq!(
        all.iter().map(|d| d.seq).collect::<Vec<_>>(),
        [1, 2],
        "the index points at the stream's events"
    );
    let since = ledger
        .shadow_decisions(&filter("no-gold", Some(all[1].recorded_at), 100))
        .await
        .unwrap();
    assert_eq!(since.len(), 1);
    assert_eq!(since[0].decision, second);
    let later = all[1].recorded_at + chrono::Duration::seconds(1);
    assert!(
        ledger
            .shadow_decisions(&filter("no-gold", Some(later), 100))
            .await
            .unwrap()
            .is_empty()
    );
    let one = ledger
        .shadow_decisions(&filter("no-gold", None, 1))
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].decision, first);
    let mid = ledger
        .shadow_decisions(&filter("mid", None, 10))
        .await
        .unwrap();
    assert_eq!(mid.len(), 1);
    assert_eq!(mid[0].decision, other);
    assert!(
        ledger
            .shadow_decisions(&filter("unknown", None, 10))
            .await
            .unwrap()
            .is_empty()
    );

    // Bad requests are named.
    for (bad, what) in [
        (filter("no-gold", None, 0), "limit must be 1 to 1000, not 0"),
        (
            filter("no-gold", None, 1001),
            "limit must be 1 to 1000, not 1001",
        ),
        (filter("", None, 10), "policy name is required"),
    ] {
        match ledger.shadow_decisions(&bad).await {
            Err(LedgerError::InvalidArgument { message }) => assert_eq!(message, what),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    match ledger
        .record_shadow_decision(shadowed("c-3", "no-gold@1.0.0", PolicyVerdict::Deny))
        .await
    {
        Err(LedgerError::InvalidArgument { message }) => {
            assert!(message.contains("namespace/name@version"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ledger
            .record_shadow_decision(PolicyShadowed {
                call_id: String::new(),
                ..first.clone()
            })
            .await,
        Err(LedgerError::InvalidArgument { .. })
    ));

    // The streams are sealed and verify; the projections rebuild around them.
    ledger.rebuild_projections().await.unwrap();
    let report = ledger.verify_audit(AuditScope::All).await.unwrap();
    assert!(report.problem.is_none(), "{report:?}");
    assert_eq!(
        ledger
            .shadow_decisions(&filter("no-gold", None, 100))
            .await
            .unwrap()
            .len(),
        2
    );
}
