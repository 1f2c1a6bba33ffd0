//! Baselines measured in the same run: what the hardware and the RPC stack allow.

use std::time::{Duration, Instant};

use phrony_client::Client;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions as _, Connection as _};

use crate::BenchError;
use crate::stats::Latencies;

/// Durable SQLite commits per second with the daemon's settings (WAL, `synchronous=FULL`), one
/// small row per transaction, one connection, for `phase`, in a temporary directory (the same
/// filesystem as the daemons' databases).
///
/// # Errors
/// The database cannot be created or written.
pub(crate) fn raw_durable_commits(phase: Duration) -> Result<f64, BenchError> {
    let dir = tempfile::tempdir().map_err(|e| BenchError::new(format!("tempdir: {e}")))?;
    let path = dir.path().join("raw.db");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::new(format!("tokio: {e}")))?;
    runtime.block_on(async move {
        let fail = |what: &str, e: sqlx::Error| BenchError::new(format!("raw SQLite {what}: {e}"));
        let mut conn = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .connect()
            .await
            .map_err(|e| fail("open", e))?;
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
            .execute(&mut conn)
            .await
            .map_err(|e| fail("create", e))?;
        let started = Instant::now();
        let mut commits: u64 = 0;
        while started.elapsed() < phase {
            let mut tx = conn.begin().await.map_err(|e| fail("begin", e))?;
            sqlx::query("INSERT INTO t (body) VALUES ('{\"event\":\"tool.completed\"}')")
                .execute(&mut *tx)
                .await
                .map_err(|e| fail("insert", e))?;
            tx.commit().await.map_err(|e| fail("commit", e))?;
            commits += 1;
        }
        conn.close().await.map_err(|e| fail("close", e))?;
        Ok(commits as f64 / started.elapsed().as_secs_f64())
    })
}

/// `samples` sequential unary round trips (`Health/Check`) to the daemon behind `client`.
///
/// # Errors
/// A failed call.
pub(crate) async fn unary_rtt(client: &Client, samples: usize) -> Result<Latencies, BenchError> {
    let mut latencies = Latencies::default();
    for _ in 0..samples {
        let started = Instant::now();
        client
            .health()
            .await
            .map_err(|e| BenchError::new(format!("health check: {e}")))?;
        latencies.push(started.elapsed());
    }
    Ok(latencies)
}

/// `samples` sequential round trips on one bidirectional stream to the daemon at `addr`: a
/// `Work` stream registered as a worker of a tool no agent binds, each `WorkHeartbeat`
/// answered by a `WorkHeartbeatAck` (the daemon answers it in memory). This is the floor of
/// any message the daemon exchanges with a worker: the invoke, the result, the ack.
///
/// # Errors
/// The stream cannot be opened, the registration is refused, or the stream ends.
pub(crate) async fn bidi_rtt(addr: &str, samples: usize) -> Result<Latencies, BenchError> {
    use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
    use phrony_proto::runtime::v1::{
        WorkClientMsg, WorkHandlerAdvertisement, WorkHeartbeat, WorkRegister, WorkServerMsg,
        work_client_msg, work_server_msg,
    };

    let fail = |what: &str, e: &dyn std::fmt::Display| {
        BenchError::new(format!("bidi round trip: {what}: {e}"))
    };
    let mut client = RuntimeClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| fail("connect", &e))?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let register = WorkClientMsg {
        body: Some(work_client_msg::Body::Register(WorkRegister {
            worker_id: "bench-bidi-rtt".to_owned(),
            workload_identity: "bench/bidi-rtt".to_owned(),
            handlers: vec![WorkHandlerAdvertisement {
                tool: "bench.rtt".to_owned(),
                version: "1.0.0".to_owned(),
                ..WorkHandlerAdvertisement::default()
            }],
            ..WorkRegister::default()
        })),
    };
    tx.send(register).await.map_err(|e| fail("register", &e))?;
    let mut stream = client
        .work(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|e| fail("open the Work stream", &e))?
        .into_inner();
    let mut next = async || -> Result<work_server_msg::Body, BenchError> {
        match stream.message().await {
            Ok(Some(WorkServerMsg { body: Some(body) })) => Ok(body),
            Ok(Some(_)) => Err(BenchError::new("bidi round trip: an empty message")),
            Ok(None) => Err(BenchError::new(
                "bidi round trip: the daemon closed the stream",
            )),
            Err(e) => Err(fail("receive", &e)),
        }
    };
    match next().await? {
        work_server_msg::Body::Registered(_) => {}
        other => {
            return Err(BenchError::new(format!(
                "bidi round trip: expected the registration, got {other:?}"
            )));
        }
    }
    let mut latencies = Latencies::default();
    for _ in 0..samples {
        let started = Instant::now();
        tx.send(WorkClientMsg {
            body: Some(work_client_msg::Body::Heartbeat(WorkHeartbeat {})),
        })
        .await
        .map_err(|e| fail("send", &e))?;
        loop {
            if let work_server_msg::Body::HeartbeatAck(_) = next().await? {
                break;
            }
        }
        latencies.push(started.elapsed());
    }
    Ok(latencies)
}
