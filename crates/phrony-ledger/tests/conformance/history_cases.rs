//! History-aware policy state (migration 0014): reservations at decision time, committed with
//! the call's success and released with its failure, denial or cancellation, in those events'
//! transactions; exact windows; idempotency per call; and no two deciders passing a cap only one
//! fits.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

use chrono::{DateTime, Duration, TimeZone, Utc};
use phrony_ledger::{
    Dispatch, HistoryCounts, HistoryKey, HistoryRead, HistoryReservation, Ledger, LedgerClock,
    LedgerError, LedgerOptions, NewToolCall, SessionStatus, SideEffectClass, StatusChange,
    ToolOutcome, ToolResult,
};
use serde_json::{Value, json};

use crate::harness::TestDb;
use crate::session_cases::{deploy_agent, refund_agent};

fn key(query: &str, group: &str) -> HistoryKey {
    HistoryKey {
        query_key: query.to_owned(),
        scope_key: "*".to_owned(),
        group_key: group.to_owned(),
    }
}

fn read(query: &str, group: &str) -> HistoryRead {
    HistoryRead {
        key: key(query, group),
        since: None,
        max: true,
        last: true,
    }
}

fn reserve(query: &str, group: &str, amount: Option<f64>, version: i64) -> HistoryReservation {
    HistoryReservation {
        key: key(query, group),
        amount,
        result_path: None,
        expected_version: version,
        window_secs: None,
    }
}

/// A ledger whose clock reads `now` (Unix microseconds).
async fn clocked(db: &TestDb, now: &Arc<AtomicI64>) -> Ledger {
    let clock_now = Arc::clone(now);
    Ledger::connect_with(
        &db.url,
        LedgerOptions {
            clock: LedgerClock::new(move || {
                DateTime::from_timestamp_micros(clock_now.load(Ordering::SeqCst))
                    .unwrap_or_default()
            }),
            ..LedgerOptions::default()
        },
    )
    .await
    .unwrap()
}

fn window_read(query: &str, group: &str, since: DateTime<Utc>) -> HistoryRead {
    HistoryRead {
        since: Some(since),
        ..read(query, group)
    }
}

async fn facts(ledger: &Ledger, call: &str, reads: &[HistoryRead]) -> Vec<HistoryCounts> {
    ledger.history_facts(call, reads).await.unwrap()
}

/// A session awaiting tools with `n` recorded refund calls; returns (session id, call ids).
async fn calls(ledger: &Ledger, n: u32) -> (String, Vec<String>) {
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let s = ledger
        .create_session(phrony_ledger::NewSession {
            id: phrony_ledger::new_session_id(),
            agent_version_id: v.id,
            agent: phrony_ledger::AgentVersionRef::new("support", "refund-agent", "0.1.0"),
            input: json!({"message": "refunds"}),
            metadata: Default::default(),
            mode: phrony_ledger::SessionMode::Task,
            parent_session_id: None,
            limits: None,
            bundle_version_id: None,
            secrets: Vec::new(),
            actor: phrony_ledger::Attribution::unverified("alice".to_owned()),
        })
        .await
        .unwrap();
    ledger
        .set_session_status(&s.id, StatusChange::to(SessionStatus::AwaitingTool))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..n {
        let call = ledger
            .record_tool_call(NewToolCall {
                session_id: s.id.clone(),
                turn: 1,
                iteration: 0,
                index: i,
                tool: "payments.issue-refund".to_owned(),
                version: "1.0.0".to_owned(),
                wire_name: Some("issue_refund".to_owned()),
                args: json!({"order_id": "ORD-1", "amount": i}),
                side_effect_class: Some(SideEffectClass::NonIdempotentWrite),
                delegation: None,
            })
            .await
            .unwrap();
        ids.push(call.call_id);
    }
    (s.id, ids)
}

async fn succeed(ledger: &Ledger, call: &str, result: Value) {
    ledger.queue_tool_call(call).await.unwrap();
    ledger
        .dispatch_tool_call(
            call,
            Dispatch {
                worker_id: "worker-1".to_owned(),
                worker_identity: None,
                image_digest: None,
                descriptor_hash: None,
                deadline_at: None,
            },
        )
        .await
        .unwrap();
    ledger
        .record_tool_result(
            call,
            ToolResult {
                worker_id: Some("worker-1".to_owned()),
                outcome: ToolOutcome::Success(result),
                usage: None,
            },
        )
        .await
        .unwrap();
}

pub(crate) async fn history_reservations_commit_release_and_are_idempotent(db: &TestDb) {
    let ledger = db.migrated().await;
    let (session, ids) = calls(ledger, 6).await;
    let q = "issue_refund|everyone|order_id||sum|amount";
    let r = [read(q, "\"ORD-1\"")];

    // Nothing yet: no group row, version 0.
    assert_eq!(
        facts(ledger, &ids[0], &r).await[0],
        HistoryCounts::default()
    );

    // Reserve 40 for call 0: others see it (reserved counts for sums), it does not see itself.
    assert!(
        ledger
            .reserve_history(&session, &ids[0], &[reserve(q, "\"ORD-1\"", Some(40.0), 0)])
            .await
            .unwrap()
    );
    let seen = facts(ledger, &ids[1], &r).await[0];
    assert_eq!(
        (
            seen.count,
            seen.sum,
            seen.max,
            seen.committed,
            seen.last,
            seen.version
        ),
        (1, 40.0, Some(40.0), 0, None, 1)
    );
    let own = facts(ledger, &ids[0], &r).await[0];
    assert_eq!((own.count, own.sum, own.max), (0, 0.0, None));

    // Reserving again (a re-decide after a restart) is idempotent, whatever the version.
    assert!(
        ledger
            .reserve_history(&session, &ids[0], &[reserve(q, "\"ORD-1\"", Some(40.0), 0)])
            .await
            .unwrap()
    );
    assert_eq!(facts(ledger, &ids[1], &r).await[0].count, 1);

    // A stale version refuses the reservation and writes nothing.
    assert!(
        !ledger
            .reserve_history(&session, &ids[1], &[reserve(q, "\"ORD-1\"", Some(10.0), 0)])
            .await
            .unwrap()
    );
    assert_eq!(facts(ledger, &ids[2], &r).await[0].count, 1);

    // Call 0 succeeds: committed, with the result event.
    succeed(ledger, &ids[0], json!({"refund_id": "R-1"})).await;
    let seen = facts(ledger, &ids[1], &r).await[0];
    assert_eq!(
        (seen.count, seen.sum, seen.committed, seen.last),
        (1, 40.0, 1, Some(40.0))
    );

    // Call 1 is reserved, then fails: released with the failure.
    let v = seen.version;
    assert!(
        ledger
            .reserve_history(&session, &ids[1], &[reserve(q, "\"ORD-1\"", Some(25.5), v)])
            .await
            .unwrap()
    );
    assert_eq!(facts(ledger, &ids[2], &r).await[0].sum, 65.5);
    ledger
        .fail_tool_call(&ids[1], "worker_error", "bank down")
        .await
        .unwrap();
    let seen = facts(ledger, &ids[2], &r).await[0];
    assert_eq!((seen.count, seen.sum), (1, 40.0));

    // Call 2 is reserved (an approval opened), then denied: released.
    assert!(
        ledger
            .reserve_history(
                &session,
                &ids[2],
                &[reserve(q, "\"ORD-1\"", Some(7.0), seen.version)]
            )
            .await
            .unwrap()
    );
    ledger
        .deny_tool_call(&ids[2], "rejected by an approver", None)
        .await
        .unwrap();
    assert_eq!(facts(ledger, &ids[3], &r).await[0].sum, 40.0);

    // Call 3 has an indeterminate outcome: it stays reserved (counted) until resolved.
    let v = facts(ledger, &ids[3], &r).await[0].version;
    assert!(
        ledger
            .reserve_history(&session, &ids[3], &[reserve(q, "\"ORD-1\"", Some(5.0), v)])
            .await
            .unwrap()
    );
    ledger.queue_tool_call(&ids[3]).await.unwrap();
    ledger
        .dispatch_tool_call(
            &ids[3],
            Dispatch {
                worker_id: "w".into(),
                worker_identity: None,
                image_digest: None,
                descriptor_hash: None,
                deadline_at: None,
            },
        )
        .await
        .unwrap();
    ledger
        .mark_tool_call_indeterminate(&ids[3], "worker lost")
        .await
        .unwrap();
    let seen = facts(ledger, &ids[4], &r).await[0];
    assert_eq!((seen.count, seen.sum, seen.committed), (2, 45.0, 1));

    // A result-based amount (`of: result.total`) is known when the call succeeds.
    let lookup = "lookup_order|session|order_id||last|result.total";
    let lr = [read(lookup, "\"ORD-1\"")];
    assert!(
        ledger
            .reserve_history(
                &session,
                &ids[4],
                &[HistoryReservation {
                    result_path: Some("order.total".into()),
                    ..reserve(lookup, "\"ORD-1\"", None, 0)
                }]
            )
            .await
            .unwrap()
    );
    assert_eq!(
        facts(ledger, &ids[5], &lr).await[0].last,
        None,
        "a reserved lookup has no value yet"
    );
    succeed(ledger, &ids[4], json!({"order": {"total": "120.25"}})).await;
    let seen = facts(ledger, &ids[5], &lr).await[0];
    assert_eq!((seen.committed, seen.last), (1, Some(120.25)));

    // Cancelling a call releases its reservation.
    let v = facts(ledger, &ids[5], &r).await[0].version;
    assert!(
        ledger
            .reserve_history(&session, &ids[5], &[reserve(q, "\"ORD-1\"", Some(1.0), v)])
            .await
            .unwrap()
    );
    assert_eq!(facts(ledger, "other", &r).await[0].count, 3);
    ledger
        .cancel_tool_call(&ids[5], "session cancelled")
        .await
        .unwrap();
    let seen = facts(ledger, "other", &r).await[0];
    assert_eq!((seen.count, seen.sum), (2, 45.0));

    // Bad input is named.
    let err = ledger
        .reserve_history(&session, &ids[0], &[reserve(q, "g", Some(f64::NAN), 0)])
        .await
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::InvalidArgument { .. })
            && err.to_string().contains("not a finite number"),
        "{err}"
    );
    let err = ledger.history_facts("", &r).await.unwrap_err();
    assert!(err.to_string().contains("call_id is required"), "{err}");
    let many: Vec<HistoryRead> = (0..65).map(|i| read(q, &i.to_string())).collect();
    let err = ledger.history_facts("c", &many).await.unwrap_err();
    assert!(err.to_string().contains("at most 64"), "{err}");
}

pub(crate) async fn history_windows_are_exact_at_the_edges(db: &TestDb) {
    db.migrated().await;
    let t0 = Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap();
    let now = Arc::new(AtomicI64::new(t0.timestamp_micros()));
    let ledger = clocked(db, &now).await;
    // The same entries in a bucketed group (reserved with a window) and a scanned one.
    let q = "issue_refund|everyone|customer_id|86400|count|";
    let scanned = "issue_refund|everyone|customer_id||count|";
    for (i, offset) in [0_i64, 3_600_000_000, 7_200_000_000]
        .into_iter()
        .enumerate()
    {
        now.store(t0.timestamp_micros() + offset, Ordering::SeqCst);
        let v = ledger.history_facts("x", &[read(q, "c")]).await.unwrap()[0].version;
        assert!(
            ledger
                .reserve_history(
                    "s",
                    &format!("c{i}"),
                    &[HistoryReservation {
                        window_secs: Some(86_400),
                        ..reserve(q, "c", None, v)
                    }]
                )
                .await
                .unwrap()
        );
    }
    let window = |since: DateTime<Utc>| [window_read(q, "c", since)];
    // The window starts exactly at the first entry: all three; one microsecond later: two.
    assert_eq!(facts(&ledger, "x", &window(t0)).await[0].count, 3);
    assert_eq!(
        facts(&ledger, "x", &window(t0 + Duration::microseconds(1))).await[0].count,
        2
    );
    assert_eq!(
        facts(&ledger, "x", &window(t0 + Duration::hours(2))).await[0].count,
        1
    );
    assert_eq!(
        facts(
            &ledger,
            "x",
            &window(t0 + Duration::hours(2) + Duration::microseconds(1))
        )
        .await[0]
            .count,
        0
    );
    // The asking call is left out of a window too.
    assert_eq!(facts(&ledger, "c1", &window(t0)).await[0].count, 2);

    // Many entries across minute, hour and day boundaries, some committed, some released:
    // the buckets answer every window exactly as a scan of the entries does.
    let (session, ids) = calls(&ledger, 24).await;
    let t1 = t0 + Duration::days(1);
    let bucketed = "issue_refund|everyone|order_id|172800|sum|amount";
    let offsets: Vec<i64> = (0..24_i64)
        .map(|i| i * 7_919_000_000 + (i % 5) * 59_999_999 + i)
        .collect();
    for (i, (call, offset)) in ids.iter().zip(&offsets).enumerate() {
        now.store(t1.timestamp_micros() + offset, Ordering::SeqCst);
        let amount = Some(1.0 + f64::from(u32::try_from(i).unwrap()) * 0.5);
        for (query, window_secs) in [(bucketed, Some(172_800)), (scanned, None)] {
            let v = facts(&ledger, call, &[read(query, "o")]).await[0].version;
            assert!(
                ledger
                    .reserve_history(
                        &session,
                        call,
                        &[HistoryReservation {
                            window_secs,
                            ..reserve(query, "o", amount, v)
                        }]
                    )
                    .await
                    .unwrap()
            );
        }
        match i % 3 {
            0 => succeed(&ledger, call, json!({"ok": true})).await,
            1 => {
                ledger
                    .fail_tool_call(call, "worker_error", "no")
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
    // Around every entry, and around the minute, hour and day boundaries near them (`t1` is
    // on an hour; its day starts 12 h earlier).
    let mut probes: Vec<i64> = Vec::new();
    for offset in &offsets {
        for edge in [
            *offset,
            offset - offset.rem_euclid(60_000_000),
            offset - offset.rem_euclid(3_600_000_000),
            offset - (offset + 43_200_000_000).rem_euclid(86_400_000_000),
        ] {
            probes.extend([edge - 1, edge, edge + 1]);
        }
    }
    for (probe, asking) in probes.iter().zip(ids.iter().cycle()) {
        let since = t1 + Duration::microseconds(*probe);
        let got = facts(&ledger, asking, &[window_read(bucketed, "o", since)]).await[0];
        let want = facts(&ledger, asking, &[window_read(scanned, "o", since)]).await[0];
        assert_eq!(
            (got.count, got.sum, got.committed, got.max, got.last),
            (want.count, want.sum, want.committed, want.max, want.last),
            "window from {since} asked by {asking}"
        );
    }
    // The most reads one call may ask, windowed and not, bucketed and scanned, with groups
    // that have no row: one statement answers each as it is answered alone.
    let reads: Vec<HistoryRead> = (0..phrony_ledger::MAX_HISTORY_READS)
        .map(|i| {
            let since = t1 + Duration::microseconds(probes[i * 5 % probes.len()]);
            let query = if i % 2 == 0 { bucketed } else { scanned };
            match i % 4 {
                0 | 1 => window_read(query, "o", since),
                2 => read(query, "o"),
                _ => window_read(query, "absent", since),
            }
        })
        .collect();
    let together = facts(&ledger, &ids[3], &reads).await;
    assert_eq!(together.len(), reads.len());
    for (r, got) in reads.iter().zip(&together) {
        let alone = facts(&ledger, &ids[3], std::slice::from_ref(r)).await[0];
        assert_eq!(*got, alone, "{r:?}");
    }
}

pub(crate) async fn history_groups_from_before_buckets_read_their_entries(db: &TestDb) {
    db.migrated().await;
    let t0 = Utc.with_ymd_and_hms(2026, 3, 1, 8, 0, 30).unwrap();
    let now = Arc::new(AtomicI64::new(t0.timestamp_micros()));
    let ledger = clocked(db, &now).await;
    let (session, ids) = calls(&ledger, 2).await;
    let q = "issue_refund|everyone|customer_id|3600|sum|amount";
    // An entry written without a window (as before migration 0016: no buckets), then one with,
    // ten seconds later in the same minute.
    assert!(
        ledger
            .reserve_history(&session, &ids[0], &[reserve(q, "c", Some(5.0), 0)])
            .await
            .unwrap()
    );
    now.store(t0.timestamp_micros() + 10_000_000, Ordering::SeqCst);
    assert!(
        ledger
            .reserve_history(
                &session,
                &ids[1],
                &[HistoryReservation {
                    window_secs: Some(3_600),
                    ..reserve(q, "c", Some(7.0), 1)
                }]
            )
            .await
            .unwrap()
    );
    // A window from before the first bucketed entry reads the entries: both.
    let all = facts(&ledger, "x", &[window_read(q, "c", t0)]).await[0];
    assert_eq!((all.count, all.sum, all.max), (2, 12.0, Some(7.0)));
    // From the bucketed one on: the buckets, which the older entry is not in.
    let since = t0 + Duration::seconds(10);
    let recent = facts(&ledger, "x", &[window_read(q, "c", since)]).await[0];
    assert_eq!((recent.count, recent.sum), (1, 7.0));
    let from_next_minute = t0 + Duration::seconds(30);
    let none = facts(&ledger, "x", &[window_read(q, "c", from_next_minute)]).await[0];
    assert_eq!((none.count, none.sum), (0, 0.0));
    // Releasing the older entry moves no bucket; settling the newer one does.
    ledger
        .fail_tool_call(&ids[0], "worker_error", "no")
        .await
        .unwrap();
    let recent = facts(&ledger, "x", &[window_read(q, "c", since)]).await[0];
    assert_eq!((recent.count, recent.sum, recent.committed), (1, 7.0, 0));
    succeed(&ledger, &ids[1], json!({})).await;
    let recent = facts(&ledger, "x", &[window_read(q, "c", since)]).await[0];
    assert_eq!((recent.count, recent.sum, recent.committed), (1, 7.0, 1));
    let early = t0 - Duration::hours(2);
    let all = facts(&ledger, "x", &[window_read(q, "c", early)]).await[0];
    assert_eq!((all.count, all.sum, all.committed), (1, 7.0, 1));
}

pub(crate) async fn history_prune_keeps_what_a_window_sees_and_reserved_entries(db: &TestDb) {
    db.migrated().await;
    let t0 = Utc.with_ymd_and_hms(2026, 2, 1, 0, 0, 0).unwrap();
    let now = Arc::new(AtomicI64::new(t0.timestamp_micros()));
    let ledger = clocked(db, &now).await;
    let (session, ids) = calls(&ledger, 6).await;
    let q = "issue_refund|everyone|order_id|60|sum|amount";
    // Six entries a second apart: 0-3 committed, 4 in flight, 5 failed (released).
    for (i, call) in ids.iter().enumerate() {
        now.store(
            t0.timestamp_micros() + i64::try_from(i).unwrap() * 1_000_000,
            Ordering::SeqCst,
        );
        let v = facts(&ledger, call, &[read(q, "o")]).await[0].version;
        assert!(
            ledger
                .reserve_history(
                    &session,
                    call,
                    &[HistoryReservation {
                        window_secs: Some(60),
                        ..reserve(q, "o", Some(10.0), v)
                    }]
                )
                .await
                .unwrap()
        );
        match i {
            0..=3 => succeed(&ledger, call, json!({})).await,
            5 => {
                ledger
                    .fail_tool_call(call, "worker_error", "no")
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
    let err = ledger.prune_history(0).await.unwrap_err();
    assert!(matches!(err, LedgerError::InvalidArgument { .. }), "{err}");
    // Still inside the window (and its margin): nothing goes.
    now.store(
        (t0 + Duration::seconds(60 + phrony_ledger::HISTORY_PRUNE_MARGIN_SECS - 1))
            .timestamp_micros(),
        Ordering::SeqCst,
    );
    assert_eq!(
        ledger.prune_history(100).await.unwrap(),
        phrony_ledger::HistoryPruned::default()
    );
    // Past it: bounded batches take the committed entries and the buckets, never call 4's.
    now.store(
        (t0 + Duration::days(2)).timestamp_micros(),
        Ordering::SeqCst,
    );
    let mut pruned = phrony_ledger::HistoryPruned::default();
    loop {
        let batch = ledger.prune_history(2).await.unwrap();
        assert!(batch.entries <= 2 && batch.buckets <= 2, "{batch:?}");
        if batch == phrony_ledger::HistoryPruned::default() {
            break;
        }
        pruned.entries += batch.entries;
        pruned.buckets += batch.buckets;
    }
    // Four committed entries; six second buckets (the released call's is empty), one
    // minute, one hour and one day bucket.
    assert_eq!(
        pruned,
        phrony_ledger::HistoryPruned {
            entries: 4,
            buckets: 9,
            legacy_groups: 0,
            legacy_windows: 0
        }
    );
    // The in-flight entry was kept: it still settles (its group's version moves) and the
    // group's all-time counters keep every entry.
    let before = facts(&ledger, "x", &[read(q, "o")]).await[0];
    assert_eq!((before.count, before.committed), (5, 4));
    succeed(&ledger, &ids[4], json!({})).await;
    let after = facts(&ledger, "x", &[read(q, "o")]).await[0];
    assert_eq!((after.count, after.committed), (5, 5));
    assert_eq!(after.version, before.version + 1);
    // A window now sees nothing; the next prune takes the entry that just committed.
    let since = t0 + Duration::days(2) - Duration::seconds(60);
    assert_eq!(
        facts(&ledger, "x", &[window_read(q, "o", since)]).await[0].count,
        0
    );
    assert_eq!(
        ledger.prune_history(10).await.unwrap(),
        phrony_ledger::HistoryPruned {
            entries: 1,
            buckets: 0,
            legacy_groups: 0,
            legacy_windows: 0
        }
    );
}

/// Entries written before migration 0016 (no buckets, no `visible_until`) of a windowed group
/// are pruned once no window can see them (the group's first bucketed reservation plus its
/// window plus the margin); one still reserved is kept until it commits. (Groups not reserved
/// since: `history_prune_runs_drain_groups_from_before_buckets`.)
pub(crate) async fn history_prune_takes_entries_from_before_buckets(db: &TestDb) {
    db.migrated().await;
    let t0 = Utc.with_ymd_and_hms(2026, 4, 1, 0, 0, 0).unwrap();
    let now = Arc::new(AtomicI64::new(t0.timestamp_micros()));
    let ledger = clocked(db, &now).await;
    let (session, ids) = calls(&ledger, 4).await;
    let q = "issue_refund|everyone|customer_id|3600|sum|amount";
    let at = |secs: i64| {
        now.store(t0.timestamp_micros() + secs * 1_000_000, Ordering::SeqCst);
    };
    let reserve_at = async |call: &str, query: &str, window: Option<u64>| {
        let v = facts(&ledger, call, &[read(query, "c")]).await[0].version;
        assert!(
            ledger
                .reserve_history(
                    &session,
                    call,
                    &[HistoryReservation {
                        window_secs: window,
                        ..reserve(query, "c", Some(10.0), v)
                    }]
                )
                .await
                .unwrap()
        );
    };
    // Calls 0 (committed) and 1 (in flight): entries as before 0016, in both groups.
    for (i, call) in ids[..2].iter().enumerate() {
        at(i64::try_from(i).unwrap());
        reserve_at(call, q, None).await;
    }
    succeed(&ledger, &ids[0], json!({})).await;
    // Call 2 is the group's first bucketed reservation (10 min in), call 3 comes 2 h in.
    at(600);
    reserve_at(&ids[2], q, Some(3_600)).await;
    succeed(&ledger, &ids[2], json!({})).await;
    at(7_200);
    reserve_at(&ids[3], q, Some(3_600)).await;
    succeed(&ledger, &ids[3], json!({})).await;
    // A window from the first bucketed reservation still sees the old entries' time.
    let margin = phrony_ledger::HISTORY_PRUNE_MARGIN_SECS;
    at(600 + 3_600 + margin - 1);
    let pruned = ledger.prune_history(100).await.unwrap();
    assert_eq!((pruned.entries, pruned.legacy_groups), (0, 0), "{pruned:?}");
    // Past it: call 0's old entry and call 2's bucketed one go; call 1's (reserved), call 3's
    // (still visible) stay.
    at(600 + 3_600 + margin + 10);
    let pruned = ledger.prune_history(100).await.unwrap();
    assert_eq!((pruned.entries, pruned.legacy_groups), (2, 0), "{pruned:?}");
    assert_eq!(ledger.prune_history(100).await.unwrap().entries, 0);
    // Call 1 commits: its old entry goes at the next batch and the group is marked.
    succeed(&ledger, &ids[1], json!({})).await;
    let pruned = ledger.prune_history(100).await.unwrap();
    assert_eq!((pruned.entries, pruned.legacy_groups), (1, 1), "{pruned:?}");
    assert_eq!(
        ledger.prune_history(100).await.unwrap(),
        phrony_ledger::HistoryPruned::default()
    );
    // The counters keep every entry; a window now sees call 3 only, from the buckets.
    let all = facts(&ledger, "x", &[read(q, "c")]).await[0];
    assert_eq!((all.count, all.sum, all.committed), (4, 40.0, 4));
    let since = t0 + Duration::seconds(600 + 3_600 + margin + 10 - 3_600);
    let w = facts(&ledger, "x", &[window_read(q, "c", since)]).await[0];
    assert_eq!((w.count, w.sum, w.max), (1, 10.0, Some(10.0)));
}

/// Windowed groups from before migration 0016 that no reservation touched since (no
/// `window_secs`, no `bucketed_since`) get their window from their query key and their entries
/// pruned once it has passed since their last entry; unwindowed groups keep theirs. One run
/// (`Ledger::prune_history_run`) drains everything prunable in bounded batches, short ones
/// included, and stops at its batch bound (the next run goes on).
pub(crate) async fn history_prune_runs_drain_groups_from_before_buckets(db: &TestDb) {
    db.migrated().await;
    let t0 = Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 0).unwrap();
    let now = Arc::new(AtomicI64::new(t0.timestamp_micros()));
    let ledger = clocked(db, &now).await;
    let (session, ids) = calls(&ledger, 6).await;
    let windowed = "issue_refund|everyone|customer_id|3600|count|";
    let unwindowed = "issue_refund|everyone|customer_id||sum|amount";
    let at = |secs: i64| {
        now.store(t0.timestamp_micros() + secs * 1_000_000, Ordering::SeqCst);
    };
    let reserve_at = async |call: &str, query: &str, group: &str| {
        let v = facts(&ledger, call, &[read(query, group)]).await[0].version;
        let amount = Some(10.0);
        assert!(
            ledger
                .reserve_history(&session, call, &[reserve(query, group, amount, v)])
                .await
                .unwrap()
        );
    };
    // Six calls a second apart, as before 0016 (no window recorded): call i in group c(i % 3)
    // of the windowed query and in the one group of the unwindowed one; all but call 5 succeed.
    for (i, call) in ids.iter().enumerate() {
        at(i64::try_from(i).unwrap());
        reserve_at(call, windowed, &format!("c{}", i % 3)).await;
        reserve_at(call, unwindowed, "c").await;
    }
    for call in &ids[..5] {
        succeed(&ledger, call, json!({})).await;
    }
    let margin = phrony_ledger::HISTORY_PRUNE_MARGIN_SECS;
    let run =
        async |limit: u32, batches: u32| ledger.prune_history_run(limit, batches).await.unwrap();
    // Group c0's last entry (3 s) is still visible to a window: the windows are recorded, no
    // entry goes, and a window read still sees the entries.
    at(3 + 3_600 + margin);
    let pruned = run(1, 100).await;
    assert_eq!(
        (pruned.entries, pruned.legacy_groups, pruned.legacy_windows),
        (0, 0, 3),
        "{pruned:?}"
    );
    assert!(run(1, 100).await.is_empty());
    assert_eq!(
        facts(&ledger, "x", &[window_read(windowed, "c0", t0)]).await[0].count,
        2
    );
    // Past every group's window: a run of at most two batches of one takes two entries…
    at(5 + 3_600 + margin + 1);
    let pruned = run(1, 2).await;
    assert_eq!((pruned.entries, pruned.legacy_groups), (2, 0), "{pruned:?}");
    // …and the next run drains the rest, through batches that delete nothing but mark a group;
    // call 5, still in flight, keeps its entry and its group unmarked.
    let pruned = run(1, 100).await;
    assert_eq!(
        (pruned.entries, pruned.legacy_groups, pruned.legacy_windows),
        (3, 2, 0),
        "{pruned:?}"
    );
    assert!(run(500, 100).await.is_empty());
    assert_eq!(
        facts(&ledger, "x", &[window_read(windowed, "c2", t0)]).await[0].count,
        1
    );
    succeed(&ledger, &ids[5], json!({})).await;
    let pruned = run(500, 100).await;
    assert_eq!((pruned.entries, pruned.legacy_groups), (1, 1), "{pruned:?}");
    for group in ["c0", "c1", "c2"] {
        let w = facts(&ledger, "x", &[window_read(windowed, group, t0)]).await[0];
        assert_eq!(w.count, 0, "{group}");
    }
    // The unwindowed group keeps every entry, however late (its max reads them).
    at(400 * 86_400);
    assert!(run(500, 100).await.is_empty());
    let all = facts(&ledger, "x", &[read(unwindowed, "c")]).await[0];
    assert_eq!((all.count, all.sum, all.max), (6, 60.0, Some(10.0)));
}

/// A windowed `max` comes from the buckets' largest amounts (migration 0018): it follows
/// releases and a result that lowers the reserved amount, exactly as a scan of the entries,
/// and leaves the asking call's own amount out.
pub(crate) async fn history_window_max_follows_releases_and_results(db: &TestDb) {
    db.migrated().await;
    let t0 = Utc.with_ymd_and_hms(2026, 5, 1, 10, 0, 0).unwrap();
    let now = Arc::new(AtomicI64::new(t0.timestamp_micros()));
    let ledger = clocked(db, &now).await;
    let (session, ids) = calls(&ledger, 6).await;
    let bucketed = "issue_refund|everyone|order_id|86400|max|result.refunded";
    let scanned = "issue_refund|everyone|order_id||max|result.refunded";
    // Six calls in one second (one bucket of each width): amounts 60, 50, 40, 30, 20, 10.
    for (i, call) in ids.iter().enumerate() {
        let n = i64::try_from(i).unwrap();
        now.store(t0.timestamp_micros() + n * 1_000, Ordering::SeqCst);
        let amount = 60.0 - 10.0 * f64::from(u8::try_from(i).unwrap());
        for (query, window_secs) in [(bucketed, Some(86_400)), (scanned, None)] {
            let v = facts(&ledger, call, &[read(query, "o")]).await[0].version;
            assert!(
                ledger
                    .reserve_history(
                        &session,
                        call,
                        &[HistoryReservation {
                            result_path: Some("refunded".to_owned()),
                            window_secs,
                            ..reserve(query, "o", Some(amount), v)
                        }]
                    )
                    .await
                    .unwrap()
            );
        }
    }
    let since = t0 - Duration::hours(1);
    let check = async |asking: &str, want: Option<f64>| {
        let got = facts(&ledger, asking, &[window_read(bucketed, "o", since)]).await[0];
        let scan = facts(&ledger, asking, &[window_read(scanned, "o", since)]).await[0];
        assert_eq!(got.max, want, "asked by {asking}");
        assert_eq!(
            (got.max, got.count),
            (scan.max, scan.count),
            "asked by {asking}"
        );
    };
    check("x", Some(60.0)).await;
    // Call 0 fails: released, the top falls to 50.
    ledger
        .fail_tool_call(&ids[0], "worker_error", "no")
        .await
        .unwrap();
    check("x", Some(50.0)).await;
    // Call 1 succeeds refunding 5 (its result lowers its amount): 40.
    succeed(&ledger, &ids[1], json!({"refunded": 5})).await;
    check("x", Some(40.0)).await;
    // Call 5 succeeds refunding 99: raised.
    succeed(&ledger, &ids[5], json!({"refunded": 99})).await;
    check("x", Some(99.0)).await;
    // Asked by call 5 itself (decided again): its own amount is left out.
    check(&ids[5], Some(40.0)).await;
}

pub(crate) async fn concurrent_deciders_never_pass_a_cap_only_some_fit(db: &TestDb) {
    let ledger = db.migrated().await;
    // Two more connections pools: deciders on separate "replicas".
    let others = [db.another_ledger().await, db.another_ledger().await];
    let ledgers: Vec<Ledger> = std::iter::once(ledger.clone()).chain(others).collect();
    let q = "issue_refund|everyone|customer_id|86400|count|";
    let allowed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let ledger = ledgers[i % ledgers.len()].clone();
        let allowed = Arc::clone(&allowed);
        tasks.push(tokio::spawn(async move {
            let call = format!("call-{i}");
            for _attempt in 0..64 {
                let fact = ledger
                    .history_facts(
                        &call,
                        &[HistoryRead {
                            key: key(q, "cust-7"),
                            since: Some(Utc::now() - Duration::hours(24)),
                            max: false,
                            last: false,
                        }],
                    )
                    .await
                    .unwrap()[0];
                // The policy: at most 3 in the window, this call included.
                if fact.count + 1 > 3 {
                    return;
                }
                if ledger
                    .reserve_history(
                        "s",
                        &call,
                        &[HistoryReservation {
                            window_secs: Some(86_400),
                            ..reserve(q, "cust-7", None, fact.version)
                        }],
                    )
                    .await
                    .unwrap()
                {
                    allowed.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                tokio::task::yield_now().await;
            }
            panic!("{call}: no decision after 64 attempts");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(allowed.load(Ordering::SeqCst), 3);
    assert_eq!(facts(ledger, "x", &[read(q, "cust-7")]).await[0].count, 3);
}

/// A decision's lookup reads its own entry by the call id (the entries' primary key), never by
/// filtering its group for it, whatever the planner knows of the tables: on PostgreSQL, with
/// tables not analyzed yet (a database just filled, before autovacuum's first analyze), the old
/// join on the group's columns read the own entry through `history_entries_by_amount` and
/// filtered every entry of the group (2–7 ms instead of 0.03 ms for 10,000 entries). Once the
/// tables are analyzed, no node of the statement drops more than a few rows, whatever the
/// group's size.
pub(crate) async fn history_reads_do_not_scan_the_group_for_the_calls_own_entry(db: &TestDb) {
    const N: usize = 300;
    db.migrated().await;
    // A clock that stands still: the windowed group's entries fall in one bucket however long
    // the reservations take (a loaded machine once spread them over 16 buckets, and the
    // bucket read filtered 16 rows).
    let t0 = Utc::now();
    let now = Arc::new(AtomicI64::new(t0.timestamp_micros()));
    let ledger = &clocked(db, &now).await;
    let sum = "issue_refund|everyone|customer_id||sum|amount";
    let count = "issue_refund|everyone|customer_id|86400|count|";
    let since = t0 - Duration::hours(1);
    let reads = [
        HistoryRead {
            max: false,
            last: false,
            ..read(sum, "c")
        },
        HistoryRead {
            max: false,
            last: false,
            ..window_read(count, "c", since)
        },
    ];
    for i in 0..N {
        let call = format!("call-{i}");
        let versions = facts(ledger, &call, &reads).await;
        #[allow(clippy::cast_precision_loss, reason = "small amounts")]
        let reservations = [
            reserve(sum, "c", Some(i as f64), versions[0].version),
            HistoryReservation {
                window_secs: Some(86_400),
                ..reserve(count, "c", None, versions[1].version)
            },
        ];
        assert!(
            ledger
                .reserve_history("s", &call, &reservations)
                .await
                .unwrap()
        );
    }
    let postgres = db.kind == phrony_ledger::Backend::Postgres;
    for analyzed in [false, true] {
        if analyzed {
            if !postgres {
                break;
            }
            db.raw_exec("ANALYZE").await;
        }
        // A call with no entry yet (a first decision) and one with its own (decided again).
        for call in ["call-new", "call-7"] {
            let got = facts(ledger, call, &reads).await;
            let others = if call == "call-7" { N - 1 } else { N } as u64;
            assert_eq!((got[0].count, got[1].count), (others, others), "{call}");
            let plan = ledger.explain_history_facts(call, &reads).await.unwrap();
            let shown = plan.join("\n");
            if !postgres {
                let own = plan
                    .iter()
                    .filter(|l| l.starts_with("SEARCH e ") && l.contains("(call_id=?"))
                    .count();
                assert_eq!(
                    own,
                    reads.len(),
                    "{call}: own entry not read by key:\n{shown}"
                );
                let scans = ["SCAN history_", "SCAN e", "SCAN g"];
                let scanned = plan.iter().any(|l| scans.iter().any(|s| l.starts_with(s)));
                assert!(!scanned, "{call}: a table is scanned:\n{shown}");
                continue;
            }
            let own = plan
                .iter()
                .filter(|l| l.trim_start().starts_with("Index Cond: (call_id = "))
                .count();
            assert_eq!(
                own,
                reads.len(),
                "{call}: own entry not read by key:\n{shown}"
            );
            if analyzed {
                for line in &plan {
                    if let Some(n) = line.split("Rows Removed by Filter: ").nth(1) {
                        let n: usize = n.trim().parse().unwrap();
                        assert!(n < 10, "{call}: a plan node filters {n} rows:\n{shown}");
                    }
                }
            }
        }
    }
}
