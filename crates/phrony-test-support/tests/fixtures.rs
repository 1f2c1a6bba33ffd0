//! The fault fixtures do what the fault tests rely on: a private cluster that loses its clients
//! when stopped and keeps its committed data across an immediate (crash) stop; a small
//! filesystem on which writes fail once filled and succeed once freed; an SQLite write lock that
//! makes other writers fail past their busy timeout until it is released.

#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::io::Write as _;
use std::time::Duration;

use phrony_test_support::private_postgres::{PrivatePostgres, StopMode};
use phrony_test_support::small_fs::SmallFs;
use phrony_test_support::sqlite_lock::SqliteWriteLock;
use sqlx::{Connection as _, Executor as _, Row as _};

#[tokio::test]
async fn a_private_cluster_keeps_committed_rows_across_a_crash_and_a_restart() {
    let Some(mut pg) = PrivatePostgres::start() else {
        return;
    };
    assert_ne!(pg.port(), 5432, "the shared server's port");
    let url = pg.create_database("fixture");
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    conn.execute("CREATE TABLE t (v int)").await.unwrap();
    conn.execute("INSERT INTO t VALUES (1), (2)").await.unwrap();

    // An immediate stop is a crash: the open connection is lost, new ones are refused.
    pg.stop(StopMode::Immediate);
    assert!(!pg.is_running());
    assert!(conn.execute("SELECT 1").await.is_err());
    assert!(sqlx::PgConnection::connect(&url).await.is_err());

    // Started again on the same port: the committed rows are there (WAL replay).
    pg.start_again();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let row = sqlx::query("SELECT count(*) AS n FROM t")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(row.get::<i64, _>("n"), 2);
    conn.close().await.unwrap();

    // A fast restart too.
    pg.restart(StopMode::Fast);
    let mut conn = sqlx::PgConnection::connect(&pg.url()).await.unwrap();
    conn.execute("SELECT 1").await.unwrap();
    conn.close().await.unwrap();
    let dir = pg.dir().to_path_buf();
    drop(pg);
    assert!(!dir.exists(), "the cluster's directory was left behind");
}

#[test]
fn a_small_filesystem_refuses_writes_when_filled_and_takes_them_when_freed() {
    let Some(mut fs) = SmallFs::mount(4) else {
        return;
    };
    let probe = fs.path().join("probe");
    std::fs::write(&probe, b"before").unwrap();
    let added = fs.fill();
    assert!(
        added > 3 * 1024 * 1024,
        "filled only {added} bytes of 4 MiB"
    );
    assert_eq!(fs.available_bytes(), Some(0));
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&probe)
        .unwrap();
    let refused = file
        .write_all(&[0u8; 8192])
        .and_then(|()| file.sync_all())
        .expect_err("a write on a full filesystem");
    assert_eq!(refused.raw_os_error(), Some(28), "{refused}"); // ENOSPC
    fs.free();
    file.write_all(&[0u8; 8192]).unwrap();
    file.sync_all().unwrap();
    drop(file);
    let mount = fs.path().to_path_buf();
    drop(fs);
    assert!(!mount.exists(), "the mount point was left behind");
}

#[tokio::test]
async fn an_sqlite_write_lock_makes_writers_time_out_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_millis(300));
    let mut writer = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    writer.execute("CREATE TABLE t (v int)").await.unwrap();

    let lock = SqliteWriteLock::hold(&path).unwrap();
    let refused = writer
        .execute("INSERT INTO t VALUES (1)")
        .await
        .expect_err("the write lock is held elsewhere");
    assert!(refused.to_string().contains("locked"), "{refused}");
    lock.release();
    writer.execute("INSERT INTO t VALUES (1)").await.unwrap();
    writer.close().await.unwrap();
}
