//! What the sidecar route adds: p50/p99 of a refund sent straight to the mock provider vs the
//! same refund through `POST /payments/refunds` on the sidecar (decide with the walkthrough's
//! Cedar policy, mandate and OIDC token, inject the vaulted key, forward, complete), both on
//! loopback, both paced open-loop at the same rate, in the same run.
//!
//! ```text
//! cargo bench -p phrony-gate --bench routing_load
//! ```
//! `LOAD_RATE` (requests/s, default 500) and `LOAD_SECONDS` (per phase, default 5) tune it.
//! The gate's log is in memory here (the SQLite fsync cost is `http_load`'s subject).
//!
//! Measured 2026-12-03, release, 2 cores (a helper's build beside it, load ≈ 2), 500/s for 5 s:
//!
//! | build | direct p50 | sidecar p50 | routing adds (p50) | sidecar p99 |
//! |---|---|---|---|---|
//! | before (this tree without the key and provider fixes) | 0.33 ms | 2.02 ms | 1.69, 2.41, 6.24 ms (3 runs) | 29 ms |
//! | after | 0.04 ms | 0.86 ms | **0.82 ms** (3 runs: 0.82, 0.84, 0.82) | 3.4–19 ms |
//!
//! What changed, from two `perf` profiles: the RS256 receipt was signed with a private key that
//! `jsonwebtoken::encode` parsed and checked (`RSA_check_key`) on every call, and it was signed
//! under the engine's state lock; the key pair is now parsed once (`keys.rs`) and the receipt is
//! signed outside the lock (`Gate::complete`). The mock provider also scanned every refund to
//! number a charge's next one (now a per-charge count). What remains is the receipt's RSA
//! signature itself (≈ 20 % of the samples) and the HTTP hops.

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark: its run is tuned through the environment (LOAD_*)"
)]
#![allow(
    clippy::unwrap_used,
    reason = "a benchmark: a failure is a crash with its message"
)]
#![allow(clippy::print_stdout, reason = "a benchmark prints its results")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderName, Request};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use phrony_gate::provider::{Provider, ProviderAuth};
use phrony_gate::{Gate, MemoryStore, Settings, SigningKey, SystemClock};
use secrecy::SecretString;
use serde_json::json;

const KEY: &str = "sk_bench_payments_key";

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// Paces `rate` requests/s for `seconds`; returns (sent, non-2xx, p50 ms, p99 ms).
async fn paced(
    url: String,
    headers: Vec<(&'static str, String)>,
    rate: u64,
    seconds: u64,
    offset: u64,
) -> (usize, usize, f64, f64) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let headers = Arc::new(headers);
    let mut ticker = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    for i in 0..rate * seconds {
        ticker.tick().await;
        let client = client.clone();
        let (url, headers) = (url.clone(), headers.clone());
        tasks.push(tokio::spawn(async move {
            // Distinct bodies: every call is a fresh request, never a duplicate.
            let body = json!({"charge": "ch_big", "amount": "0.01", "metadata": {"n": offset + i}});
            let mut req = Request::post(&url).header("content-type", "application/json");
            for (k, v) in headers.iter() {
                req = req.header(*k, v.as_str());
            }
            let req = req
                .body(Full::new(Bytes::from(serde_json::to_vec(&body).unwrap())))
                .unwrap();
            let started = Instant::now();
            let response = client.request(req).await.unwrap();
            let ok = response.status().is_success();
            let _ = response.into_body().collect().await.unwrap();
            (started.elapsed(), ok)
        }));
    }
    let mut latencies = Vec::new();
    let mut failed = 0;
    for t in tasks {
        let (d, ok) = t.await.unwrap();
        latencies.push(d);
        failed += usize::from(!ok);
    }
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    (latencies.len(), failed, pct(0.5), pct(0.99))
}

fn config(dir: &Path, provider: &str) -> std::path::PathBuf {
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies-examples/regent-walkthrough");
    std::fs::copy(src.join("policy.cedar"), dir.join("policy.cedar")).unwrap();
    let text = std::fs::read_to_string(src.join("gate-sidecar.yaml"))
        .unwrap()
        .replace("http://127.0.0.1:8010", provider)
        .replace(
            "velocity: {max: 120, window_seconds: 60}",
            "velocity: {max: 100000000, window_seconds: 60}",
        )
        .replace("daily_limit: \"5000.00\"", "daily_limit: \"100000000.00\"")
        .replace("state_dir: .state-sidecar", "state_dir: state")
        .replace(
            "file: .state-sidecar/vault.json",
            "file: vault.json\n    key_file: vault.key",
        )
        .replace(".state/idp-key.pem", "idp-key.pem");
    std::fs::write(dir.join("gate.yaml"), text).unwrap();
    std::fs::write(
        dir.join("vault.key"),
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    )
    .unwrap();
    let path = dir.join("gate.yaml");
    let settings = Settings::load(&path).unwrap();
    let routing = settings.routing.as_ref().unwrap();
    phrony_gate::vault::put(
        routing.vault.as_ref().unwrap(),
        &settings.org_id,
        "payments_api_key",
        &SecretString::from(KEY),
    )
    .unwrap();
    path
}

fn main() {
    let rate = env("LOAD_RATE", 500).max(1);
    let seconds = env("LOAD_SECONDS", 5).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let provider = Arc::new(Provider::new(ProviderAuth::Header {
            name: HeaderName::from_static("x-api-key"),
            key: SecretString::from(KEY),
        }));
        let provider_url = serve(phrony_gate::provider::router(provider.clone())).await;
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings::load(&config(dir.path(), &provider_url)).unwrap();
        let gate = Gate::open(
            settings,
            SigningKey::generate().unwrap(),
            Arc::new(MemoryStore::new()),
            Arc::new(SystemClock),
        )
        .await
        .unwrap();
        let token = gate
            .oidc()
            .unwrap()
            .mint_test_token(
                "alice@bank",
                "support_agent",
                Some("alice@bank"),
                chrono::Utc::now().timestamp(),
            )
            .unwrap();
        let gate_url = serve(phrony_gate::router(Arc::new(gate))).await;
        let direct = vec![("x-api-key", KEY.to_owned())];
        let routed = vec![
            ("x-agent-id", "agent_refund_bot".to_owned()),
            ("x-agent-user-token", token),
            ("x-agent-intent", "refund the duplicate charge".to_owned()),
            (
                "x-agent-facts",
                json!({"account_status": "active", "refund_to_original": true,
                       "reference_amount": "100000000"})
                .to_string(),
            ),
        ];
        // Warm both paths (connections, caches) before measuring.
        paced(
            format!("{provider_url}/refunds"),
            direct.clone(),
            200,
            1,
            10_000_000,
        )
        .await;
        paced(
            format!("{gate_url}/payments/refunds"),
            routed.clone(),
            200,
            1,
            20_000_000,
        )
        .await;
        println!("{rate} requests/s for {seconds} s per phase, open loop, loopback");
        let d = paced(format!("{provider_url}/refunds"), direct, rate, seconds, 0).await;
        let s = paced(
            format!("{gate_url}/payments/refunds"),
            routed,
            rate,
            seconds,
            1_000_000,
        )
        .await;
        for (name, r) in [
            ("direct to the mock provider", d),
            ("through the sidecar route", s),
        ] {
            println!(
                "{name:<30} {:>6} requests  {:>4} non-2xx  p50 {:>6.3} ms  p99 {:>7.3} ms",
                r.0, r.1, r.2, r.3
            );
        }
        println!("routing adds {:.3} ms at p50", s.2 - d.2);
        assert_eq!(s.1, 0, "every routed refund is allowed and forwarded");
    });
}
