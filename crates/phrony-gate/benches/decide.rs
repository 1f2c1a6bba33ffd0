//! In-process cost of one decision (no HTTP): the walkthrough configuration, in-memory log.
//!
//! `cargo bench -p phrony-gate --bench decide`

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark: a failure is a crash with its message"
)]

use std::path::Path;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use phrony_gate::{DecisionRequest, Gate, MemoryStore, Settings, SigningKey, SystemClock};
use serde_json::{Value, json};

fn walkthrough(dir: &Path) -> Settings {
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies-examples/regent-walkthrough");
    std::fs::copy(src.join("policy.cedar"), dir.join("policy.cedar")).unwrap();
    let text = std::fs::read_to_string(src.join("gate.yaml"))
        .unwrap()
        .replace(
            "velocity: {max: 120, window_seconds: 60}",
            "velocity: {max: 1000000000, window_seconds: 1}",
        )
        .replace("daily_limit: \"5000.00\"", "daily_limit: \"1000000000.00\"")
        .replace(
            "per_entity_limit: \"1000.00\"",
            "per_entity_limit: \"1000000000.00\"",
        )
        .replace(
            "duplicate_window_seconds: 60",
            "duplicate_window_seconds: 0",
        );
    std::fs::write(dir.join("gate.yaml"), text).unwrap();
    Settings::load(&dir.join("gate.yaml")).unwrap()
}

fn request(token: &str, status: &str) -> Value {
    json!({"agent_id": "agent_refund_bot", "tool": "payments", "action": "refund.create",
        "resource": "charges/ch_big", "args": {}, "context": {"amount_usd": "0.01",
        "mandate_id": "mnd_support_refunds", "user_token": token, "op": "refund.create",
        "account_status": status, "refund_to_original": true, "reference": "ch_big",
        "reference_amount": "1000000000", "customer_id": "cus_1"}})
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gate = runtime.block_on(async {
        Gate::open(
            walkthrough(dir.path()),
            SigningKey::generate().unwrap(),
            Arc::new(MemoryStore::new()),
            Arc::new(SystemClock),
        )
        .await
        .unwrap()
    });
    let token = gate
        .oidc()
        .unwrap()
        .mint_test_token(
            "alice@bank",
            "support_agent",
            None,
            chrono::Utc::now().timestamp(),
        )
        .unwrap();
    let caller = gate
        .authenticate_key(Some("rgnt_ctrl_walkthrough_local"))
        .unwrap();
    for (name, status) in [
        ("decide/allow (Cedar, mandate, RS256 token)", "active"),
        ("decide/deny (acct-frozen)", "frozen"),
    ] {
        let body = serde_json::to_vec(&request(&token, status)).unwrap();
        c.bench_function(name, |b| {
            b.iter(|| {
                let req = DecisionRequest::from_json(&body).unwrap();
                runtime.block_on(gate.decide(&caller, req, None)).unwrap()
            });
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
