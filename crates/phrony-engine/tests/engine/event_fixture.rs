//! Compatibility of the stored event log: a SQLite database recorded by an earlier build
//! (`tests/fixtures/events-v1/`) is read by this build: every hash chain verifies, the
//! projections rebuild, and the inspect output of every session is identical to the one saved
//! when the database was recorded.
//!
//! Re-record (only when the stored format changes on purpose, with a new fixture directory):
//! `cargo test -p phrony-engine --test engine -- --ignored record_the_fixture`.
#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use phrony_engine::{EngineConfig, LedgerStore};
use phrony_ledger::{
    AgentRef, Ledger, LedgerOptions, NewAgentVersion, ReviewResolution, SecretCipher,
    SessionStatus, Vote,
};
use serde_json::json;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/events-v1")
}

async fn open(path: &Path) -> Ledger {
    let options = LedgerOptions {
        acquire_timeout: Duration::from_secs(60),
        ..LedgerOptions::default()
    };
    let ledger = Ledger::connect_with(&format!("sqlite://{}", path.display()), options)
        .await
        .unwrap();
    ledger.migrate().await.unwrap();
    ledger
}

fn published(agent: &phrony_manifest::CompiledAgent, version: &str) -> NewAgentVersion {
    NewAgentVersion {
        namespace: "support".into(),
        name: "refund-agent".into(),
        version: version.into(),
        owner: "payments-team".into(),
        labels: [("tier".to_owned(), "gold".to_owned())].into(),
        snapshot_json: String::from_utf8(agent.snapshot_json()).unwrap(),
        content_hash: agent.content_hash(),
        actor: "emad".into(),
    }
}

/// Every stream's events, one line each: stream, seq, type, actor, turn, call id, payload.
/// Every event must decode into the event schema, and re-encode to its stored payload.
async fn event_lines(ledger: &Ledger) -> String {
    let mut out = String::new();
    for report in ledger.verify_all_streams().await.unwrap() {
        let mut after = 0;
        loop {
            let page = ledger
                .list_events(&report.stream, after, 1000)
                .await
                .unwrap();
            let Some(last) = page.last() else { break };
            after = last.seq;
            for e in page {
                let body = match e.body() {
                    Ok(body) => body,
                    Err(err) => panic!("{err}"),
                };
                assert_eq!(body.event_type(), e.event_type);
                assert_eq!(
                    body.payload().unwrap(),
                    e.payload,
                    "{} seq {}",
                    e.stream,
                    e.seq
                );
                writeln!(
                    out,
                    "{} {} {} actor={} turn={:?} call={:?} {}",
                    e.stream, e.seq, e.event_type, e.actor, e.turn, e.call_id, e.payload
                )
                .unwrap();
            }
        }
    }
    out
}

/// The inspect output of every session, in the order of `ids`.
async fn inspect_text(ledger: &Ledger, ids: &[String]) -> String {
    let mut out = String::new();
    for id in ids {
        let timeline = ledger.session_timeline(id).await.unwrap();
        let inspection = phrony_engine::inspect(timeline).unwrap();
        writeln!(out, "=== {id}\n{inspection:#?}").unwrap();
    }
    out
}

/// Records the fixture with this build. Ignored: it rewrites files under `tests/fixtures`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the fixture database; run by hand when recording a new fixture"]
#[allow(
    clippy::too_many_lines,
    reason = "the recording script: one scenario after another, read top to bottom"
)]
async fn record_the_fixture() {
    let dir = fixture_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let work = tempfile::tempdir().unwrap();
    let db = work.path().join("phrony.db");
    let ledger = open(&db).await;
    let agent = refund_agent(&AgentOptions::default());
    let v1 = ledger
        .publish_agent_version(published(&agent, "0.1.0"))
        .await
        .unwrap();
    let agent_ref = AgentRef::new("support", "refund-agent");
    ledger
        .deploy(
            &agent_ref,
            "0.1.0",
            &phrony_ledger::Attribution::unverified("emad"),
        )
        .await
        .unwrap();
    let store = Arc::new(LedgerStore::new(
        ledger.clone(),
        Some(SecretCipher::new(&[7u8; 32])),
    ));
    let clock = Arc::new(phrony_engine::ManualClock::starting_now());
    let config = EngineConfig {
        exec_timeout: Duration::from_millis(300),
        ..test_config()
    };
    let script = Script::new(vec![
        // 1: allowed calls, with a principal.
        Step::call("lookup_order", json!({"order_id": "ORD-1"})),
        Step::call("issue_refund", refund("ORD-1", 100.0)),
        Step::say("Refund rf_2891 issued."),
        // 2: an approval with edited arguments.
        Step::call("issue_refund", refund("ORD-1", 400.0)),
        Step::say("Issued €300 after review."),
        // 3: denied by policy.
        Step::call("issue_refund", refund("ORD-2", 14000.0)),
        Step::say("I can't issue that refund."),
        // 4: a conversation: rejected, then a new turn whose call is cancelled with the session.
        Step::call("issue_refund", refund("ORD-1", 400.0)),
        Step::say("Not approved."),
        Step::call("issue_refund", refund("ORD-1", 350.0)),
        // 5: an outcome review after a worker timeout, resolved by a resend.
        Step::call("issue_refund", refund("ORD-3", 100.0)),
        Step::say("Refund issued on the second try."),
        // 6: awaiting approval when its version is retired.
        Step::call("issue_refund", refund("ORD-4", 400.0)),
    ]);
    let h = Harness::on_with(store, clock, agent.clone(), v1.version_id, script, config).await;
    let mut ids = Vec::new();

    let mut req = h.start_request(
        json!("Refund €100 for ORD-1."),
        phrony_ledger::SessionMode::Task,
    );
    req.principal = Some(json!({"sub": "cust-42", "tier": "gold"}));
    let s1 = h.engine.start_session(req).await.unwrap();
    assert_eq!(h.wait_end(&s1.id).await.status, SessionStatus::Completed);
    ids.push(s1.id.clone());

    let s2 = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s2.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s2.id).await;
    let vote = Vote {
        edited_args: Some(refund("ORD-1", 300.0)),
        comprehension_acknowledged: true,
        ..approve("alice", "partial refund, damage verified")
    };
    h.engine
        .vote(VoteTarget::Approval(approval.id), vote)
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s2.id).await.status, SessionStatus::Completed);
    ids.push(s2.id.clone());

    let s3 = h.start("Refund the full €14,000 for ORD-2.").await;
    assert_eq!(h.wait_end(&s3.id).await.status, SessionStatus::Completed);
    ids.push(s3.id.clone());

    let s4 = h.start_conversation("Refund €400 for ORD-1.").await;
    h.wait(&s4.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s4.id).await;
    h.engine
        .vote(
            VoteTarget::Approval(approval.id),
            reject("bob", "no damage claim on file"),
        )
        .await
        .unwrap();
    h.wait(&s4.id, &[SessionStatus::AwaitingInput]).await;
    h.engine
        .send_user_message(
            &s4.id,
            &phrony_ledger::Attribution::unverified("emad"),
            "Then refund €350, please.",
        )
        .await
        .unwrap();
    h.wait(&s4.id, &[SessionStatus::AwaitingApproval]).await;
    h.engine
        .cancel_session(&s4.id, &phrony_ledger::Attribution::unverified("emad"))
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s4.id).await.status, SessionStatus::Cancelled);
    ids.push(s4.id.clone());

    h.worker.set_behaviour(Behaviour::Hold);
    let s5 = h.start("Refund €100 for ORD-3.").await;
    h.wait(&s5.id, &[SessionStatus::AwaitingApproval]).await;
    let review = h.pending_approval(&s5.id).await;
    h.worker.set_behaviour(Behaviour::Answer);
    h.engine
        .vote(
            VoteTarget::Approval(review.id),
            resolve(
                "emad",
                ReviewResolution::Resend,
                "not issued upstream; retry",
            ),
        )
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s5.id).await.status, SessionStatus::Completed);
    ids.push(s5.id.clone());

    let s6 = h.start("Refund €400 for ORD-4.").await;
    h.wait(&s6.id, &[SessionStatus::AwaitingApproval]).await;
    ledger
        .publish_agent_version(published(&agent, "0.2.0"))
        .await
        .unwrap();
    ledger
        .deploy(
            &agent_ref,
            "0.2.0",
            &phrony_ledger::Attribution::unverified("emad"),
        )
        .await
        .unwrap();
    ledger
        .deprecate_version(
            &agent_ref,
            "0.1.0",
            &phrony_ledger::Attribution::unverified("emad"),
        )
        .await
        .unwrap();
    ledger
        .retire_version(
            &agent_ref,
            "0.1.0",
            &phrony_ledger::Attribution::unverified("emad"),
        )
        .await
        .unwrap();
    h.engine
        .stop_ended_sessions(std::slice::from_ref(&s6.id))
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s6.id).await.status, SessionStatus::Failed);
    ids.push(s6.id.clone());
    ledger
        .archive_agent(&agent_ref, &phrony_ledger::Attribution::unverified("emad"))
        .await
        .unwrap();
    h.engine.shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let events = event_lines(&ledger).await;
    let inspected = inspect_text(&ledger, &ids).await;
    drop(h);
    ledger.close().await;
    std::fs::copy(&db, dir.join("phrony.db")).unwrap();
    std::fs::write(dir.join("sessions.txt"), ids.join("\n") + "\n").unwrap();
    std::fs::write(dir.join("events.txt"), events).unwrap();
    std::fs::write(dir.join("inspect.txt"), inspected).unwrap();
}

/// Reads the fixture with this build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_recorded_by_an_earlier_build_reads_identically() {
    let dir = fixture_dir();
    let work = tempfile::tempdir().unwrap();
    let db = work.path().join("phrony.db");
    std::fs::copy(dir.join("phrony.db"), &db).unwrap();
    let ledger = open(&db).await;
    let ids: Vec<String> = std::fs::read_to_string(dir.join("sessions.txt"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(ids.len(), 6);

    let reports = ledger.verify_all_streams().await.unwrap();
    assert!(
        reports.len() >= 7,
        "six sessions and the agent: {reports:#?}"
    );
    for r in &reports {
        assert!(r.violation.is_none(), "{r:?}");
        assert_eq!(r.events_checked, r.head_seq, "{r:?}");
    }
    assert_eq!(
        event_lines(&ledger).await,
        std::fs::read_to_string(dir.join("events.txt")).unwrap(),
        "the stored events read back unchanged"
    );
    let expected = std::fs::read_to_string(dir.join("inspect.txt")).unwrap();
    let actual = inspect_text(&ledger, &ids).await;
    assert!(
        actual == expected,
        "inspect output differs from the recorded one:\n{}",
        first_difference(&expected, &actual)
    );
    let rebuilt = ledger.rebuild_projections().await.unwrap();
    assert_eq!(rebuilt.streams, u64::try_from(reports.len()).unwrap());
    assert_eq!(
        inspect_text(&ledger, &ids).await,
        expected,
        "the rebuilt projections inspect the same"
    );
}

fn first_difference(expected: &str, actual: &str) -> String {
    for (n, (e, a)) in expected.lines().zip(actual.lines()).enumerate() {
        if e != a {
            return format!("line {}:\n  expected: {e}\n  actual:   {a}", n + 1);
        }
    }
    format!(
        "lengths differ: {} vs {} lines",
        expected.lines().count(),
        actual.lines().count()
    )
}
