//! Conformance cases for commit listeners (`Ledger::listen_to_commits`): what a process hears of
//! its own committed appends is exactly what a read of the log returns, and nothing else.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use phrony_ledger::{CommitListener, CommittedAppend, HANDED_OVER_PAYLOAD_MAX, Ledger, NewEvent};
use serde_json::json;

use crate::harness::TestDb;
use crate::lease_cases::{Clock, fenced, granted, replica};
use crate::session_cases::{deploy_agent, refund_agent, start};

/// Records what it hears of the streams it was told to want.
#[derive(Default)]
struct Heard {
    wanted: Mutex<HashSet<String>>,
    appends: Mutex<Vec<CommittedAppend>>,
}

impl CommitListener for Heard {
    fn wants(&self, stream: &str) -> bool {
        self.wanted.lock().unwrap().contains(stream)
    }

    fn committed(&self, append: CommittedAppend) {
        self.appends.lock().unwrap().push(append);
    }
}

impl Heard {
    fn take(&self) -> Vec<CommittedAppend> {
        std::mem::take(&mut *self.appends.lock().unwrap())
    }
}

fn note(text: &str) -> NewEvent {
    NewEvent::new(
        "message.user",
        "user",
        json!({"role": "user", "content": text, "n": 1.5, "big": u64::MAX, "neg": -3,
            "nested": [{"z": 1, "a": {"y": true, "b": null}}]}),
    )
}

/// Every event heard, checked against the log read back.
async fn assert_heard_as_read(ledger: &Ledger, appends: &[CommittedAppend]) {
    for append in appends {
        let first = append
            .events
            .first()
            .map_or(append.last_seq, |e| e.event.seq);
        let read = ledger
            .events_after(&append.stream, first - 1, 1000)
            .await
            .unwrap();
        for held in &append.events {
            let stored = read.iter().find(|e| e.seq == held.event.seq).unwrap();
            assert_eq!(&held.event, stored, "heard as stored");
            // Also in order (with serde_json's `preserve_order`, `==` ignores the keys' order).
            assert_eq!(
                serde_json::to_string(&held.event.payload).unwrap(),
                serde_json::to_string(&stored.payload).unwrap()
            );
            assert_eq!(
                held.payload_bytes,
                phrony_ledger::canonical_json(&stored.payload).len()
            );
        }
        assert!(
            read.iter().any(|e| e.seq == append.last_seq),
            "the head after the append is stored"
        );
        assert!(append.events.iter().all(|e| e.event.seq <= append.last_seq));
    }
}

pub(crate) async fn a_commit_listener_hears_committed_appends_as_a_read_returns_them(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let s = start(&a, &v).await;
    let quiet = start(&a, &v).await;
    let heard = Arc::new(Heard::default());
    let listener: Arc<dyn CommitListener> = heard.clone();
    // Registered on one handle, heard for its clones' writes too.
    a.clone().listen_to_commits(&listener);
    heard.wanted.lock().unwrap().insert(s.id.clone());

    // One event, then a batch of three: heard after each commit, as a read returns them.
    a.append_session_event(&s.id, note("one")).await.unwrap();
    a.append_session_events(&s.id, vec![note("two"), note("three"), note("four")])
        .await
        .unwrap();
    // A stream nobody wants: nothing is kept for it.
    a.append_session_event(&quiet.id, note("unheard"))
        .await
        .unwrap();
    let appends = heard.take();
    assert_eq!(appends.len(), 2, "{appends:#?}");
    assert_eq!(appends[0].events.len(), 1);
    assert_eq!(appends[1].events.len(), 3);
    assert!(appends.iter().all(|x| x.stream == s.id));
    assert_eq!(appends[1].last_seq, appends[0].last_seq + 3);
    let seqs = |x: &CommittedAppend| x.events.iter().map(|e| e.event.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&appends[0]), [appends[0].last_seq]);
    let l = appends[1].last_seq;
    assert_eq!(seqs(&appends[1]), [l - 2, l - 1, l]);
    assert_heard_as_read(&a, &appends).await;

    // A payload over the bound is not handed over; the head still moves past it.
    let big = "x".repeat(HANDED_OVER_PAYLOAD_MAX);
    let before = a.events_after(&s.id, 0, 1000).await.unwrap().len() as u64;
    a.append_session_events(&s.id, vec![note(&big), note("after the big one")])
        .await
        .unwrap();
    let appends = heard.take();
    assert_eq!(appends.len(), 1);
    assert_eq!(appends[0].last_seq, before + 2);
    assert_eq!(
        appends[0]
            .events
            .iter()
            .map(|e| e.event.seq)
            .collect::<Vec<_>>(),
        [before + 2],
        "only the small one"
    );
    assert_heard_as_read(&a, &appends).await;

    // A write that does not commit (refused by the lease's fence) is not heard; the write of
    // the replica that holds the lease, on its own handle, is not heard here either.
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        1
    );
    let restarted = replica(db, &clock, "replica-a").await;
    assert_eq!(
        granted(restarted.acquire_session_lease(&s.id, TTL).await.unwrap()),
        2
    );
    fenced(
        a.append_session_event(&s.id, note("refused")).await,
        &s.id,
        1,
    );
    restarted
        .append_session_event(&s.id, note("elsewhere"))
        .await
        .unwrap();
    assert_eq!(heard.take(), [], "nothing committed here");
}

const TTL: std::time::Duration = std::time::Duration::from_secs(10);
