//! Decisions per second over HTTP, the way the SDK calls the gate: `POST
//! /v1/control/decisions` with a walkthrough refund, N concurrent keep-alive connections,
//! for a fixed time.
//!
//! ```text
//! cargo bench -p phrony-gate --bench http_load                     # in-process gates
//! LOAD_TARGET=http://127.0.0.1:8019 cargo bench -p phrony-gate --bench http_load
//!                                                                  # any running server,
//!                                                                  # e.g. `regent-control dev`
//! ```
//! `LOAD_SECONDS` (default 5) and `LOAD_CONCURRENCY` (default 16) tune the run.
//!
//! After each in-process run the gate's log writer says how many events it committed in how
//! many commits (`Gate::log_stats`): the gate groups concurrent decisions into one append (one
//! transaction, one fsync on SQLite), and answers each once its event is durable.
//!
//! Group commit, same session, same 2-core machine shared with other builds (load 2–3.4; the
//! figures move by 2× between rounds, so these are medians of 5 alternating rounds of 5 s):
//!
//! | run                          | conns | before (one append per event, under the lock) | after (log writer)            |
//! |------------------------------|-------|------------------------------------------------|-------------------------------|
//! | flags mode, SQLite log       | 16    | 587/s, p50 16.5 ms, p99 66 ms                  | 1,428/s, p50 11.3 ms, p99 24 ms (~7 events a commit) |
//! | walkthrough config, SQLite   | 16    | 475/s, p50 32.1 ms, p99 64 ms                  | 1,329/s, p50 11.7 ms, p99 30 ms (~7 events a commit) |
//! | flags mode, SQLite log       | 1     | 623/s, p50 0.92 ms                             | 546/s, p50 1.21 ms (1 event a commit) |
//! | walkthrough config, SQLite   | 1     | 526/s, p50 1.20 ms                             | 553/s, p50 1.36 ms            |
//!
//! With one connection there is nothing to group: the writer's extra task hop costs a little.
//!
//! Signing the allow token on a blocking thread while the batch commits (2026-12-05; before, it
//! was signed on the request's worker thread after the commit). A CPU profile of the in-memory
//! run showed RS256 signing (aws-lc's RSA-2048) as ≈ 45 % of all CPU: it is the ceiling of
//! allow decisions per core, since every allow carries a fresh RS256 token (the SDK's verifier
//! accepts nothing else). Same binary pair alternated twice, machine loaded by other builds
//! (load average ≈ 10), 4 s runs; `regent-control dev` (in-memory, no signature: its token is
//! the literal `dev-scoped-token`) measured in the same session for comparison:
//!
//! | run                          | conns | before (sign after the commit) | after (sign during the commit) | ratio |
//! |------------------------------|-------|--------------------------------|--------------------------------|-------|
//! | flags mode, SQLite log       | 16    | 1,170 / 1,195/s, p99 24 / 23 ms | 2,047 / 2,083/s, p99 18 / 17 ms | 1.74 |
//! | walkthrough config, SQLite   | 16    | 1,073 / 1,084/s, p99 28 / 28 ms | 1,460 / 1,510/s, p99 23 / 22 ms | 1.38 |
//! | flags mode, in-memory log    | 16    | 1,872 / 1,864/s                 | 2,852 / 2,634/s                 | 1.47 |
//! | flags mode, SQLite log       | 1     | 395 / 365/s, p50 1.56 / 2.63 ms | 664 / 492/s, p50 1.07 / 1.23 ms | 1.52 |
//! | walkthrough config, SQLite   | 1     | 350 / 355/s, p50 1.61 / 1.62 ms | 623 / 433/s, p50 1.16 / 1.43 ms | 1.49 |
//! | `regent-control dev`         | 16    | 1,295 and 739/s (two moments of the session), p99 19–28 ms | | |
//!
//! With one connection and the in-memory log the hop to a blocking thread costs ≈ 0.1–0.2 ms
//! of p50 (1,941 → 1,241/s in one pair, 1,259 → 1,255/s in the other).

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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::Request;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use phrony_gate::{FlagRules, Gate, MemoryStore, Settings, SigningKey, SystemClock, service};
use serde_json::json;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs the load against `url`; returns (decisions/s, allow share, p50 ms, p99 ms).
async fn load(
    url: &str,
    body: &'static [u8],
    key: &str,
    seconds: u64,
    concurrency: u64,
) -> (f64, f64, f64, f64) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let done = Arc::new(AtomicU64::new(0));
    let allowed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let client = client.clone();
        let (done, allowed) = (done.clone(), allowed.clone());
        let url = format!("{url}/v1/control/decisions");
        let auth = format!("Bearer {key}");
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let started = Instant::now();
                let request = Request::post(&url)
                    .header("content-type", "application/json")
                    .header("authorization", &auth)
                    .body(Full::new(Bytes::from_static(body)))
                    .unwrap();
                let response = client.request(request).await.unwrap();
                assert_eq!(response.status(), 200);
                let bytes = response.into_body().collect().await.unwrap().to_bytes();
                latencies.push(started.elapsed());
                let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                if answer["decision"] == "allow" {
                    allowed.fetch_add(1, Ordering::Relaxed);
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            latencies
        }));
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let n = done.load(Ordering::Relaxed) as f64;
    (
        n / elapsed,
        allowed.load(Ordering::Relaxed) as f64 / n.max(1.0),
        pct(0.5),
        pct(0.99),
    )
}

async fn serve(gate: Arc<Gate>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, phrony_gate::router(gate))
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

/// The log writer's batching over a run: events per commit.
fn report_commits(gate: &Gate) {
    let stats = gate.log_stats();
    println!(
        "{:<44} {} events in {} commits ({:.1} a commit)",
        "",
        stats.events,
        stats.commits,
        stats.events as f64 / stats.commits.max(1) as f64
    );
}

fn report(name: &str, r: (f64, f64, f64, f64)) {
    println!(
        "{name:<44} {:>9.0} decisions/s   allow {:>5.1}%   p50 {:>6.2} ms   p99 {:>6.2} ms",
        r.0,
        r.1 * 100.0,
        r.2,
        r.3
    );
}

fn main() {
    let seconds = env("LOAD_SECONDS", 5);
    let concurrency = env("LOAD_CONCURRENCY", 16);
    // The dev mock's load: a $50 refund through flags-mode rules (allow, with a real token).
    let flags_body: &'static [u8] = br#"{"agent_id":"agent_refund_bot","tool":"payments","action":"refund.create","resource":"charges/ch_1","args":{},"context":{"amount_usd":50,"mandate_id":"mnd_support_refunds","intent":"refund the duplicate charge","op":"refund.create","account_status":"active","refund_to_original":true}}"#;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        println!("{seconds} s per run, {concurrency} connections");
        if let Ok(url) = std::env::var("LOAD_TARGET") {
            report(&format!("external {url}"), load(&url, flags_body, "dev", seconds, concurrency).await);
            return;
        }
        let rules = FlagRules {
            deny_over: Some(rust_decimal_200()),
            escalate_over: Some(rust_decimal_1000()),
            ..FlagRules::default()
        };
        let gate = Gate::open(
            Settings::flags(rules.clone(), None),
            SigningKey::generate().unwrap(),
            Arc::new(MemoryStore::new()),
            Arc::new(SystemClock),
        )
        .await
        .unwrap();
        let gate = Arc::new(gate);
        let url = serve(gate.clone()).await;
        report("flags mode, in-memory log", load(&url, flags_body, "dev", seconds, concurrency).await);
        report_commits(&gate);

        let dir = tempfile::tempdir().unwrap();
        let gate = service::open(Settings::flags(rules, None), Some(dir.path().join("flags")))
            .await
            .unwrap();
        let gate = Arc::new(gate);
        let url = serve(gate.clone()).await;
        report("flags mode, SQLite log (group commit)", load(&url, flags_body, "dev", seconds, concurrency).await);
        report_commits(&gate);

        // Config mode: the walkthrough (Cedar, mandate, OIDC). Distinct keyless refunds against
        // one large reference so every request is a fresh allow.
        let config = walkthrough_copy(dir.path());
        let settings = Settings::load(&config).unwrap();
        let gate = service::open(settings, Some(dir.path().join("walkthrough-state"))).await.unwrap();
        let token = gate
            .oidc()
            .unwrap()
            .mint_test_token("alice@bank", "support_agent", Some("alice@bank"), chrono::Utc::now().timestamp())
            .unwrap();
        let body = json!({"agent_id":"agent_refund_bot","tool":"payments","action":"refund.create",
            "resource":"charges/ch_big","args":{},"context":{"amount_usd":"0.01","mandate_id":"mnd_support_refunds",
            "user_token":token,"op":"refund.create","account_status":"active","refund_to_original":true,
            "reference":"ch_big","reference_amount":"1000000","customer_id":"cus_1"}});
        let body: &'static [u8] = Box::leak(serde_json::to_vec(&body).unwrap().into_boxed_slice());
        let gate = Arc::new(gate);
        let url = serve(gate.clone()).await;
        report(
            "walkthrough config, SQLite log (first: allow)",
            load(&url, body, "rgnt_ctrl_walkthrough_local", seconds, concurrency).await,
        );
        report_commits(&gate);
    });
}

fn rust_decimal_200() -> rust_decimal::Decimal {
    rust_decimal::Decimal::new(200, 0)
}

fn rust_decimal_1000() -> rust_decimal::Decimal {
    rust_decimal::Decimal::new(1000, 0)
}

fn walkthrough_copy(dir: &Path) -> std::path::PathBuf {
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies-examples/regent-walkthrough");
    let dest = dir.join("walkthrough");
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::copy(src.join("policy.cedar"), dest.join("policy.cedar")).unwrap();
    let text = std::fs::read_to_string(src.join("gate.yaml"))
        .unwrap()
        .replace(
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
        );
    std::fs::write(dest.join("gate.yaml"), text).unwrap();
    dest.join("gate.yaml")
}
