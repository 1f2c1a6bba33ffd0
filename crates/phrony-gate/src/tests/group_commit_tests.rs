//! Group commit of the gate's log ([`crate::log_writer`]): concurrent decisions share
//! commits, every answer waits for its event to be durable, and a failed batch is refused as a
//! whole: its requests get HTTP 500, nothing decided on top of it is answered as a success,
//! and the state is rebuilt from the durable log before the next decision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::*;
use crate::ledger_store::LedgerStore;
use crate::store::{AuditEvent, NewAuditEvent, StoreError};

/// The walkthrough with room for many refunds: no velocity, duplicate or daily limits in the
/// way, so concurrent requests are fresh allows that each hold an amount.
fn roomy(text: String) -> String {
    text.replace(
        "velocity: {max: 120, window_seconds: 60}",
        "velocity: {max: 100000000, window_seconds: 1}",
    )
    .replace("daily_limit: \"5000.00\"", "daily_limit: \"100000000.00\"")
    .replace(
        "per_entity_limit: \"1000.00\"",
        "per_entity_limit: \"100000000.00\"",
    )
    .replace(
        "duplicate_window_seconds: 60",
        "duplicate_window_seconds: 0",
    )
}

/// A store in front of a [`MemoryStore`] that can slow its batches down, hold one batch until
/// released, and fail one batch.
#[derive(Debug, Default)]
struct TestStore {
    inner: MemoryStore,
    batches: AtomicU64,
    delay: Duration,
    /// The batch (1-based) that fails; 0: none.
    fail_batch: u64,
    /// The batch (1-based) that waits for `release` (signalling `entered`); 0: none.
    hold_batch: u64,
    entered: Notify,
    release: Notify,
}

#[async_trait]
impl GateStore for TestStore {
    async fn append(&self, event: NewAuditEvent) -> Result<AuditEvent, StoreError> {
        let mut stored = self.append_batch(vec![event]).await?;
        stored.pop().ok_or_else(|| StoreError("empty batch".into()))
    }

    async fn append_batch(
        &self,
        events: Vec<NewAuditEvent>,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let n = self.batches.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.hold_batch {
            self.entered.notify_one();
            self.release.notified().await;
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if n == self.fail_batch {
            return Err(StoreError(format!("batch {n} failed (test)")));
        }
        self.inner.append_batch(events).await
    }

    async fn load(&self) -> Result<Vec<AuditEvent>, StoreError> {
        self.inner.load().await
    }

    async fn verify(&self) -> Result<Option<String>, StoreError> {
        self.inner.verify().await
    }
}

async fn open_gate(dir: &tempfile::TempDir, store: Arc<dyn GateStore>) -> Arc<Gate> {
    let settings = Settings::load(&dir.path().join("gate.yaml")).unwrap();
    Arc::new(
        Gate::open(
            settings,
            SigningKey::load_or_create(&dir.path().join("gate-key.pem")).unwrap(),
            store,
            Arc::new(crate::engine::SystemClock),
        )
        .await
        .unwrap(),
    )
}

/// A refund of `cents` against one large charge, as the walkthrough's rep.
fn refund(gate: &Gate, cents: i64, key: Option<&str>) -> DecisionRequest {
    let token = gate
        .oidc()
        .unwrap()
        .mint_test_token(
            "alice@bank",
            "support_agent",
            Some("alice@bank"),
            Utc::now().timestamp(),
        )
        .unwrap();
    let mut context = json!({
        "amount_usd": format!("{}.{:02}", cents / 100, cents % 100),
        "mandate_id": "mnd_support_refunds", "user_token": token,
        "intent": "refund", "op": "refund.create", "account_status": "active",
        "refund_to_original": true, "customer_id": "cus_1",
        "reference": "ch_big", "reference_amount": "1000000",
    });
    if let Some(key) = key {
        context["idempotency_key"] = json!(key);
    }
    let body = json!({
        "agent_id": AGENT, "tool": "payments", "action": "refund.create",
        "resource": "charges/ch_big", "args": {}, "context": context,
    });
    DecisionRequest::from_json(&serde_json::to_vec(&body).unwrap()).unwrap()
}

/// Sends `requests` concurrently; returns the answers in the same order.
async fn decide_all(
    gate: &Arc<Gate>,
    requests: Vec<DecisionRequest>,
) -> Vec<Result<Value, crate::ApiError>> {
    let caller = gate.authenticate_key(Some(ORG_KEY)).unwrap();
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|req| {
            let (gate, caller) = (gate.clone(), caller.clone());
            tokio::spawn(async move { gate.decide(&caller, req, None).await })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    answers
}

/// What a gate shows: its decisions (by id: concurrent ones may share a time), mandates
/// (held and used amounts) and approvals.
async fn views(gate: &Gate) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let mut decisions = gate.decisions(100_000).await;
    decisions.sort_by(|a, b| a["decision_id"].as_str().cmp(&b["decision_id"].as_str()));
    (decisions, gate.mandates().await, gate.approvals(None).await)
}

fn held_today(gate_mandates: &[Value]) -> String {
    gate_mandates
        .iter()
        .find(|m| m["mandate_id"] == "mnd_support_refunds")
        .map(|m| m["held_today"].as_str().unwrap_or_default().to_owned())
        .unwrap()
}

/// `n` concurrent refunds (some reusing an idempotency key: replays), then completions: every
/// request is answered, the log verifies with gap-free seqs, and a gate reopened on the log
/// shows exactly the live state.
async fn concurrent_scenario(store: Arc<dyn GateStore>, n: i64) {
    let dir = config_dir(roomy);
    let gate = open_gate(&dir, store.clone()).await;
    let requests = (0..n)
        .map(|i| {
            // Every fourth request reuses one of two keys with the same request: a replay.
            if i % 4 == 0 {
                refund(&gate, 100 + i % 8, Some(&format!("k{}", i % 8)))
            } else {
                refund(&gate, 100 + i, None)
            }
        })
        .collect();
    let answers = decide_all(&gate, requests).await;
    let mut allowed = Vec::new();
    for a in &answers {
        let a = a.as_ref().unwrap();
        assert_eq!(a["decision"], "allow", "{a}");
        allowed.push(a["decision_id"].as_str().unwrap().to_owned());
    }
    allowed.sort();
    allowed.dedup();
    let caller = gate.authenticate_key(Some(ORG_KEY)).unwrap();
    let completions: Vec<_> = allowed
        .iter()
        .take(5)
        .enumerate()
        .map(|(i, id)| {
            let (gate, caller, id) = (gate.clone(), caller.clone(), id.clone());
            let status = if i % 2 == 0 { "success" } else { "failed" };
            tokio::spawn(async move {
                gate.complete(
                    &caller,
                    &id,
                    json!({"status": status}).to_string().as_bytes(),
                )
                .await
            })
        })
        .collect();
    for c in completions {
        c.await.unwrap().unwrap();
    }

    assert_eq!(store.verify().await.unwrap(), None);
    let log = store.load().await.unwrap();
    let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=log.len() as u64).collect::<Vec<_>>(), "gap-free");
    let stats = gate.log_stats();
    assert_eq!(stats.events, log.len() as u64, "{stats:?}");
    // n decisions or replays, and the completions.
    assert_eq!(log.len() as u64, u64::try_from(n).unwrap() + 5);

    let live = views(&gate).await;
    let reopened = open_gate(&dir, store).await;
    assert_eq!(
        views(&reopened).await,
        live,
        "the replayed state is the live one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_decisions_are_answered_chained_and_replay_to_the_live_state() {
    concurrent_scenario(Arc::new(MemoryStore::new()), 64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_decisions_on_sqlite_are_answered_chained_and_replay_to_the_live_state() {
    let dir = tempfile::tempdir().unwrap();
    let url = crate::service::database_url(dir.path());
    let store = Arc::new(LedgerStore::open(&url, "org_test").await.unwrap());
    concurrent_scenario(store, 64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_decisions_on_postgres_are_answered_chained_and_replay_to_the_live_state() {
    let Some(db) = phrony_test_support::postgres::PgDatabase::create().await else {
        return;
    };
    let store = Arc::new(LedgerStore::open(db.url(), "org_test").await.unwrap());
    concurrent_scenario(store, 64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_requests_share_commits() {
    // Each batch takes 100 ms, as a slow disk would: requests queue behind it. (20 ms was not
    // enough on a loaded 2-core machine, where 48 requests' signing alone can spread their
    // arrivals over more than a dozen 20 ms batches.)
    let store = Arc::new(TestStore {
        delay: Duration::from_millis(100),
        ..TestStore::default()
    });
    let dir = config_dir(roomy);
    let gate = open_gate(&dir, store.clone()).await;
    let requests = (0..48).map(|i| refund(&gate, 100 + i, None)).collect();
    for a in decide_all(&gate, requests).await {
        assert_eq!(a.unwrap()["decision"], "allow");
    }
    let stats = gate.log_stats();
    assert_eq!(stats.events, 48);
    assert!(
        stats.commits < stats.events / 4,
        "48 concurrent decisions took {} commits",
        stats.commits
    );
    assert_eq!(store.batches.load(Ordering::SeqCst), stats.commits);
    assert_eq!(store.verify().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_batch_fails_its_requests_and_everything_decided_on_it() {
    // Batch 2 is held open until the test releases it, then fails.
    let store = Arc::new(TestStore {
        fail_batch: 2,
        hold_batch: 2,
        ..TestStore::default()
    });
    let dir = config_dir(roomy);
    let gate = open_gate(&dir, store.clone()).await;
    let caller = gate.authenticate_key(Some(ORG_KEY)).unwrap();

    // Batch 1: one allow of 10.00, durable.
    let first = gate
        .decide(&caller, refund(&gate, 1000, None), None)
        .await
        .unwrap();
    assert_eq!(first["decision"], "allow");
    assert_eq!(held_today(&gate.mandates().await), "10.00");

    // Batch 2: an allow of 20.00, written while the next two are decided on top of it.
    let a = {
        let (gate, caller) = (gate.clone(), caller.clone());
        let req = refund(&gate, 2000, Some("retry-me"));
        tokio::spawn(async move { gate.decide(&caller, req, None).await })
    };
    store.entered.notified().await;
    let queued: Vec<_> = [3000, 4000]
        .into_iter()
        .map(|cents| {
            let (gate, caller) = (gate.clone(), caller.clone());
            let req = refund(&gate, cents, None);
            tokio::spawn(async move { gate.decide(&caller, req, None).await })
        })
        .collect();
    // Both are decided (the live state holds 10 + 20 + 30 + 40) and queued behind batch 2.
    for _ in 0..500 {
        if gate.decisions(100).await.len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(gate.decisions(100).await.len(), 4);
    store.release.notify_one();

    let a = a.await.unwrap().unwrap_err();
    assert_eq!(a.status, 500, "{a}");
    for q in queued {
        let e = q.await.unwrap().unwrap_err();
        assert_eq!(e.status, 500, "decided on a failed batch: {e}");
    }
    let stats = gate.log_stats();
    assert_eq!((stats.commits, stats.failed_batches), (1, 1), "{stats:?}");

    // The next decision rebuilds the state from the log first: only the first hold counts,
    // and the retried key is decided afresh.
    let retry = gate
        .decide(&caller, refund(&gate, 2000, Some("retry-me")), None)
        .await
        .unwrap();
    assert_eq!(retry["decision"], "allow", "{retry}");
    assert_eq!(held_today(&gate.mandates().await), "30.00");
    let log = store.load().await.unwrap();
    assert_eq!(
        log.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2],
        "the failed batch and what was decided on it never reach the log"
    );
    assert_eq!(log[1].payload["decision_id"], retry["decision_id"]);
    assert_eq!(store.verify().await.unwrap(), None);

    // The state equals the log: a gate reopened on it shows the same.
    let live = views(&gate).await;
    assert_eq!(live.0.len(), 2);
    let reopened = open_gate(&dir, store.clone()).await;
    assert_eq!(views(&reopened).await, live);
}
