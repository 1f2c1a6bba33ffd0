//! Throw-away PostgreSQL databases: one uniquely named database per test, dropped at the end.
//!
//! ```no_run
//! # async fn demo() {
//! use phrony_test_support::postgres::PgDatabase;
//! let Some(db) = PgDatabase::create().await else { return }; // skipped on request
//! let url = db.url(); // postgres://…/phrony_test_<uuid>
//! # let _ = url;
//! # }
//! ```
//!
//! - The server is the one at `PHRONY_TEST_POSTGRES_URL` (default [`DEFAULT_ADMIN_URL`]); the
//!   test database sits next to the admin database on it, `phrony_test_<uuid>`.
//! - Skip-or-fail: when the server does not answer, [`PgDatabase::create`] fails the test, unless
//!   `PHRONY_TEST_SKIP_POSTGRES=1`, when it returns `None` (and says so on stderr).
//!   [`PgDatabase::try_create`] leaves the choice to its caller (the benchmarks skip).
//! - Dropping a [`PgDatabase`] drops the database `WITH (FORCE)`, which also ends connections
//!   the test left open, pass or fail. It works inside and outside a Tokio runtime.

use std::future::Future;

use sqlx::Connection as _;
use sqlx::postgres::PgConnection;

/// The admin URL used when `PHRONY_TEST_POSTGRES_URL` is not set.
pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The variable naming the PostgreSQL server (an admin URL) the test databases are created on.
pub const ADMIN_URL_VAR: &str = "PHRONY_TEST_POSTGRES_URL";

/// The variable that, set to `1`, turns an unreachable server into a skipped test.
pub const SKIP_VAR: &str = "PHRONY_TEST_SKIP_POSTGRES";

/// The admin URL: `PHRONY_TEST_POSTGRES_URL`, or [`DEFAULT_ADMIN_URL`].
#[must_use]
pub fn admin_url() -> String {
    std::env::var(ADMIN_URL_VAR).unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned())
}

/// Whether PostgreSQL tests may be skipped when the server is unreachable
/// (`PHRONY_TEST_SKIP_POSTGRES=1`).
#[must_use]
pub fn skip_requested() -> bool {
    std::env::var(SKIP_VAR).is_ok_and(|v| v == "1")
}

/// Why a test database could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The server at the admin URL does not answer.
    #[error("PostgreSQL at {admin_url} is unreachable: {error}")]
    Unreachable {
        /// The admin URL tried.
        admin_url: String,
        /// What the driver said.
        error: sqlx::Error,
    },
    /// The server answered but refused `CREATE DATABASE`.
    #[error("CREATE DATABASE failed: {0}")]
    Create(sqlx::Error),
}

/// A fresh, empty database on the test server, dropped when this value is dropped.
#[derive(Debug)]
pub struct PgDatabase {
    name: String,
    url: String,
    admin_url: String,
}

impl PgDatabase {
    /// Creates `phrony_test_<uuid>`. `None` only when the server is unreachable and
    /// `PHRONY_TEST_SKIP_POSTGRES=1`.
    ///
    /// # Panics
    /// When the server is unreachable and skipping was not asked for, or when it refuses to
    /// create the database.
    pub async fn create() -> Option<Self> {
        skip_or_fail(Self::try_create("phrony_test").await)
    }

    /// [`create`](Self::create) for synchronous code (and code already inside a runtime): the
    /// work runs on a thread with its own runtime.
    ///
    /// # Panics
    /// As [`create`](Self::create).
    #[must_use]
    pub fn create_blocking() -> Option<Self> {
        skip_or_fail(on_own_runtime(|| Self::try_create("phrony_test")))
    }

    /// Creates `<prefix>_<uuid>` on the server at [`admin_url`], leaving what to do when the
    /// server is unreachable to the caller.
    ///
    /// # Errors
    /// When the server does not answer, or refuses `CREATE DATABASE`.
    pub async fn try_create(prefix: &str) -> Result<Self, CreateError> {
        let admin_url = admin_url();
        let mut admin =
            PgConnection::connect(&admin_url)
                .await
                .map_err(|error| CreateError::Unreachable {
                    admin_url: admin_url.clone(),
                    error,
                })?;
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .map_err(CreateError::Create)?;
        // The database exists: from here on it is this value's to drop.
        let base = admin_url
            .rsplit_once('/')
            .map_or(admin_url.as_str(), |(base, _)| base);
        let db = Self {
            url: format!("{base}/{name}"),
            name,
            admin_url: admin_url.clone(),
        };
        let _ = admin.close().await;
        Ok(db)
    }

    /// The database's URL, for a ledger or a daemon.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name, `<prefix>_<uuid>`.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Drops the database now, ending its connections (a test of what happens when the database
    /// disappears). Dropping the value afterwards does nothing more.
    ///
    /// # Panics
    /// When the server refuses.
    pub async fn drop_now(&self) {
        if let Err(error) = drop_database(&self.admin_url, &self.name).await {
            panic!("could not drop test database {}: {error}", self.name);
        }
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        // Drop may run inside the test's runtime, which cannot be blocked on: use a thread with
        // its own runtime.
        if let Err(error) =
            on_own_runtime(move || async move { drop_database(&admin_url, &name).await })
        {
            eprintln!(
                "warning: could not drop test database {}: {error}",
                self.name
            );
        }
    }
}

/// `DROP DATABASE IF EXISTS … WITH (FORCE)`: FORCE terminates the connections still open on it.
async fn drop_database(admin_url: &str, name: &str) -> Result<(), sqlx::Error> {
    let mut admin = PgConnection::connect(admin_url).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    admin.close().await
}

/// The skip-or-fail rule shared by every PostgreSQL test.
fn skip_or_fail(created: Result<PgDatabase, CreateError>) -> Option<PgDatabase> {
    match created {
        Ok(db) => Some(db),
        Err(error @ CreateError::Unreachable { .. }) if skip_requested() => {
            eprintln!("skipping PostgreSQL test ({SKIP_VAR}=1): {error}");
            None
        }
        Err(error @ CreateError::Unreachable { .. }) => panic!(
            "{error}; start it, point {ADMIN_URL_VAR} at a server, or set {SKIP_VAR}=1 to skip \
             these tests"
        ),
        Err(error) => panic!("{error}"),
    }
}

/// Runs the future `make` returns to completion on a new thread with its own current-thread
/// runtime, so that it can be called from synchronous code and from inside a runtime alike.
fn on_own_runtime<F, T>(make: impl FnOnce() -> F + Send) -> T
where
    F: Future<Output = T>,
    T: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap_or_else(|e| panic!("cannot build a Tokio runtime: {e}"))
                    .block_on(make())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}
