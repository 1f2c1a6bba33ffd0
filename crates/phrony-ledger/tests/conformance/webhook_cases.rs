//! The webhook outbox: rows committed with their event (and rolled back with it), the delivery
//! state machine, and concurrent claimers that never take the same attempt.

use std::collections::HashSet;
use std::time::Duration;

use phrony_ledger::{
    AttemptOutcome, Backend, DeliveryFilter, DeliveryStatus, EventBody, Ledger, LedgerError,
    NotificationKind, SessionStatus, StatusChange, TimeoutDefault, UnconfiguredWebhook,
    WEBHOOKS_ACTOR, WEBHOOKS_STREAM, WebhookRoute,
};
use uuid::Uuid;

use crate::harness::TestDb;
use crate::session_cases::{
    approval_for, approve, deploy_agent, pending_approval, refund_agent, refund_call, start, to,
};

fn routes() -> Vec<WebhookRoute> {
    vec![
        WebhookRoute {
            name: "ops".to_owned(),
            kinds: NotificationKind::ALL.to_vec(),
        },
        WebhookRoute {
            name: "slack".to_owned(),
            kinds: vec![NotificationKind::ApprovalRequired],
        },
        WebhookRoute {
            name: "silent".to_owned(),
            kinds: Vec::new(),
        },
    ]
}

async fn webhook_ledger(db: &TestDb) -> Ledger {
    db.migrated().await;
    Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_webhooks(routes())
}

async fn count(db: &TestDb, sql: &str) -> i64 {
    db.raw_strings(&format!("SELECT CAST(COUNT(*) AS TEXT) FROM ({sql}) AS q"))
        .await[0][0]
        .clone()
        .unwrap()
        .parse()
        .unwrap()
}

async fn refuse_delivery_rows(db: &TestDb) {
    match db.kind {
        Backend::Sqlite => {
            db.raw_exec(
                "CREATE TRIGGER refuse_deliveries BEFORE INSERT ON webhook_deliveries BEGIN \
                 SELECT RAISE(ABORT, 'delivery rows refused by the test'); END",
            )
            .await;
        }
        Backend::Postgres => {
            db.raw_exec(
                "CREATE FUNCTION refuse_deliveries() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'delivery rows refused by the test'; END $$",
            )
            .await;
            db.raw_exec(
                "CREATE TRIGGER refuse_deliveries BEFORE INSERT ON webhook_deliveries \
                 FOR EACH ROW EXECUTE FUNCTION refuse_deliveries()",
            )
            .await;
        }
    }
}

async fn allow_delivery_rows(db: &TestDb) {
    match db.kind {
        Backend::Sqlite => db.raw_exec("DROP TRIGGER refuse_deliveries").await,
        Backend::Postgres => {
            db.raw_exec("DROP TRIGGER refuse_deliveries ON webhook_deliveries")
                .await;
        }
    }
}

pub(crate) async fn webhook_outbox_rows_commit_with_their_event(db: &TestDb) {
    let ledger = webhook_ledger(db).await;
    let wake = ledger.webhook_wake().expect("webhooks are on");
    let v = deploy_agent(&ledger, &refund_agent(), "0.1.0").await;

    // Opening an approval writes the event, one outbox row and a delivery per route that
    // receives approval.required, and wakes the sender after the commit.
    let (session, _, approval) = pending_approval(&ledger, &v, |_| {}).await;
    tokio::time::timeout(Duration::from_secs(5), wake.notified())
        .await
        .expect("the commit wakes the sender");
    let outbox = db
        .raw_strings("SELECT stream, CAST(seq AS TEXT), kind FROM webhook_outbox")
        .await;
    let required_seq = ledger
        .events_after(&session.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.event_type == "approval.required")
        .unwrap()
        .seq;
    assert_eq!(
        outbox,
        vec![vec![
            Some(session.id.clone()),
            Some(required_seq.to_string()),
            Some("approval.required".to_owned())
        ]]
    );
    let deliveries = ledger
        .webhook_deliveries(&DeliveryFilter::default())
        .await
        .unwrap();
    let mut names: Vec<&str> = deliveries.iter().map(|d| d.webhook.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["ops", "slack"], "the silent route receives nothing");
    assert!(
        deliveries
            .iter()
            .all(|d| d.status == DeliveryStatus::Pending
                && d.attempts == 0
                && d.kind == NotificationKind::ApprovalRequired
                && d.stream == session.id
                && d.seq == required_seq)
    );

    // A decision notifies `ops` only; a vote that does not decide notifies nothing.
    ledger
        .cast_vote(approval.id, approve("alice"))
        .await
        .unwrap();
    let decided = ledger
        .webhook_deliveries(&DeliveryFilter {
            webhook: Some("ops".to_owned()),
            ..DeliveryFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(decided.len(), 2);
    assert_eq!(decided[0].kind, NotificationKind::ApprovalDecided);

    // An expiry with the default deny is approval.expired, not decided.
    let (_, _, expiring) = pending_approval(&ledger, &v, |a| {
        a.timeout = Some(phrony_ledger::ApprovalTimeout {
            after_minutes: 1,
            default: TimeoutDefault::Deny,
            escalate_to_route: None,
            escalate_after_minutes: None,
        });
    })
    .await;
    ledger
        .expire_approval(expiring.id, chrono::Utc::now() + chrono::Duration::hours(1))
        .await
        .unwrap();
    let kinds: Vec<NotificationKind> = ledger
        .webhook_deliveries(&DeliveryFilter {
            webhook: Some("ops".to_owned()),
            ..DeliveryFilter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.kind)
        .collect();
    assert!(
        kinds.contains(&NotificationKind::ApprovalExpired),
        "{kinds:?}"
    );

    // A session that fails notifies session.failed.
    let failing = start(&ledger, &v).await;
    ledger
        .set_session_status(
            &failing.id,
            StatusChange {
                error: Some("the model provider is unreachable".to_owned()),
                ..StatusChange::to(SessionStatus::Failed)
            },
        )
        .await
        .unwrap();
    assert_eq!(
        count(
            db,
            &format!(
                "SELECT id FROM webhook_outbox WHERE stream = '{}' AND kind = 'session.failed'",
                failing.id
            )
        )
        .await,
        1
    );

    // A rolled-back append leaves neither its event nor an outbox row: the delivery insert is
    // refused, so the approval's whole transaction is.
    let outbox_before = count(db, "SELECT id FROM webhook_outbox").await;
    let s = start(&ledger, &v).await;
    to(&ledger, &s.id, SessionStatus::AwaitingTool).await;
    let call = ledger
        .record_tool_call(refund_call(&s.id, 0, 0, 400))
        .await
        .unwrap();
    refuse_delivery_rows(db).await;
    let refused = ledger
        .open_approval(approval_for(&s.id, &call.call_id))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    allow_delivery_rows(db).await;
    assert_eq!(
        count(db, "SELECT id FROM webhook_outbox").await,
        outbox_before
    );
    let types: Vec<String> = ledger
        .events_after(&s.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert!(
        !types.contains(&"approval.required".to_owned()),
        "{types:?}"
    );
    // Once the receiver side accepts rows again, the same approval commits with its row.
    ledger
        .open_approval(approval_for(&s.id, &call.call_id))
        .await
        .unwrap();
    assert_eq!(
        count(db, "SELECT id FROM webhook_outbox").await,
        outbox_before + 1
    );

    // A ledger without webhooks writes no outbox rows.
    let plain = db.another_ledger().await;
    assert!(plain.webhook_wake().is_none());
    pending_approval(&plain, &v, |_| {}).await;
    assert_eq!(
        count(db, "SELECT id FROM webhook_outbox").await,
        outbox_before + 1
    );
}

pub(crate) async fn webhook_deliveries_follow_their_state_machine(db: &TestDb) {
    let ledger = webhook_ledger(db).await;
    let v = deploy_agent(&ledger, &refund_agent(), "0.1.0").await;
    pending_approval(&ledger, &v, |_| {}).await;
    let lease = Duration::from_secs(60);

    // Claim: attempt 1, leased; a second claim finds nothing due.
    let first = ledger
        .claim_webhook_deliveries("ops", lease, 10)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let claim = first[0].clone();
    assert_eq!(claim.attempt, 1);
    assert_eq!(claim.kind, NotificationKind::ApprovalRequired);
    assert!(
        ledger
            .claim_webhook_deliveries("ops", lease, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Retry with no backoff: due again, attempt 2, same id. The first claim is stale.
    assert!(
        ledger
            .finish_webhook_delivery(
                &claim,
                AttemptOutcome::Retry {
                    error: "HTTP 500".to_owned(),
                    after: Duration::ZERO,
                },
            )
            .await
            .unwrap()
    );
    let second = ledger
        .claim_webhook_deliveries("ops", lease, 10)
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].id, claim.id);
    assert_eq!(second[0].attempt, 2);
    assert!(
        !ledger
            .finish_webhook_delivery(&claim, AttemptOutcome::Delivered)
            .await
            .unwrap(),
        "a finish under a claim no longer held changes nothing"
    );

    // Give up: failed, with a bounded error.
    let long_error = "e".repeat(5000);
    assert!(
        ledger
            .finish_webhook_delivery(
                &second[0],
                AttemptOutcome::GiveUp {
                    error: long_error.clone(),
                },
            )
            .await
            .unwrap()
    );
    let failed = ledger
        .webhook_deliveries(&DeliveryFilter {
            status: Some(DeliveryStatus::Failed),
            ..DeliveryFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].id, claim.id);
    assert_eq!(failed[0].attempts, 2);
    assert_eq!(
        failed[0].last_error.as_ref().unwrap().chars().count(),
        phrony_ledger::MAX_LAST_ERROR_CHARS
    );
    assert!(
        ledger
            .claim_webhook_deliveries("ops", lease, 10)
            .await
            .unwrap()
            .is_empty(),
        "a failed delivery is never claimed"
    );

    // An operator re-queues it: audited in the webhooks stream with who did it.
    let (requeued, event) = ledger
        .retry_webhook_delivery(claim.id, "user:carol")
        .await
        .unwrap();
    assert_eq!(requeued.status, DeliveryStatus::Pending);
    assert_eq!(requeued.attempts, 0);
    assert_eq!(event.stream, WEBHOOKS_STREAM);
    assert_eq!(event.actor, "user:carol");
    let EventBody::WebhookRetryRequested(body) = event.body().unwrap() else {
        panic!("not a retry event: {event:?}");
    };
    assert_eq!(body.delivery_id, claim.id);
    assert_eq!(body.attempts, 2);
    assert_eq!(body.webhook, "ops");
    let again = ledger
        .retry_webhook_delivery(claim.id, "user:carol")
        .await
        .unwrap_err();
    assert!(
        matches!(&again, LedgerError::FailedPrecondition { message } if message.contains("is pending, not failed")),
        "{again}"
    );
    let missing = ledger
        .retry_webhook_delivery(Uuid::new_v4(), "user:carol")
        .await
        .unwrap_err();
    assert!(matches!(missing, LedgerError::NotFound { .. }), "{missing}");

    // A lease that runs out makes it due again (the sender died mid-attempt).
    let leased = ledger
        .claim_webhook_deliveries("ops", Duration::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(leased[0].attempt, 1);
    let reclaimed = ledger
        .claim_webhook_deliveries("ops", lease, 10)
        .await
        .unwrap();
    assert_eq!(reclaimed[0].id, claim.id);
    assert_eq!(reclaimed[0].attempt, 2);
    assert!(
        ledger
            .finish_webhook_delivery(&reclaimed[0], AttemptOutcome::Delivered)
            .await
            .unwrap()
    );
    let delivered = ledger.webhook_delivery(claim.id).await.unwrap();
    assert_eq!(delivered.status, DeliveryStatus::Delivered);
    assert!(delivered.delivered_at.is_some());

    // Retention: delivered rows older than the bound go, with their outbox row once it has no
    // delivery left; the pending slack delivery keeps its row.
    assert_eq!(
        ledger
            .prune_webhook_deliveries(chrono::Utc::now() - chrono::Duration::days(7))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        ledger
            .prune_webhook_deliveries(chrono::Utc::now() + chrono::Duration::seconds(5))
            .await
            .unwrap(),
        1
    );
    let left = ledger
        .webhook_deliveries(&DeliveryFilter::default())
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].webhook, "slack");
    assert_eq!(count(db, "SELECT id FROM webhook_outbox").await, 1);
}

pub(crate) async fn concurrent_claimers_never_claim_the_same_delivery(db: &TestDb) {
    let ledger = webhook_ledger(db).await;
    let v = deploy_agent(&ledger, &refund_agent(), "0.1.0").await;
    pending_approval(&ledger, &v, |_| {}).await;
    // Many due deliveries of one webhook (rows as the append path writes them).
    let now = "2020-01-01T00:00:00.000000Z";
    let mut all = HashSet::new();
    for seq in 0..120 {
        let id = Uuid::new_v4();
        let outbox_id = Uuid::new_v4();
        all.insert(id);
        db.raw_exec(&format!(
            "INSERT INTO webhook_outbox (id, stream, seq, kind, created_at) VALUES \
             ('{outbox_id}', 'bulk', {seq}, 'approval.required', '{now}')"
        ))
        .await;
        db.raw_exec(&format!(
            "INSERT INTO webhook_deliveries (id, outbox_id, webhook, status, attempts, \
             next_attempt_at, updated_at) VALUES ('{id}', '{outbox_id}', 'bulk-0', 'pending', 0, \
             '{now}', '{now}')"
        ))
        .await;
    }
    let other = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_webhooks(routes());
    let claimer = |ledger: Ledger| {
        tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let batch = ledger
                    .claim_webhook_deliveries("bulk-0", Duration::from_secs(600), 7)
                    .await
                    .unwrap();
                if batch.is_empty() {
                    break;
                }
                got.extend(batch.into_iter().map(|c| c.id));
            }
            got
        })
    };
    let (a, b) = tokio::join!(claimer(ledger.clone()), claimer(other));
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut seen = HashSet::new();
    for id in a.iter().chain(&b) {
        assert!(seen.insert(*id), "delivery {id} was claimed twice");
    }
    assert_eq!(seen, all, "every due delivery was claimed once");
}

pub(crate) async fn deliveries_of_unconfigured_webhooks_fail_with_their_audit(db: &TestDb) {
    let ledger = webhook_ledger(db).await;
    let v = deploy_agent(&ledger, &refund_agent(), "0.1.0").await;
    pending_approval(&ledger, &v, |_| {}).await;
    let pending = ledger
        .webhook_deliveries(&DeliveryFilter::default())
        .await
        .unwrap();
    assert_eq!(pending.len(), 2, "{pending:?}");

    // Everything configured: nothing to do, nothing recorded.
    assert!(
        ledger
            .fail_unconfigured_webhook_deliveries()
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        matches!(
            ledger.list_events(WEBHOOKS_STREAM, 0, 10).await,
            Err(LedgerError::NotFound { .. })
        ),
        "no webhooks stream was started"
    );

    // The file now names only `ops`: slack's pending delivery is failed with the reason and one
    // audited event, in one transaction; ops' stays pending.
    let only_ops = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_webhooks(vec![WebhookRoute {
            name: "ops".to_owned(),
            kinds: NotificationKind::ALL.to_vec(),
        }]);
    let failed = only_ops
        .fail_unconfigured_webhook_deliveries()
        .await
        .unwrap();
    assert_eq!(
        failed,
        vec![UnconfiguredWebhook {
            webhook: "slack".to_owned(),
            deliveries: 1
        }]
    );
    let slack = pending.iter().find(|d| d.webhook == "slack").unwrap();
    let now_failed = only_ops.webhook_delivery(slack.id).await.unwrap();
    assert_eq!(now_failed.status, DeliveryStatus::Failed);
    assert_eq!(
        now_failed.last_error.as_deref(),
        Some("webhook `slack` is no longer configured")
    );
    assert_eq!(now_failed.attempts, 0);
    let ops = pending.iter().find(|d| d.webhook == "ops").unwrap();
    assert_eq!(
        only_ops.webhook_delivery(ops.id).await.unwrap().status,
        DeliveryStatus::Pending
    );
    let events = only_ops.list_events(WEBHOOKS_STREAM, 0, 10).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].actor, WEBHOOKS_ACTOR);
    let EventBody::WebhookUnconfigured(body) = events[0].body().unwrap() else {
        panic!("not an unconfigured event: {:?}", events[0]);
    };
    assert_eq!(body.webhook, "slack");
    assert_eq!(body.deliveries, 1);
    assert_eq!(body.reason, "webhook `slack` is no longer configured");

    // A second start changes nothing and records nothing.
    assert!(
        only_ops
            .fail_unconfigured_webhook_deliveries()
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        only_ops
            .list_events(WEBHOOKS_STREAM, 0, 10)
            .await
            .unwrap()
            .len(),
        1
    );

    // Nothing would send it: an operator retry is refused, and records nothing.
    let refused = only_ops
        .retry_webhook_delivery(slack.id, "user:carol")
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, LedgerError::FailedPrecondition { message }
            if message.contains("webhook `slack` is no longer configured")),
        "{refused}"
    );
    assert_eq!(
        only_ops
            .list_events(WEBHOOKS_STREAM, 0, 10)
            .await
            .unwrap()
            .len(),
        1
    );

    // Webhooks turned off altogether: every pending delivery is failed.
    let none = Ledger::connect(&db.url).await.unwrap();
    let failed = none.fail_unconfigured_webhook_deliveries().await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].webhook, "ops");
    assert_eq!(
        none.webhook_delivery(ops.id).await.unwrap().status,
        DeliveryStatus::Failed
    );
    let refused = none
        .retry_webhook_delivery(ops.id, "user:carol")
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, LedgerError::FailedPrecondition { .. }),
        "{refused}"
    );
}
