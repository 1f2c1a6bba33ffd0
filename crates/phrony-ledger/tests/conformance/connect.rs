//! Connection-string handling and connection errors.

use phrony_ledger::{Backend, Ledger, LedgerError, LedgerOptions};
use std::time::Duration;

#[tokio::test]
async fn unsupported_scheme_is_a_clear_config_error() {
    match Ledger::connect("mysql://root@localhost/db").await {
        Err(LedgerError::Config { message }) => assert_eq!(
            message,
            "unsupported database URL scheme \"mysql\"; use sqlite://… or postgres://…"
        ),
        other => panic!("expected Config error, got {other:?}"),
    }
    match Ledger::connect("phrony.db").await {
        Err(LedgerError::Config { message }) => {
            assert!(
                message.contains("has no scheme; use sqlite://… or postgres://…"),
                "{message}"
            );
        }
        other => panic!("expected Config error, got {other:?}"),
    }
}

#[tokio::test]
async fn unreachable_postgres_names_the_address_without_the_password() {
    let options = LedgerOptions {
        acquire_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    // Port 1 on localhost: nothing listens there.
    let err = Ledger::connect_with("postgres://phrony:hunter2@127.0.0.1:1/phrony", options)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LedgerError::Unavailable { .. }), "{err:?}");
    assert!(
        text.contains("cannot connect to PostgreSQL at postgres://phrony:***@127.0.0.1:1/phrony"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
    // The driver's real reason is kept (not a generic pool timeout).
    assert!(text.contains("refused"), "{text}");
}

#[tokio::test]
async fn bad_sqlite_options_are_config_errors() {
    match Ledger::connect("sqlite://x.db?mode=sideways").await {
        Err(LedgerError::Config { message }) => assert!(message.contains("mode"), "{message}"),
        other => panic!("expected Config error, got {other:?}"),
    }
}

#[tokio::test]
async fn sqlite_file_is_created_with_its_directories() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a").join("b").join("phrony.db");
    let ledger = Ledger::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    ledger.migrate().await.unwrap();
    assert!(path.exists());
    assert_eq!(ledger.backend(), Backend::Sqlite);
    let latest = crate::harness::latest_schema_version(Backend::Sqlite);
    assert_eq!(
        ledger.schema_version().await.unwrap().as_deref(),
        Some(latest.as_str())
    );
}

#[tokio::test]
async fn relative_sqlite_path_and_in_memory_work() {
    // `sqlite://./phrony.db` is relative to the working directory (the crate dir under cargo
    // test); use a unique relative path inside a temp dir instead of polluting it.
    let dir = tempfile::tempdir().unwrap();
    let cwd = std::env::current_dir().unwrap();
    let rel = pathdiff(dir.path(), &cwd).join("rel.db");
    let ledger = Ledger::connect(&format!("sqlite://./{}", rel.display()))
        .await
        .unwrap();
    ledger.migrate().await.unwrap();
    assert!(dir.path().join("rel.db").exists());

    let memory = Ledger::connect("sqlite::memory:").await.unwrap();
    memory.migrate().await.unwrap();
    memory.ping().await.unwrap();
    assert_eq!(
        memory.schema_version().await.unwrap().as_deref(),
        Some(crate::harness::latest_schema_version(Backend::Sqlite).as_str())
    );
}

/// `target` relative to `base` using `..` components (both absolute).
fn pathdiff(target: &std::path::Path, base: &std::path::Path) -> std::path::PathBuf {
    let t: Vec<_> = target.components().collect();
    let b: Vec<_> = base.components().collect();
    let common = t.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = std::path::PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out
}

#[tokio::test]
async fn sqlite_directory_that_cannot_be_created_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let url = format!("sqlite://{}/phrony.db", file.display());
    match Ledger::connect(&url).await {
        Err(LedgerError::Config { message }) => {
            assert!(message.starts_with("cannot create directory"), "{message}");
            assert!(message.contains("not-a-dir"), "{message}");
        }
        other => panic!("expected Config error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("garbage.db");
    std::fs::write(&file, vec![b'z'; 4096]).unwrap();
    let err = Ledger::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LedgerError::Unavailable { .. }), "{err:?}");
    assert!(
        text.contains("cannot open SQLite database") && text.contains("not a database"),
        "{text}"
    );
}

/// Both backends ship the same migrations, numbered 1, 2, 3, … without gaps, so the schema
/// version (the last number) means the same schema on both, and a migration added to one
/// backend only fails here.
#[test]
fn both_backends_ship_the_same_gap_free_migrations() {
    let sqlite = crate::harness::migration_files(Backend::Sqlite);
    let postgres = crate::harness::migration_files(Backend::Postgres);
    assert_eq!(
        sqlite, postgres,
        "the migration files differ between the backends"
    );
    let numbers: Vec<i64> = sqlite.iter().map(|(n, _)| *n).collect();
    let expected: Vec<i64> = (1..=i64::try_from(numbers.len()).unwrap()).collect();
    assert_eq!(
        numbers, expected,
        "migration numbers must run 1, 2, 3, … without gaps"
    );
}

/// A database migrated by a build whose last migration set `schema_version` by hand (`2`, the
/// value 0002 wrote and 0004–0006 never moved) reads the last migration's number after this
/// build migrates it.
#[tokio::test]
async fn a_stale_schema_version_is_corrected_by_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("stale.db").display()
    );
    let ledger = Ledger::connect(&url).await.unwrap();
    ledger.migrate().await.unwrap();
    let raw = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query("UPDATE runtime_meta SET value = '2' WHERE key = 'schema_version'")
        .execute(&raw)
        .await
        .unwrap();
    assert_eq!(ledger.schema_version().await.unwrap().as_deref(), Some("2"));
    ledger.migrate().await.unwrap();
    assert_eq!(
        ledger.schema_version().await.unwrap().as_deref(),
        Some(crate::harness::latest_schema_version(Backend::Sqlite).as_str())
    );
}
