//! Per-test databases for the conformance suite.
//!
//! SQLite: a file in a fresh temporary directory. PostgreSQL: a fresh database
//! `phrony_test_<uuid>` on the server at `PHRONY_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), dropped when the test ends, pass or fail.
//! An unreachable server fails the PostgreSQL tests unless `PHRONY_TEST_SKIP_POSTGRES=1`.

use phrony_ledger::{Backend, Ledger};
use phrony_test_support::postgres::PgDatabase;
use sqlx::postgres::PgPool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use sqlx::{Executor, Row};
use std::str::FromStr;

pub(crate) struct TestDb {
    pub(crate) kind: Backend,
    pub(crate) url: String,
    pub(crate) ledger: Ledger,
    raw: Raw,
    _guard: Guard,
}

enum Raw {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

enum Guard {
    Sqlite(
        #[allow(dead_code, reason = "held so the directory outlives the test")] tempfile::TempDir,
    ),
    Postgres(
        #[allow(
            dead_code,
            reason = "held so the database is dropped when the test ends"
        )]
        PgDatabase,
    ),
}

impl TestDb {
    /// A fresh, unmigrated database, or `None` when PostgreSQL tests are explicitly skipped.
    pub(crate) async fn new(kind: Backend) -> Option<Self> {
        match kind {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("nested").join("ledger.db");
                let url = format!("sqlite://{}", path.display());
                let ledger = Ledger::connect(&url).await.unwrap();
                let raw = SqlitePool::connect_with(
                    SqliteConnectOptions::from_str(&url)
                        .unwrap()
                        .busy_timeout(std::time::Duration::from_secs(10)),
                )
                .await
                .unwrap();
                Some(Self {
                    kind,
                    url,
                    ledger,
                    raw: Raw::Sqlite(raw),
                    _guard: Guard::Sqlite(dir),
                })
            }
            Backend::Postgres => {
                let db = PgDatabase::create().await?;
                let url = db.url().to_owned();
                let guard = Guard::Postgres(db);
                let ledger = Ledger::connect(&url).await.unwrap();
                let raw = PgPool::connect(&url).await.unwrap();
                Some(Self {
                    kind,
                    url,
                    ledger,
                    raw: Raw::Postgres(raw),
                    _guard: guard,
                })
            }
        }
    }

    /// The ledger after applying migrations.
    pub(crate) async fn migrated(&self) -> &Ledger {
        self.ledger.migrate().await.unwrap();
        &self.ledger
    }

    /// Applies the shipped migrations numbered up to `last` only (the schema an older build
    /// left), through sqlx's migrator on copies of the files: the same checksums, so a later
    /// `Ledger::migrate` applies the rest as it would on an upgraded database.
    pub(crate) async fn migrate_up_to(&self, last: i64) {
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(match self.kind {
                Backend::Sqlite => "sqlite",
                Backend::Postgres => "postgres",
            });
        let dir = tempfile::tempdir().unwrap();
        for (number, name) in migration_files(self.kind) {
            if number <= last {
                std::fs::copy(source.join(&name), dir.path().join(&name)).unwrap();
            }
        }
        let migrator = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
        match &self.raw {
            Raw::Sqlite(p) => migrator.run(p).await.unwrap(),
            Raw::Postgres(p) => migrator.run(p).await.unwrap(),
        }
    }

    /// A second, independent connection pool on the same database (another "replica").
    pub(crate) async fn another_ledger(&self) -> Ledger {
        let ledger = Ledger::connect(&self.url).await.unwrap();
        ledger.migrate().await.unwrap();
        ledger
    }

    /// Runs raw SQL (e.g. to tamper with the log the way an attacker with DB access would).
    pub(crate) async fn raw_exec(&self, sql: &str) {
        match &self.raw {
            Raw::Sqlite(p) => {
                p.execute(sql).await.unwrap();
            }
            Raw::Postgres(p) => {
                p.execute(sql).await.unwrap();
            }
        }
    }

    /// Runs raw SQL expected to fail; returns the error text.
    pub(crate) async fn raw_exec_err(&self, sql: &str) -> String {
        let result = match &self.raw {
            Raw::Sqlite(p) => p.execute(sql).await.map(|_| ()),
            Raw::Postgres(p) => p.execute(sql).await.map(|_| ()),
        };
        result
            .expect_err("statement should have been refused")
            .to_string()
    }

    /// Drops the append-only triggers so tests can tamper with the log.
    pub(crate) async fn disable_append_only_guard(&self) {
        match self.kind {
            Backend::Sqlite => {
                self.raw_exec("DROP TRIGGER events_no_update").await;
                self.raw_exec("DROP TRIGGER events_no_delete").await;
            }
            Backend::Postgres => {
                self.raw_exec("ALTER TABLE events DISABLE TRIGGER USER")
                    .await
            }
        }
    }

    /// What a careful attacker does after editing: puts the append-only triggers back as the
    /// migrations created them, so the trigger check sees nothing.
    pub(crate) async fn restore_append_only_guard(&self) {
        match self.kind {
            Backend::Sqlite => {
                self.raw_exec(
                    "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN \
                     SELECT RAISE(ABORT, 'events are append-only: UPDATE refused'); END",
                )
                .await;
                self.raw_exec(
                    "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN \
                     SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END",
                )
                .await;
            }
            Backend::Postgres => {
                self.raw_exec("ALTER TABLE events ENABLE TRIGGER USER")
                    .await
            }
        }
    }

    /// The plan of `sql` (its `$n` parameters bound to `binds`, in order), one line per plan
    /// node, on a connection of its own: SQLite's `EXPLAIN QUERY PLAN` details; on PostgreSQL
    /// `EXPLAIN (COSTS OFF)` with sequential scans priced out (`enable_seqscan = off`), as on
    /// tables too big to scan, so the plan shows which indexes can serve the statement at all.
    pub(crate) async fn explain_without_seqscan(&self, sql: &str, binds: &[&str]) -> Vec<String> {
        use sqlx::Connection as _;
        match self.kind {
            Backend::Sqlite => {
                let explain = format!("EXPLAIN QUERY PLAN {sql}");
                let mut query = sqlx::query(&explain);
                for bind in binds {
                    query = query.bind(*bind);
                }
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                query
                    .fetch_all(&mut conn)
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| r.get::<String, _>("detail"))
                    .collect()
            }
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
                conn.execute("SET enable_seqscan = off").await.unwrap();
                let explain = format!("EXPLAIN (COSTS OFF) {sql}");
                let mut query = sqlx::query(&explain);
                for bind in binds {
                    query = query.bind(*bind);
                }
                query
                    .fetch_all(&mut conn)
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| r.get::<String, _>(0))
                    .collect()
            }
        }
    }

    /// Rows of `sql` with every column read as optional text.
    pub(crate) async fn raw_strings(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        match &self.raw {
            Raw::Sqlite(p) => sqlx::query(sql)
                .fetch_all(p)
                .await
                .unwrap()
                .iter()
                .map(|r| {
                    (0..r.len())
                        .map(|i| r.try_get::<Option<String>, _>(i).unwrap())
                        .collect()
                })
                .collect(),
            Raw::Postgres(p) => sqlx::query(sql)
                .fetch_all(p)
                .await
                .unwrap()
                .iter()
                .map(|r| {
                    (0..r.len())
                        .map(|i| r.try_get::<Option<String>, _>(i).unwrap())
                        .collect()
                })
                .collect(),
        }
    }

    /// Every column of `table`, every row, as text, in a stable order.
    pub(crate) async fn table_snapshot(&self, table: &str) -> Vec<Vec<Option<String>>> {
        let columns_sql = match self.kind {
            Backend::Sqlite => {
                format!("SELECT name FROM pragma_table_info('{table}') ORDER BY cid")
            }
            Backend::Postgres => format!(
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = '{table}' \
                 ORDER BY ordinal_position"
            ),
        };
        let columns: Vec<String> = self
            .raw_strings(&columns_sql)
            .await
            .into_iter()
            .map(|r| r[0].clone().unwrap())
            .collect();
        assert!(!columns.is_empty(), "table {table} has no columns");
        let select = columns
            .iter()
            .map(|c| format!("CAST({c} AS TEXT)"))
            .collect::<Vec<_>>()
            .join(", ");
        self.raw_strings(&format!("SELECT {select} FROM {table} ORDER BY 1"))
            .await
    }
}

/// The migrations shipped in `migrations/<backend>/`, as (number, file name), in order.
pub(crate) fn migration_files(backend: Backend) -> Vec<(i64, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(match backend {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        });
    let mut files: Vec<(i64, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".sql"))
        .map(|name| {
            let number = name
                .split('_')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("migration {name} does not start with its number"));
            (number, name)
        })
        .collect();
    files.sort();
    files
}

/// What `schema_version()` must say after `migrate()`: the number of the last migration file.
pub(crate) fn latest_schema_version(backend: Backend) -> String {
    migration_files(backend)
        .last()
        .map(|(n, _)| n.to_string())
        .expect("at least one migration")
}
