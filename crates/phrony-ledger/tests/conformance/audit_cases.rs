//! Conformance cases for the audit: keyed chain heads, the start-up check and
//! `Ledger::verify_audit`, against an attacker who can write the database but not read the key.

use phrony_ledger::{
    AUDIT_STREAM, AuditKey, AuditKeyIntroduced, AuditProblemKind, AuditScope, AuditStart,
    EventBody, Ledger, NewEvent, ViolationKind, audit_event_types,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::harness::TestDb;
use crate::session_cases::{approve, deploy_agent, pending_approval, refund_agent, start};

fn key() -> AuditKey {
    AuditKey::from_bytes([42; 32])
}

async fn keyed(db: &TestDb) -> Ledger {
    db.migrated().await;
    Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(key())
}

async fn append_n(ledger: &Ledger, stream: &str, n: usize) {
    for i in 0..n {
        let e = NewEvent::new(
            "message.user",
            "user",
            json!({"role": "user", "content": format!("m{i}")}),
        );
        ledger.append_session_event(stream, e).await.unwrap();
    }
}

/// What an attacker with write access does: drop the triggers, edit event `seq`'s payload, and
/// recompute the hashes of it and every later event, and the `streams` head.
async fn rewrite_chain(db: &TestDb, ledger: &Ledger, stream: &str, seq: u64) {
    db.disable_append_only_guard().await;
    let mut events = ledger.list_events(stream, 0, 1000).await.unwrap();
    let mut prev = events[usize::try_from(seq).unwrap() - 2].hash.clone();
    for e in events.iter_mut().skip(usize::try_from(seq).unwrap() - 1) {
        if e.seq == seq {
            e.payload = json!({"content": "forged", "role": "user"});
        }
        e.prev_hash = prev.clone();
        e.hash = e.recompute_hash();
        db.raw_exec(&format!(
            "UPDATE events SET payload = '{}', prev_hash = '{}', hash = '{}' \
             WHERE stream = '{stream}' AND seq = {}",
            phrony_ledger::canonical_json(&e.payload),
            e.prev_hash,
            e.hash,
            e.seq
        ))
        .await;
        prev = e.hash.clone();
    }
    db.raw_exec(&format!(
        "UPDATE streams SET last_hash = '{prev}' WHERE stream = '{stream}'"
    ))
    .await;
}

pub(crate) async fn a_clean_log_verifies_with_the_exact_count(db: &TestDb) {
    let ledger = keyed(db).await;
    assert_eq!(
        ledger.start_audit(true).await.unwrap(),
        AuditStart::Sealed {
            streams: 0,
            events: 0
        }
    );
    let v = deploy_agent(&ledger, &refund_agent(), "1.0.0").await; // 2 events
    let (session, _call, approval) = pending_approval(&ledger, &v, |_| {}).await;
    ledger
        .cast_vote(approval.id, approve("alice"))
        .await
        .unwrap();
    append_n(&ledger, "run_plain", 3).await;
    let session_events = ledger
        .list_events(&session.id, 0, 1000)
        .await
        .unwrap()
        .len() as u64;

    let report = ledger.verify_audit(AuditScope::All).await.unwrap();
    assert_eq!(report.problem, None);
    // The audit stream holds the key introduction.
    assert_eq!(report.events, 2 + session_events + 3 + 1);
    assert_eq!(report.streams, 4);

    let one = ledger
        .verify_audit(AuditScope::Session(session.id.clone()))
        .await
        .unwrap();
    assert_eq!(
        (one.events, one.streams, one.problem),
        (session_events, 1, None)
    );
    let agent = ledger
        .verify_audit(AuditScope::Agent(refund_agent()))
        .await
        .unwrap();
    assert_eq!((agent.events, agent.streams, agent.problem), (2, 1, None));

    // A restart checks the heads and the triggers.
    let again = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(key());
    assert_eq!(
        again.start_audit(false).await.unwrap(),
        AuditStart::Verified { streams: 4 }
    );
    // Without a key, verification is refused rather than half done.
    assert!(matches!(
        db.ledger.verify_audit(AuditScope::All).await,
        Err(phrony_ledger::LedgerError::FailedPrecondition { .. })
    ));
}

pub(crate) async fn a_recomputed_chain_fails_the_sealed_head(db: &TestDb) {
    let ledger = keyed(db).await;
    ledger.start_audit(true).await.unwrap();
    append_n(&ledger, "run_victim", 4).await;
    append_n(&ledger, "run_bystander", 2).await;
    rewrite_chain(db, &ledger, "run_victim", 2).await;

    // The unkeyed check no longer sees anything.
    assert!(
        ledger
            .verify_stream("run_victim")
            .await
            .unwrap()
            .is_intact()
    );
    let report = ledger.verify_audit(AuditScope::All).await.unwrap();
    let p = report.problem.unwrap();
    assert_eq!(p.kind, AuditProblemKind::HeadMismatch, "{p:?}");
    assert_eq!(p.stream.as_deref(), Some("run_victim"));
    assert!(
        p.message
            .starts_with("stream run_victim: the sealed head is seq 4"),
        "{p}"
    );

    // The attacker also rewrites the sealed head's hash; without the key the MAC fails.
    let last = ledger
        .list_events("run_victim", 3, 1)
        .await
        .unwrap()
        .remove(0);
    db.raw_exec(&format!(
        "UPDATE chain_heads SET hash = '{}' WHERE stream = 'run_victim'",
        last.hash
    ))
    .await;
    let p = ledger
        .verify_audit(AuditScope::Session("run_victim".into()))
        .await
        .unwrap()
        .problem
        .unwrap();
    assert_eq!(
        (p.kind.clone(), p.seq),
        (AuditProblemKind::HeadMac, Some(4)),
        "{p:?}"
    );
    assert!(p.message.contains("MAC does not verify"), "{p}");

    // The start-up check refuses it (the triggers, dropped too, are reported first).
    let AuditStart::Failed(first) = ledger.start_audit(false).await.unwrap() else {
        panic!("a tampered log must fail the start-up check");
    };
    assert!(
        matches!(first.kind, AuditProblemKind::TriggerMissing { .. }),
        "{first:?}"
    );

    // The recovery override records itself, restores the triggers and re-seals.
    let event = ledger
        .allow_unverified_log(&first, "operator")
        .await
        .unwrap();
    assert_eq!(event.stream, AUDIT_STREAM);
    assert_eq!(event.event_type, audit_event_types::UNVERIFIED_LOG_ALLOWED);
    assert_eq!(event.payload["allowed_by"], "operator");
    assert_eq!(event.payload["triggers_restored"], true);
    assert!(matches!(
        ledger.start_audit(false).await.unwrap(),
        AuditStart::Verified { .. }
    ));
    assert!(
        db.raw_exec_err("UPDATE events SET actor = 'x' WHERE stream = 'run_victim'")
            .await
            .contains("append-only")
    );
}

pub(crate) async fn an_edited_vote_is_a_projection_difference(db: &TestDb) {
    let ledger = keyed(db).await;
    ledger.start_audit(true).await.unwrap();
    let v = deploy_agent(&ledger, &refund_agent(), "1.0.0").await;
    let (session, _call, approval) = pending_approval(&ledger, &v, |_| {}).await;
    ledger
        .cast_vote(approval.id, approve("alice"))
        .await
        .unwrap();
    assert_eq!(
        ledger.verify_audit(AuditScope::All).await.unwrap().problem,
        None
    );

    db.raw_exec("UPDATE approval_votes SET comment = 'approved after a call with the CFO'")
        .await;
    let report = ledger.verify_audit(AuditScope::All).await.unwrap();
    let p = report.problem.unwrap();
    assert_eq!(
        p.kind,
        AuditProblemKind::Projection {
            table: "approval_votes".into(),
            key: format!("approval_id={}, decided_by=alice", approval.id),
            column: Some("comment".into()),
        },
        "{p}"
    );
    assert!(
        p.message.contains(
            "stored \"approved after a call with the CFO\", the events say \"ok by alice\""
        ),
        "{p}"
    );
    // The same difference is found in the session's scope, not in the agent's.
    let scoped = ledger
        .verify_audit(AuditScope::Session(session.id.clone()))
        .await
        .unwrap();
    assert!(matches!(
        scoped.problem.unwrap().kind,
        AuditProblemKind::Projection { .. }
    ));
    assert_eq!(
        ledger
            .verify_audit(AuditScope::Agent(refund_agent()))
            .await
            .unwrap()
            .problem,
        None
    );
    // Verification changed nothing: the edited row is still there.
    let rows = db.raw_strings("SELECT comment FROM approval_votes").await;
    assert_eq!(
        rows,
        vec![vec![Some("approved after a call with the CFO".to_owned())]]
    );

    // A vote row no event produced.
    db.raw_exec("DELETE FROM approval_votes").await;
    let p = ledger
        .verify_audit(AuditScope::All)
        .await
        .unwrap()
        .problem
        .unwrap();
    assert!(
        p.message
            .contains("the events produce a row that is not stored"),
        "{p}"
    );
}

pub(crate) async fn a_dropped_trigger_alone_is_reported(db: &TestDb) {
    let ledger = keyed(db).await;
    ledger.start_audit(true).await.unwrap();
    append_n(&ledger, "run_t", 2).await;
    db.disable_append_only_guard().await;
    let p = ledger
        .verify_audit(AuditScope::All)
        .await
        .unwrap()
        .problem
        .unwrap();
    assert!(
        matches!(p.kind, AuditProblemKind::TriggerMissing { .. }),
        "{p:?}"
    );
    assert!(p.message.contains("append-only trigger"), "{p}");
    assert!(matches!(
        ledger.start_audit(false).await.unwrap(),
        AuditStart::Failed(_)
    ));
}

pub(crate) async fn an_existing_log_is_sealed_once_and_keyless_writes_are_caught(db: &TestDb) {
    // A log written before the audit key existed.
    let plain = db.migrated().await;
    append_n(plain, "run_old", 3).await;
    let ledger = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(key());
    // An existing key file never used with this log: refused, not silently trusted.
    let AuditStart::Failed(p) = ledger.start_audit(false).await.unwrap() else {
        panic!("an unsealed log with an old key must be refused");
    };
    assert_eq!(p.kind, AuditProblemKind::Unsealed);
    // A key created now seals it after verifying the chains, and records that.
    assert_eq!(
        ledger.start_audit(true).await.unwrap(),
        AuditStart::Sealed {
            streams: 1,
            events: 3
        }
    );
    let intro = ledger.list_events(AUDIT_STREAM, 0, 10).await.unwrap();
    assert_eq!(intro.len(), 1);
    assert_eq!(intro[0].event_type, audit_event_types::KEY_INTRODUCED);
    assert_eq!(intro[0].payload["key_id"], key().key_id());
    assert_eq!(intro[0].payload["heads"][0]["stream"], "run_old");
    assert_eq!(intro[0].payload["heads"][0]["seq"], 3);
    assert_eq!(
        ledger.verify_audit(AuditScope::All).await.unwrap().events,
        4
    );

    // Another key is named as such.
    let wrong = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(AuditKey::from_bytes([1; 32]));
    let AuditStart::Failed(p) = wrong.start_audit(true).await.unwrap() else {
        panic!("a different key must be refused");
    };
    assert!(
        matches!(p.kind, AuditProblemKind::KeyMismatch { .. }),
        "{p:?}"
    );

    // A process writing without the key leaves the sealed head behind.
    append_n(plain, "run_old", 1).await;
    let p = ledger
        .verify_audit(AuditScope::All)
        .await
        .unwrap()
        .problem
        .unwrap();
    assert_eq!(p.kind, AuditProblemKind::HeadMismatch, "{p:?}");
    assert_eq!(p.stream.as_deref(), Some("run_old"));

    // A broken chain is reported as the first bad event.
    let ledger2 = keyed(db).await;
    db.disable_append_only_guard().await;
    db.raw_exec("UPDATE events SET actor = 'mallory' WHERE stream = 'run_old' AND seq = 2")
        .await;
    let p = ledger2
        .verify_audit(AuditScope::All)
        .await
        .unwrap()
        .problem
        .unwrap();
    assert_eq!(
        (p.kind, p.stream.as_deref(), p.seq),
        (
            AuditProblemKind::Chain(ViolationKind::HashMismatch),
            Some("run_old"),
            Some(2)
        )
    );
    // Export pages through every event with its hashes.
    let first = ledger2.export_events(None, None, None, 2).await.unwrap();
    assert_eq!(first.len(), 2);
    let rest = ledger2
        .export_events(Some((&first[1].stream, first[1].seq)), None, None, 100)
        .await
        .unwrap();
    assert_eq!(first.len() + rest.len(), 5);
    let only = ledger2
        .export_events(None, None, Some("run_old"), 100)
        .await
        .unwrap();
    assert_eq!(only.len(), 4);
    assert!(only.iter().all(|e| e.hash.len() == 64));
}

/// The audit stream's events are typed (`EventBody::AuditKeyIntroduced`,
/// `EventBody::AuditUnverifiedLogAllowed`): each stored one decodes, re-encodes to its stored
/// payload byte for byte (so its hash is unchanged), and the log keeps verifying.
pub(crate) async fn audit_events_are_typed_and_the_log_still_verifies(db: &TestDb) {
    let ledger = keyed(db).await;
    // Written before the key existed (no sealed head), then sealed at the first start.
    append_n(&db.ledger, "run_before", 2).await;
    assert!(matches!(
        ledger.start_audit(true).await.unwrap(),
        AuditStart::Sealed { streams: 1, .. }
    ));
    db.raw_exec("DELETE FROM chain_heads WHERE stream = 'run_before'")
        .await;
    let AuditStart::Failed(problem) = ledger.start_audit(false).await.unwrap() else {
        panic!("a deleted head must fail the start-up check");
    };
    ledger
        .allow_unverified_log(&problem, "operator")
        .await
        .unwrap();

    let events = ledger.list_events(AUDIT_STREAM, 0, 100).await.unwrap();
    assert_eq!(events.len(), 3, "{events:#?}");
    for e in &events {
        let body = e.body().unwrap();
        assert_eq!(body.event_type(), e.event_type);
        assert_eq!(
            phrony_ledger::canonical_json(&body.payload().unwrap()),
            phrony_ledger::canonical_json(&e.payload),
            "seq {}",
            e.seq
        );
        assert_eq!(e.recompute_hash(), e.hash);
    }
    let EventBody::AuditKeyIntroduced(sealed) = events[0].body().unwrap() else {
        panic!("{:?}", events[0]);
    };
    assert_eq!(
        (sealed.key_id.as_str(), sealed.streams, sealed.events),
        (key().key_id().as_str(), 1, 2)
    );
    assert_eq!(sealed.heads[0].stream, "run_before");
    let EventBody::AuditUnverifiedLogAllowed(allowed) = events[1].body().unwrap() else {
        panic!("{:?}", events[1]);
    };
    assert_eq!(allowed.allowed_by, "operator");
    assert_eq!(allowed.stream.as_deref(), Some("run_before"));
    assert_eq!(allowed.kind, "HeadMissing");
    assert!(matches!(
        events[2].body().unwrap(),
        EventBody::AuditKeyIntroduced(AuditKeyIntroduced { ref reason, .. })
            if reason == "re-sealed after --allow-unverified-log"
    ));
    let report = ledger.verify_audit(AuditScope::All).await.unwrap();
    assert_eq!(report.problem, None);
}

/// The attacker deletes a whole session stream: its events (triggers dropped, then put back),
/// its `streams` row and its sealed head. Every remaining chain and head verifies, but the
/// sealed stream set still counts it: `verify_audit` names the problem and the start-up check
/// refuses the log. The stream set cannot be re-sealed without the key.
pub(crate) async fn a_stream_deleted_with_its_sealed_head_is_detected(db: &TestDb) {
    let ledger = keyed(db).await;
    ledger.start_audit(true).await.unwrap();
    append_n(&ledger, "run_victim", 3).await;
    append_n(&ledger, "run_bystander", 2).await;
    assert_eq!(
        ledger.verify_audit(AuditScope::All).await.unwrap().problem,
        None
    );

    delete_stream(db, "run_victim").await;

    let report = ledger.verify_audit(AuditScope::All).await.unwrap();
    let p = report.problem.expect("a deleted stream must be reported");
    // audit, run_bystander and run_victim were sealed; two are left.
    assert_eq!(
        p.kind,
        AuditProblemKind::StreamSetMismatch {
            sealed: 3,
            found: 2
        },
        "{p:?}"
    );
    assert!(
        p.message.contains("a whole stream was deleted"),
        "{}",
        p.message
    );
    let restarted = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(key());
    let AuditStart::Failed(at_start) = restarted.start_audit(false).await.unwrap() else {
        panic!("the daemon must refuse a log missing a stream");
    };
    assert_eq!(at_start.kind, p.kind);

    // The set's shard that holds run_victim names it.
    assert!(
        p.message
            .contains(&format!("in shard {}", shard_of("run_victim"))),
        "{}",
        p.message
    );

    // Forging the record without the key: the count fixed, the MAC cannot be.
    db.raw_exec(&format!(
        "UPDATE stream_set_shards SET streams = streams - 1 WHERE shard = {}",
        shard_of("run_victim")
    ))
    .await;
    let p = ledger
        .verify_audit(AuditScope::All)
        .await
        .unwrap()
        .problem
        .unwrap();
    assert_eq!(p.kind, AuditProblemKind::StreamSetMac, "{p:?}");
    // Deleting the record too: the log was sealed with one, so its absence is the problem.
    db.raw_exec("DELETE FROM stream_set_shards").await;
    let AuditStart::Failed(p) = restarted.start_audit(false).await.unwrap() else {
        panic!("a missing stream set must fail the start-up check");
    };
    assert_eq!(p.kind, AuditProblemKind::StreamSetMissing, "{p:?}");

    // The recorded override re-seals the set as it now is, and the log verifies again.
    restarted
        .allow_unverified_log(&p, "operator")
        .await
        .unwrap();
    assert_eq!(
        restarted
            .verify_audit(AuditScope::All)
            .await
            .unwrap()
            .problem,
        None
    );
    assert_eq!(
        restarted.start_audit(false).await.unwrap(),
        AuditStart::Verified { streams: 2 }
    );
}

/// The head MAC as the audit module documents it, computed with the key as an earlier build
/// (which had the key) would have written it.
fn head_mac(stream: &str, seq: u64, hash: &str) -> String {
    use hmac::{Hmac, Mac as _};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&[42; 32]).unwrap();
    mac.update(b"phrony.head.v1");
    mac.update(&(stream.len() as u64).to_be_bytes());
    mac.update(stream.as_bytes());
    mac.update(&seq.to_be_bytes());
    mac.update(hash.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// A log sealed by a build before the stream set (no `stream_set` row, no
/// `stream_set_sealed` in its `audit.key_introduced`) is not refused: the first start of this
/// build verifies every head and then seals the stream set, once, recorded in the audit stream;
/// from then on a deleted stream is caught.
pub(crate) async fn a_log_sealed_before_the_stream_set_gets_it_at_start(db: &TestDb) {
    let ledger = keyed(db).await;
    ledger.start_audit(true).await.unwrap();
    append_n(&ledger, "run_old", 2).await;
    // What the earlier build wrote: a key introduction without the flag, and no stream set.
    rewrite_key_introduction(db, &ledger, &["stream_set_sealed", "stream_set_shards"]).await;
    db.raw_exec("DELETE FROM stream_set_shards").await;
    assert_eq!(
        ledger.verify_audit(AuditScope::All).await.unwrap().problem,
        None,
        "a log sealed before the stream set verifies as it did"
    );

    let (upgraded, sealed) = start_after_upgrade(db, 2).await;
    assert!(sealed.stream_set_sealed);
    assert_eq!(sealed.stream_set_shards, 16);
    assert_eq!(sealed.reason, "sealed the stream set (migration 0007)");

    delete_stream(db, "run_old").await;
    let p = upgraded
        .verify_audit(AuditScope::All)
        .await
        .unwrap()
        .problem
        .unwrap();
    assert_eq!(
        p.kind,
        AuditProblemKind::StreamSetMismatch {
            sealed: 2,
            found: 1
        }
    );
    // The key introduction listed run_old's head, so the message names it.
    assert_eq!(p.stream.as_deref(), Some("run_old"), "{p:?}");
}

/// Starts a new ledger on a log an earlier build sealed: the start-up check verifies `streams`
/// streams and records one more key introduction, returned; once only (the next start verifies
/// and writes nothing).
async fn start_after_upgrade(db: &TestDb, streams: u64) -> (Ledger, AuditKeyIntroduced) {
    let upgraded = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(key());
    assert_eq!(
        upgraded.start_audit(false).await.unwrap(),
        AuditStart::Verified { streams }
    );
    let audit = upgraded.list_events(AUDIT_STREAM, 0, 10).await.unwrap();
    assert_eq!(audit.len(), 2, "{audit:#?}");
    let EventBody::AuditKeyIntroduced(sealed) = audit[1].body().unwrap() else {
        panic!("{:?}", audit[1]);
    };
    assert_eq!(
        upgraded.start_audit(false).await.unwrap(),
        AuditStart::Verified { streams }
    );
    let again = upgraded.list_events(AUDIT_STREAM, 0, 10).await.unwrap();
    assert_eq!(again.len(), 2, "{again:#?}");
    (upgraded, sealed)
}

/// What an attacker with write access does to remove a whole stream: its events (triggers
/// dropped, then put back), its `streams` row and its sealed head.
async fn delete_stream(db: &TestDb, stream: &str) {
    db.disable_append_only_guard().await;
    for table in ["events", "streams", "chain_heads"] {
        db.raw_exec(&format!("DELETE FROM {table} WHERE stream = '{stream}'"))
            .await;
    }
    db.restore_append_only_guard().await;
}

/// The shard of the stream set a stream belongs to, as migration 0024 documents it.
fn shard_of(stream: &str) -> usize {
    use sha2::Digest as _;
    usize::from(sha2::Sha256::digest(stream.as_bytes())[0]) % 16
}

/// What an earlier build wrote: the first `audit.key_introduced` without `fields` (its hash,
/// the audit stream's head and its sealed head recomputed with the key, as that build had it).
async fn rewrite_key_introduction(db: &TestDb, ledger: &Ledger, fields: &[&str]) {
    let mut introduced = ledger.list_events(AUDIT_STREAM, 0, 10).await.unwrap();
    assert_eq!(introduced.len(), 1);
    let old = &mut introduced[0];
    assert_eq!(old.payload["stream_set_sealed"], json!(true));
    assert_eq!(old.payload["stream_set_shards"], json!(16));
    for field in fields {
        old.payload.as_object_mut().unwrap().remove(*field);
    }
    old.hash = old.recompute_hash();
    db.disable_append_only_guard().await;
    db.raw_exec(&format!(
        "UPDATE events SET payload = '{}', hash = '{}' WHERE stream = 'audit' AND seq = 1",
        phrony_ledger::canonical_json(&old.payload),
        old.hash
    ))
    .await;
    db.restore_append_only_guard().await;
    db.raw_exec(&format!(
        "UPDATE streams SET last_hash = '{}' WHERE stream = 'audit'",
        old.hash
    ))
    .await;
    db.raw_exec(&format!(
        "UPDATE chain_heads SET hash = '{}', mac = '{}' WHERE stream = 'audit'",
        old.hash,
        head_mac("audit", 1, &old.hash)
    ))
    .await;
}

/// The single-row stream set of a build before migration 0024 (`stream_set`, MAC
/// `phrony.stream-set.v1`) for `streams`, written with the key as that build had it.
async fn write_single_row_set(db: &TestDb, streams: &[&str]) {
    use hmac::{Hmac, Mac as _};
    use sha2::Digest as _;
    let mut digest = [0_u8; 32];
    for stream in streams {
        for (d, h) in digest
            .iter_mut()
            .zip(sha2::Sha256::digest(stream.as_bytes()))
        {
            *d ^= h;
        }
    }
    let (count, digest) = (streams.len() as i64, hex::encode(digest));
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&[42; 32]).unwrap();
    mac.update(b"phrony.stream-set.v1");
    mac.update(&count.to_be_bytes());
    mac.update(digest.as_bytes());
    let mac = hex::encode(mac.finalize().into_bytes());
    db.raw_exec("DELETE FROM stream_set").await;
    db.raw_exec(&format!(
        "INSERT INTO stream_set (id, streams, digest, mac) VALUES (1, {count}, '{digest}', '{mac}')"
    ))
    .await;
}

async fn count_rows(db: &TestDb, table: &str) -> usize {
    db.raw_strings(&format!("SELECT CAST(COUNT(*) AS TEXT) FROM {table}"))
        .await[0][0]
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// A log sealed by a build before migration 0024 (its stream set in one `stream_set` row, no
/// `stream_set_shards` in its `audit.key_introduced`) verifies as it is; a stream created before
/// the daemon's start-up check extends that row; the start-up check verifies it against the log
/// and writes it in shards, once, recorded; the old row replayed later is not accepted.
pub(crate) async fn a_log_sealed_in_one_row_gets_its_stream_set_sharded_at_start(db: &TestDb) {
    let ledger = keyed(db).await;
    ledger.start_audit(true).await.unwrap();
    append_n(&ledger, "run_old", 2).await;
    rewrite_key_introduction(db, &ledger, &["stream_set_shards"]).await;
    db.raw_exec("DELETE FROM stream_set_shards").await;
    write_single_row_set(db, &["audit", "run_old"]).await;
    assert_eq!(
        ledger.verify_audit(AuditScope::All).await.unwrap().problem,
        None,
        "a log sealed in one row verifies as it did"
    );
    // Written before the start-up check ran: extends the single row.
    append_n(&ledger, "run_between", 1).await;
    assert_eq!(
        ledger.verify_audit(AuditScope::All).await.unwrap().problem,
        None
    );
    assert_eq!(count_rows(db, "stream_set_shards").await, 0);

    let (upgraded, sealed) = start_after_upgrade(db, 3).await;
    assert_eq!(sealed.reason, "sharded the stream set (migration 0024)");
    assert_eq!(sealed.stream_set_shards, 16);
    assert_eq!(count_rows(db, "stream_set").await, 0);
    assert_eq!(count_rows(db, "stream_set_shards").await, 16);
    append_n(&upgraded, "run_new", 1).await;
    assert_eq!(
        upgraded
            .verify_audit(AuditScope::All)
            .await
            .unwrap()
            .problem,
        None
    );

    // The old row, replayed from a copy of the database, with run_new deleted and the shards
    // removed: the log was sealed in shards since, so the row does not stand in for them.
    delete_stream(db, "run_new").await;
    db.raw_exec("DELETE FROM stream_set_shards").await;
    write_single_row_set(db, &["audit", "run_old", "run_between"]).await;
    let AuditStart::Failed(p) = upgraded.start_audit(false).await.unwrap() else {
        panic!("a replayed single-row set must not pass for the shards");
    };
    assert_eq!(p.kind, AuditProblemKind::StreamSetMissing, "{p:?}");
}

/// Each shard of the stream set is MACed with its number: a shard's row moved to another
/// shard, or gone, fails the audit, naming the shard.
pub(crate) async fn a_moved_or_deleted_stream_set_shard_is_detected(db: &TestDb) {
    let ledger = keyed(db).await;
    ledger.start_audit(true).await.unwrap();
    for i in 0..40 {
        append_n(&ledger, &format!("run_{i}"), 1).await;
    }
    assert_eq!(
        ledger.verify_audit(AuditScope::All).await.unwrap().problem,
        None
    );
    let shards = db
        .raw_strings(
            "SELECT CAST(shard AS TEXT) AS n, CAST(streams AS TEXT) AS c, digest, mac \
             FROM stream_set_shards ORDER BY shard",
        )
        .await;
    assert_eq!(shards.len(), 16);
    let counts: i64 = shards
        .iter()
        .map(|r| r[1].as_deref().unwrap().parse::<i64>().unwrap())
        .sum();
    assert_eq!(counts, 41, "40 runs and the audit stream");
    // Shard `from`'s row (count, digest and MAC) written over shard 5's.
    let put_into_five = |from: usize| {
        let row = &shards[from];
        assert_eq!(row[0].as_deref(), Some(from.to_string().as_str()));
        format!(
            "UPDATE stream_set_shards SET streams = {}, digest = '{}', mac = '{}' WHERE shard = 5",
            row[1].as_deref().unwrap(),
            row[2].as_deref().unwrap(),
            row[3].as_deref().unwrap()
        )
    };
    db.raw_exec(&put_into_five(3)).await;
    let p = ledger
        .verify_audit(AuditScope::All)
        .await
        .unwrap()
        .problem
        .unwrap();
    assert_eq!(p.kind, AuditProblemKind::StreamSetMac, "{p:?}");
    assert!(p.message.starts_with("shard 5 "), "{}", p.message);
    db.raw_exec(&put_into_five(5)).await;
    assert_eq!(
        ledger.verify_audit(AuditScope::All).await.unwrap().problem,
        None
    );
    // One shard gone.
    db.raw_exec("DELETE FROM stream_set_shards WHERE shard = 11")
        .await;
    let AuditStart::Failed(p) = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(key())
        .start_audit(false)
        .await
        .unwrap()
    else {
        panic!("a missing shard must fail the start-up check");
    };
    assert_eq!(p.kind, AuditProblemKind::StreamSetMissing, "{p:?}");
    assert!(p.message.starts_with("shard 11 "), "{}", p.message);
}

pub(crate) async fn a_batch_append_seals_its_head_and_joins_the_stream_set(db: &TestDb) {
    let ledger = keyed(db).await;
    ledger.start_audit(true).await.unwrap();
    let events = |n: usize| -> Vec<NewEvent> {
        (0..n)
            .map(|i| NewEvent::new("gate.decision", "agent", json!({"i": i})))
            .collect()
    };
    // Batches that create their streams, then one that extends a stream.
    ledger
        .append_session_events("gate-org_a", events(3))
        .await
        .unwrap();
    ledger
        .append_session_events("gate-org_b", events(1))
        .await
        .unwrap();
    ledger
        .append_session_events("gate-org_a", events(2))
        .await
        .unwrap();

    let report = ledger.verify_audit(AuditScope::All).await.unwrap();
    assert_eq!(report.problem, None);
    // The audit stream holds the key introduction.
    assert_eq!((report.events, report.streams), (1 + 5 + 1, 3));
    let again = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(key());
    assert_eq!(
        again.start_audit(false).await.unwrap(),
        AuditStart::Verified { streams: 3 }
    );

    // The head a batch sealed is what a rewrite of its chain is checked against.
    rewrite_chain(db, &ledger, "gate-org_a", 2).await;
    let p = ledger
        .verify_audit(AuditScope::All)
        .await
        .unwrap()
        .problem
        .unwrap();
    assert_eq!(p.kind, AuditProblemKind::HeadMismatch, "{p:?}");
    assert_eq!(p.stream.as_deref(), Some("gate-org_a"));
}

/// The sealed head of a stream a write appended to several times (a model step: its
/// completion, the status change and each requested call) is the write's last head, and a
/// write that is refused after its appends leaves the seal as it was.
pub(crate) async fn a_write_of_several_appends_seals_its_last_head(db: &TestDb) {
    use phrony_ledger::{SessionStatus, StatusChange};

    use crate::session_cases::{completion_event, refund_call};

    let ledger = keyed(db).await;
    ledger.start_audit(true).await.unwrap();
    let v = deploy_agent(&ledger, &refund_agent(), "0.1.0").await;
    let s = start(&ledger, &v).await;
    let sealed = |id: String| async move {
        let row = db
            .raw_strings(&format!(
                "SELECT CAST(h.seq AS TEXT), CAST(s.last_seq AS TEXT),                  CAST(h.hash = s.last_hash AS TEXT)                  FROM chain_heads h JOIN streams s ON s.stream = h.stream                  WHERE h.stream = '{id}'"
            ))
            .await;
        row[0].clone()
    };
    ledger
        .record_step(
            &s.id,
            completion_event(0, "tool_use", Vec::new()),
            None,
            Some(StatusChange::to(SessionStatus::AwaitingTool).from(SessionStatus::Running)),
            vec![refund_call(&s.id, 0, 0, 100), refund_call(&s.id, 0, 1, 50)],
        )
        .await
        .unwrap();
    let after_step = sealed(s.id.clone()).await;
    let last = ledger
        .events_after(&s.id, 0, 100)
        .await
        .unwrap()
        .len()
        .to_string();
    assert_eq!(
        after_step[0].as_deref(),
        Some(last.as_str()),
        "{after_step:?}"
    );
    assert_eq!(after_step[0], after_step[1], "sealed at the stream's head");
    assert!(
        matches!(after_step[2].as_deref(), Some("1" | "true")),
        "{after_step:?}"
    );
    // Refused after its completion was appended: nothing of it stays, the seal included.
    let refused = ledger
        .record_step(
            &s.id,
            completion_event(1, "tool_use", Vec::new()),
            None,
            Some(StatusChange::to(SessionStatus::AwaitingTool).from(SessionStatus::Running)),
            vec![],
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(sealed(s.id.clone()).await, after_step);
    let report = ledger.verify_audit(AuditScope::All).await.unwrap();
    assert_eq!(report.problem, None);
}

/// An audit check beside live writers (another replica creating sessions and appending to
/// them) reads one consistent state of the log: `verify_audit(All)` and the start-up check
/// report no problem that is not there (a stream created, or an event appended, between two
/// of the check's reads is in both or in neither).
pub(crate) async fn audit_checks_beside_live_writers_report_no_false_problem(db: &TestDb) {
    let writer = keyed(db).await;
    writer.start_audit(true).await.unwrap();
    let v = deploy_agent(&writer, &refund_agent(), "0.1.0").await;
    let checker = Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(key());
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let task = {
        let (writer, stop, written) = (writer.clone(), stop.clone(), written.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..2_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                ids.push(start(&writer, &v).await.id);
                append_n(&writer, &ids[i / 2], 1).await;
                written.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let mut seen = 0;
    for check in 0..8 {
        // The writer is running (it wrote since the last check), so writes its next ones
        // while this check reads.
        while written.load(Ordering::SeqCst) == seen {
            assert!(!task.is_finished(), "the writer ended before check {check}");
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        seen = written.load(Ordering::SeqCst);
        let report = checker.verify_audit(AuditScope::All).await.unwrap();
        assert_eq!(report.problem, None, "verify_audit, check {check}");
        let started = checker.start_audit(false).await.unwrap();
        assert!(
            matches!(started, AuditStart::Verified { .. }),
            "start-up check {check}: {started:?}"
        );
    }
    stop.store(true, Ordering::SeqCst);
    task.await.unwrap();
    assert_eq!(
        checker.verify_audit(AuditScope::All).await.unwrap().problem,
        None
    );
}

/// Replicas that start at once seal a log once, beside writes from another replica: two fresh
/// replicas on an empty database introduce the key once; two upgraded replicas shard a
/// single-row stream set once while streams are created and appended to; every stream created
/// meanwhile is in the set and every sealed head is its stream's latest (a later start and a
/// full verification pass).
pub(crate) async fn replicas_starting_at_once_seal_the_log_once_beside_writers(db: &TestDb) {
    db.migrated().await;
    let connect = || async {
        Ledger::connect(&db.url)
            .await
            .unwrap()
            .with_audit_key(key())
    };
    let (a, b) = (connect().await, connect().await);
    let (first, second) = tokio::join!(a.start_audit(true), b.start_audit(true));
    let mut outcomes = [first.unwrap(), second.unwrap()];
    outcomes.sort_by_key(|o| format!("{o:?}"));
    assert!(
        matches!(
            outcomes,
            [AuditStart::Sealed { .. }, AuditStart::Verified { .. }]
        ),
        "one replica seals, the other verifies: {outcomes:?}"
    );
    let introduced = a.list_events(AUDIT_STREAM, 0, 10).await.unwrap();
    assert_eq!(introduced.len(), 1, "{introduced:#?}");

    // The log as a build before migration 0024 left it: its stream set in one row.
    for i in 0..5 {
        append_n(&a, &format!("run_{i}"), 2).await;
    }
    rewrite_key_introduction(db, &a, &["stream_set_shards"]).await;
    db.raw_exec("DELETE FROM stream_set_shards").await;
    write_single_row_set(db, &["audit", "run_0", "run_1", "run_2", "run_3", "run_4"]).await;

    let writer = connect().await;
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let task = {
        let (writer, stop, written) = (writer.clone(), stop.clone(), written.clone());
        tokio::spawn(async move {
            for i in 0..2_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                append_n(&writer, &format!("new_{i}"), 1).await;
                append_n(&writer, &format!("run_{}", i % 5), 1).await;
                written.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    while written.load(Ordering::SeqCst) < 3 {
        assert!(
            !task.is_finished(),
            "the writer ended before the replicas started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let (c, d) = (connect().await, connect().await);
    let (first, second) = tokio::join!(c.start_audit(false), d.start_audit(false));
    for started in [first.unwrap(), second.unwrap()] {
        assert!(
            matches!(started, AuditStart::Verified { .. }),
            "an upgraded replica starts: {started:?}"
        );
    }
    let seen = written.load(Ordering::SeqCst);
    while written.load(Ordering::SeqCst) < seen + 3 {
        assert!(
            !task.is_finished(),
            "the writer ended after the replicas started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    stop.store(true, Ordering::SeqCst);
    task.await.unwrap();

    let sharded: Vec<AuditKeyIntroduced> = a
        .list_events(AUDIT_STREAM, 0, 10)
        .await
        .unwrap()
        .iter()
        .filter_map(|e| match e.body().unwrap() {
            EventBody::AuditKeyIntroduced(k) => Some(k),
            _ => None,
        })
        .skip(1)
        .collect();
    assert_eq!(sharded.len(), 1, "sharded once: {sharded:#?}");
    assert_eq!(sharded[0].reason, "sharded the stream set (migration 0024)");
    assert_eq!(count_rows(db, "stream_set").await, 0);
    let later = connect().await;
    assert!(
        matches!(
            later.start_audit(false).await.unwrap(),
            AuditStart::Verified { .. }
        ),
        "the log verifies after the replicas sealed it beside the writer"
    );
    assert_eq!(
        later.verify_audit(AuditScope::All).await.unwrap().problem,
        None
    );
}

/// A full verification waits for no write: it reads a snapshot and re-folds into temporary
/// tables, so it completes while another connection holds a write transaction open on the
/// projections (the database write lock on SQLite, a session row and the table's write lock
/// on PostgreSQL), and that write's uncommitted change is not a problem.
pub(crate) async fn a_verification_completes_beside_an_open_write(db: &TestDb) {
    use sqlx::Connection as _;
    use sqlx::Executor as _;
    let ledger = keyed(db).await;
    ledger.start_audit(true).await.unwrap();
    let v = deploy_agent(&ledger, &refund_agent(), "0.1.0").await;
    let session = start(&ledger, &v).await;
    // An ended session too: its end's re-fold purges what the session held (secrets, queued
    // user messages), which must reach only the temporary shadows.
    let ended = start(&ledger, &v).await;
    crate::session_cases::to(&ledger, &ended.id, phrony_ledger::SessionStatus::Completed).await;
    let hold = format!(
        "UPDATE sessions SET updated_at = updated_at WHERE id = '{}'",
        session.id
    );
    let verify = || async {
        tokio::time::timeout(
            std::time::Duration::from_secs(60),
            ledger.verify_audit(AuditScope::All),
        )
        .await
        .expect("the verification waits for no write")
        .unwrap()
        .problem
    };
    match db.kind {
        phrony_ledger::Backend::Sqlite => {
            let mut open = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            open.execute("BEGIN IMMEDIATE").await.unwrap();
            open.execute(hold.as_str()).await.unwrap();
            assert_eq!(verify().await, None);
            open.execute("ROLLBACK").await.unwrap();
        }
        phrony_ledger::Backend::Postgres => {
            let mut open = sqlx::PgConnection::connect(&db.url).await.unwrap();
            open.execute("BEGIN").await.unwrap();
            open.execute(hold.as_str()).await.unwrap();
            assert_eq!(verify().await, None);
            open.execute("ROLLBACK").await.unwrap();
        }
    }
    assert_eq!(verify().await, None);
}

/// Verifications between writes on the same pooled connection: the re-fold's temporary shadows
/// are what its statements read and write, whatever the connection prepared before (PostgreSQL
/// does not re-resolve a prepared statement's table when a temporary table of the same name is
/// created in a session that already had temporary tables: the second verification's re-fold
/// would run the writes' prepared statements against the real tables).
pub(crate) async fn repeated_verifications_between_writes_fold_into_their_shadows(db: &TestDb) {
    db.migrated().await;
    let one_connection = phrony_ledger::LedgerOptions {
        max_connections: 1,
        ..phrony_ledger::LedgerOptions::default()
    };
    let ledger = Ledger::connect_with(&db.url, one_connection)
        .await
        .unwrap()
        .with_audit_key(key());
    ledger.start_audit(true).await.unwrap();
    let v = deploy_agent(&ledger, &refund_agent(), "0.1.0").await;
    for round in 0..3 {
        let session = start(&ledger, &v).await;
        append_n(&ledger, &session.id, 1).await;
        crate::session_cases::to(
            &ledger,
            &session.id,
            phrony_ledger::SessionStatus::Completed,
        )
        .await;
        assert_eq!(
            ledger.verify_audit(AuditScope::All).await.unwrap().problem,
            None,
            "round {round}"
        );
    }
}
