//! The query plans of the statements the ledger ran on SQLite, for tests and diagnosis.
//!
//! SQLite plans without statistics (the ledger never runs `ANALYZE`), by fixed heuristics: the
//! plan a statement gets on an almost empty database is the plan it gets on a full one. So a
//! workload run on a fresh database shows every statement's plan at scale. The direct
//! connections (`sqlite_raw`) of every ledger of the process record the SQL texts they prepare,
//! once per text (`sqlite_raw::PreparedTexts`, at most 2,048 texts), and
//! [`Ledger::explain_prepared_statements`] explains them on one of its read connections. The conformance
//! case `no_hot_path_statement_scans_a_growing_table` drives the ledger through its API and
//! refuses a full scan of a table that grows with use.

use crate::Ledger;
use crate::db::Pool;
use crate::error::{LedgerError, Result, SqlxResultExt as _};

/// One SQL text the ledger prepared, with its plan.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementPlan {
    /// What the ledger was doing when it first prepared the text (the context its errors name).
    pub context: &'static str,
    /// The text as prepared (one or more statements).
    pub sql: String,
    /// Each statement's `EXPLAIN QUERY PLAN`, in order: one line per plan node, indented two
    /// spaces per level. `Err` says why the text could not be explained outside the
    /// transaction that ran it (it reads a temporary table that transaction created).
    pub plans: std::result::Result<Vec<Vec<String>>, String>,
}

/// What [`Ledger::explain_prepared_statements`] returns.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedPlans {
    /// Every text recorded so far, sorted by context then SQL.
    pub statements: Vec<StatementPlan>,
    /// Preparations of texts left out of the record because it held its bound of 2,048 texts
    /// already (0 unless texts built per call filled it): the record is complete only
    /// when this is 0.
    pub unrecorded: u64,
}

impl Ledger {
    /// The `EXPLAIN QUERY PLAN` of every SQL text the ledgers of this process prepared on
    /// SQLite so far (the group-commit writers' statements and the pooled reads), explained on
    /// this ledger's database file (every ledger's schema is the same once migrated).
    /// For tests and diagnosis: the conformance suite checks that no statement of a hot path
    /// scans a table that grows with use.
    ///
    /// # Errors
    /// [`LedgerError::FailedPrecondition`] on PostgreSQL (whose plans depend on its statistics,
    /// so no fixed plan could be checked; nothing is recorded there) and on an in-memory
    /// SQLite database (read through sqlx's pool, whose statements are not recorded); the
    /// errors of acquiring a read connection.
    #[doc(hidden)]
    pub async fn explain_prepared_statements(&self) -> Result<PreparedPlans> {
        let Pool::Sqlite(_, _, Some(readers)) = &self.pool else {
            return Err(LedgerError::precondition(
                "statement plans are recorded on a SQLite database file only",
            ));
        };
        let (texts, unrecorded) = readers.prepared_texts().snapshot();
        let reader = readers
            .acquire()
            .await
            .ctx("acquire connection to explain statements")?;
        let statements = texts
            .into_iter()
            .map(|(context, sql)| StatementPlan {
                context,
                plans: reader
                    .slot()
                    .explain_query_plan(&sql)
                    .map_err(|e| e.to_string()),
                sql,
            })
            .collect();
        Ok(PreparedPlans {
            statements,
            unrecorded,
        })
    }
}

/// The ledger's statements that join a column holding an id with the key it refers to
/// (`c.session_id = s.id`, `a.call_id = c.call_id`, `c.parent_session_id = t.id`), each with its
/// name, as the ledger sends them. Such an equality compares in the key's collation ("C" on
/// PostgreSQL), which an index of the column in the database's default collation cannot serve;
/// for tests and diagnosis: the conformance case `id_joins_are_served_by_indexes` checks each
/// one's plan on both databases.
#[doc(hidden)]
#[must_use]
pub fn id_join_statements() -> Vec<(&'static str, String)> {
    vec![
        (
            "sessions resting on approvals (start-up recovery)",
            crate::approvals::SESSIONS_RESTING_ON_APPROVALS.to_owned(),
        ),
        (
            "session subtree (timeline)",
            crate::rows::session_subtree_sql(),
        ),
    ]
}
