//! The webhook sender's load figure (`phrony-bench --webhooks N`): the real daemon with a
//! webhooks file whose one webhook (`approval.required`, signed JSON) points at a receiver in
//! this process on 127.0.0.1 that answers 200 with an empty body.
//!
//! - **steady**: `N` sessions of the held agent are started by 32 concurrent clients; each
//!   parks on its approval, whose commit writes one delivery. Per delivery: the latency from
//!   the event's timestamp (`occurred_at`, taken in the committing transaction) to the moment
//!   the receiver has read the request; and the deliveries per second the receiver saw
//!   between the first event and the last delivery (bounded by how fast the events come).
//! - **backlog**: the receiver holds every answer while `N` more sessions park (the sender's
//!   16 requests in flight wait, the other deliveries queue as due), then answers them all: the
//!   deliveries per second from the release to the last one is the sender's drain rate.
//!
//! Every delivery must arrive exactly once per id (a duplicate or a missing one is reported
//! and fails the run). Timing never fails a run.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use phrony_client::Client;
use serde_json::{Value, json};
use tests::daemon::{Backend, Daemon};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::stats::Latencies;
use crate::{BenchError, backend_name};

/// The held agent's name (a refund of 400 waits for one approval).
const AGENT: &str = "bench-hooked";
/// Concurrent session starters.
const STARTERS: usize = 32;
/// How long a phase may take (a guard, not a pace).
const GUARD: Duration = Duration::from_secs(600);
/// The largest request the receiver reads.
const MAX_REQUEST: usize = 1 << 20;

/// One request the receiver read.
#[derive(Debug, Clone)]
struct Got {
    id: String,
    occurred_at: Option<DateTime<Utc>>,
    read_at: DateTime<Utc>,
    read_instant: Instant,
}

#[derive(Debug, Default)]
struct Receiver {
    got: Mutex<Vec<Got>>,
}

impl Receiver {
    fn count(&self) -> usize {
        self.got.lock().map_or(0, |g| g.len())
    }

    fn snapshot(&self) -> Vec<Got> {
        self.got.lock().map(|g| g.clone()).unwrap_or_default()
    }
}

/// The figures of one backend.
#[derive(Debug, Clone)]
pub struct WebhookFigures {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Deliveries per phase.
    pub n: usize,
    /// Steady: event timestamp → read by the receiver.
    pub latency: Latencies,
    /// Steady: deliveries per second, first event → last delivery.
    pub steady_per_s: f64,
    /// Steady: notifying events committed per second (first → last event).
    pub events_per_s: f64,
    /// Backlog: deliveries per second from the release to the last delivery.
    pub drain_per_s: f64,
    /// Deliveries missing or received twice (must be 0).
    pub lost_or_duplicated: usize,
}

/// Reads HTTP/1.1 requests on one connection (keep-alive), records each, answers 200 once
/// `open` is true.
async fn serve_connection(
    mut stream: TcpStream,
    receiver: Arc<Receiver>,
    mut open: watch::Receiver<bool>,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0_u8; 16 * 1024];
    loop {
        // The head.
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if buf.len() > MAX_REQUEST {
                return;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if length > MAX_REQUEST {
            return;
        }
        while buf.len() < head_end + length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Value =
            serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or(Value::Null);
        buf.drain(..head_end + length);
        let got = Got {
            id: body["id"].as_str().unwrap_or_default().to_owned(),
            occurred_at: body["occurred_at"]
                .as_str()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc)),
            read_at: Utc::now(),
            read_instant: Instant::now(),
        };
        if open.wait_for(|o| *o).await.is_err() {
            return;
        }
        if let Ok(mut all) = receiver.got.lock() {
            all.push(got);
        }
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    }
}

async fn start_receiver(
    open: watch::Receiver<bool>,
) -> Result<(Arc<Receiver>, String), BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| BenchError::new(format!("receiver bind: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| BenchError::new(format!("receiver address: {e}")))?;
    let receiver = Arc::new(Receiver::default());
    let shared = Arc::clone(&receiver);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_connection(stream, Arc::clone(&shared), open.clone()));
        }
    });
    Ok((receiver, format!("http://{addr}/hook")))
}

async fn start_sessions(client: &Client, n: usize) -> Result<(), BenchError> {
    let mut starts = Vec::new();
    for first in 0..STARTERS {
        let client = client.clone();
        starts.push(tokio::spawn(async move {
            let mut i = first;
            while i < n {
                let mut run =
                    phrony_client::RunSession::new(phrony_client::AgentName::new("support", AGENT));
                run.input = Some(json!({"message": "Refund order ORD-1."}));
                client
                    .run_session(&run, "bench")
                    .await
                    .map_err(|e| BenchError::new(format!("RunSession: {e}")))?;
                i += STARTERS;
            }
            Ok::<_, BenchError>(())
        }));
    }
    for start in starts {
        start
            .await
            .map_err(|e| BenchError::new(format!("a start task failed: {e}")))??;
    }
    Ok(())
}

async fn wait_for(receiver: &Receiver, n: usize, what: &str) -> Result<(), BenchError> {
    let deadline = Instant::now() + GUARD;
    while receiver.count() < n {
        if Instant::now() > deadline {
            return Err(BenchError::new(format!(
                "{what}: only {} of {n} deliveries within {} s",
                receiver.count(),
                GUARD.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Waits until the agent has `n` sessions awaiting approval.
async fn wait_for_parked(client: &Client, n: usize) -> Result<(), BenchError> {
    let deadline = Instant::now() + GUARD;
    loop {
        let mut filter = phrony_client::ApprovalFilter {
            status: Some("pending".to_owned()),
            agent: Some(phrony_client::AgentName::new("support", AGENT)),
            limit: Some(1000),
            ..phrony_client::ApprovalFilter::default()
        };
        let mut count = 0;
        loop {
            let page = client
                .list_approvals(&filter)
                .await
                .map_err(|e| BenchError::new(format!("ListApprovals: {e}")))?;
            count += page.approvals.len();
            match page.next_page_token {
                Some(token) => filter.page_token = Some(token),
                None => break,
            }
        }
        if count >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::new(format!("only {count} of {n} parked")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[allow(
    clippy::cast_precision_loss,
    reason = "delivery counts are far below 2^52"
)]
fn per_s(n: usize, over: Duration) -> f64 {
    if over.is_zero() {
        0.0
    } else {
        n as f64 / over.as_secs_f64()
    }
}

/// Runs both phases on a fresh daemon of `backend`.
///
/// # Errors
/// Setup that fails; a phase that does not finish within its guard.
pub fn run(backend: Backend, n: usize) -> Result<Option<WebhookFigures>, BenchError> {
    let name = backend_name(backend);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError::new(format!("tokio: {e}")))?;
    let (gate, open) = watch::channel(true);
    let (receiver, url) = runtime.block_on(start_receiver(open))?;
    let files = tempfile::tempdir().map_err(|e| BenchError::new(format!("tempdir: {e}")))?;
    let hooks = files.path().join("hooks.yaml");
    std::fs::write(
        &hooks,
        format!(
            "webhooks:\n  - name: bench\n    url: {url}\n    events: [approval.required]\n    \
             secret_env: BENCH_HOOK_SECRET\n    timeout: 60s\n"
        ),
    )
    .map_err(|e| BenchError::new(format!("write {}: {e}", hooks.display())))?;
    let bound = (n * 4).max(10_000).to_string();
    let hooks_file = hooks.display().to_string();
    let mut env = crate::load::daemon_env(&bound);
    env.extend([
        ("RUNTIME_WEBHOOKS_FILE", hooks_file.as_str()),
        ("BENCH_HOOK_SECRET", "bench-secret-0123456789"),
    ]);
    let Some(daemon) = Daemon::start_with_env(backend, &env) else {
        eprintln!("{name}: skipped (PHRONY_TEST_SKIP_POSTGRES=1 and no PostgreSQL)");
        return Ok(None);
    };
    let _agents = crate::load::deploy(&daemon, &[(AGENT, 400)])?;
    runtime.block_on(async {
        let client = Client::connect(daemon.addr())
            .await
            .map_err(|e| BenchError::new(format!("connect {}: {e}", daemon.addr())))?;

        // Steady: deliveries as the events come.
        start_sessions(&client, n).await?;
        wait_for(&receiver, n, "steady").await?;
        let steady = receiver.snapshot();
        let mut latency = Latencies::default();
        let mut first_event: Option<DateTime<Utc>> = None;
        let mut last_event: Option<DateTime<Utc>> = None;
        for got in &steady {
            if let Some(at) = got.occurred_at {
                latency.push((got.read_at - at).to_std().unwrap_or(Duration::ZERO));
                first_event = Some(first_event.map_or(at, |f| f.min(at)));
                last_event = Some(last_event.map_or(at, |l| l.max(at)));
            }
        }
        let last_read = steady.iter().map(|g| g.read_at).max();
        let span = |a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>| match (a, b) {
            (Some(a), Some(b)) => (b - a).to_std().unwrap_or(Duration::ZERO),
            _ => Duration::ZERO,
        };
        let steady_per_s = per_s(n, span(first_event, last_read));
        let events_per_s = per_s(n, span(first_event, last_event));
        eprintln!(
            "{name}: steady {n}: {steady_per_s:.1} deliveries/s ({events_per_s:.1} events/s), \
             commit → receiver p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            latency.p50_us() / 1e3,
            latency.p99_us() / 1e3,
            latency.quantile_us(1.0) / 1e3
        );

        // Backlog: hold the answers while n more park, then drain.
        gate.send_replace(false);
        start_sessions(&client, n).await?;
        wait_for_parked(&client, 2 * n).await?;
        let released = Instant::now();
        gate.send_replace(true);
        wait_for(&receiver, 2 * n, "backlog").await?;
        // A moment more, for duplicates that would still come.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let all = receiver.snapshot();
        let drained = all[n..]
            .iter()
            .map(|g| g.read_instant)
            .max()
            .map_or(Duration::ZERO, |last| {
                last.saturating_duration_since(released)
            });
        let drain_per_s = per_s(n, drained);
        let ids: HashSet<&str> = all.iter().map(|g| g.id.as_str()).collect();
        let lost_or_duplicated = all.len().abs_diff(2 * n) + (all.len() - ids.len());
        eprintln!(
            "{name}: backlog {n}: drained at {drain_per_s:.1} deliveries/s; \
             {lost_or_duplicated} lost or duplicated"
        );
        Ok(Some(WebhookFigures {
            backend: name,
            n,
            latency,
            steady_per_s,
            events_per_s,
            drain_per_s,
            lost_or_duplicated,
        }))
    })
}
