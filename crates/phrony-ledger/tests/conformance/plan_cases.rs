//! Query plans on SQLite: no statement of a hot path reads a table that grows with use whole
//! (issue #14: 100,000 sessions parked in `awaiting_approval`).
//!
//! SQLite plans without statistics (the ledger never runs `ANALYZE`), by fixed heuristics, so
//! the plan a statement gets on an almost empty database is the plan it gets on a full one: the
//! case drives a workload on small databases, then explains every SQL text the ledgers of the
//! process prepared (`Ledger::explain_prepared_statements`) and reads the plans.

use std::collections::{BTreeMap, BTreeSet};

use phrony_ledger::{Backend, StatementPlan};

use crate::harness::TestDb;

/// Tables whose rows grow with use: per session, event, call, approval, vote, notification or
/// history fact, so that a statement reading one whole costs more the longer the daemon runs
/// (decided from `migrations/sqlite`).
const GROWING: &[&str] = &[
    "streams",
    "events",
    "chain_heads",
    "sessions",
    "session_metadata",
    "session_secrets",
    "session_leases",
    "session_inbox",
    "tool_invocations",
    "approvals",
    "approval_votes",
    "shadow_decisions",
    "webhook_outbox",
    "webhook_deliveries",
    "history_groups",
    "history_entries",
    "history_buckets",
];

/// Tables that grow only with what operators publish, deploy or configure (agents, bundles,
/// tokens), or hold a bounded number of rows (one per replica and handler, per agent, or one).
const NOT_GROWING: &[&str] = &[
    "runtime_meta",
    "stream_set",
    "stream_set_shards",
    "health_probe",
    "agents",
    "agent_versions",
    "deployments",
    "bundles",
    "bundle_versions",
    "bundle_members",
    "bundle_deployments",
    "api_tokens",
    "replica_handlers",
    "agent_live_sessions",
];

/// Columns holding a state or a type, whose every value is shared by many rows: an equality on
/// them alone selects a whole class of rows (every pending approval), not one owner's.
const STATE_COLUMNS: &[&str] = &["status", "state", "type", "kind", "mode"];

/// A statement allowed to read a growing table whole: every finding of the statement's plans
/// must name `reads` (an index, so that the allowance does not cover another plan).
struct Allowed {
    context: &'static str,
    reads: &'static str,
    reason: &'static str,
}

const ALLOWED: &[Allowed] = &[
    // Operators' paged listings: a page follows an index's order or sorts what its filter
    // selects; none runs on a session's, a call's or an approval's path.
    Allowed {
        context: "list sessions",
        reads: "",
        reason: "paged listing for operators (console, CLI); filters choose the index",
    },
    Allowed {
        context: "list approvals",
        reads: "",
        reason: "paged listing for operators and approval watchers, in created_at order",
    },
    Allowed {
        context: "list webhook deliveries",
        reads: "",
        reason: "paged listing for operators (`phrony webhooks deliveries`)",
    },
    // The metrics scrape's counts (ARCHITECTURE.md: the one unpaged read on the runtime's
    // thread).
    Allowed {
        context: "count sessions by status",
        reads: "sessions_status_updated",
        reason: "metrics scrape: a count per status over the (status, updated_at) index",
    },
    Allowed {
        context: "count pending approvals",
        reads: "approvals_status_created",
        reason: "metrics scrape: the pending approvals are what it counts",
    },
    Allowed {
        context: "count pending webhook deliveries by webhook",
        reads: "webhook_deliveries_by_status",
        reason: "metrics scrape: the pending deliveries are what it counts",
    },
    // Start-up recovery reads the set it recovers, once per start.
    Allowed {
        context: "list sessions resting on pending approvals",
        reads: "sessions_status_updated",
        reason: "start-up recovery: exactly the sessions awaiting approval, in one query",
    },
    Allowed {
        context: "list sessions to recover",
        reads: "sessions_live_created",
        reason: "start-up recovery: pages through the live sessions only (partial index)",
    },
    Allowed {
        context: "purge orphan secrets",
        reads: "",
        reason: "start-up, once: secrets are held only by live sessions",
    },
    Allowed {
        context: "list handed-off sessions",
        reads: "session_leases_handed_off",
        reason: "sorts only the sessions being handed off (partial index)",
    },
    // Hourly maintenance of the webhook rows kept for WEBHOOK_RETENTION.
    Allowed {
        context: "prune delivered webhook deliveries",
        reads: "webhook_deliveries_by_status",
        reason: "hourly prune: the delivered rows of the 7-day retention",
    },
    Allowed {
        context: "prune webhook outbox",
        reads: "webhook_outbox",
        reason: "hourly prune: outbox rows of the 7-day retention and of failed deliveries",
    },
    // The audit: chains, heads and projections are verified whole by design.
    Allowed {
        context: "count streams",
        reads: "streams",
        reason: "audit start-up check and verification: the sealed stream set's count",
    },
    Allowed {
        context: "count sealed heads",
        reads: "chain_heads",
        reason: "audit start-up check and verification: every sealed head",
    },
    Allowed {
        context: "find deleted streams",
        reads: "chain_heads",
        reason: "audit start-up check and verification: a sealed head without its stream",
    },
    Allowed {
        context: "drop heads of deleted streams",
        reads: "chain_heads",
        reason: "audit: re-sealing a log an operator chose to serve unverified",
    },
    Allowed {
        context: "list streams",
        reads: "streams",
        reason: "audit verification and export: every stream's chain",
    },
    Allowed {
        context: "snapshot projection",
        reads: "",
        reason: "audit verification: copies each projection to re-fold and compare it",
    },
    Allowed {
        context: "read stored projection row",
        reads: "",
        reason: "audit verification: the first row that differs, from its temporary copy",
    },
    Allowed {
        context: "read re-folded projection row",
        reads: "",
        reason: "audit verification: the first row that differs, named in its report",
    },
    Allowed {
        context: "restore append-only triggers",
        reads: "",
        reason: "audit override: DDL (no plan; a trigger it re-creates exists at explain time)",
    },
    Allowed {
        context: "shadow projection",
        reads: "",
        reason: "audit verification: DDL of the temporary shadows it re-folds into (no plan)",
    },
    Allowed {
        context: "compare projection",
        reads: "",
        reason: "audit verification: compares its temporary copies (not explainable outside)",
    },
    // The projection rebuild (and the audit's re-fold) replays every stream.
    Allowed {
        context: "list projection streams",
        reads: "",
        reason: "projection rebuild: every stream that projects",
    },
    Allowed {
        context: "wipe sessions",
        reads: "",
        reason: "projection rebuild",
    },
    Allowed {
        context: "wipe session metadata",
        reads: "",
        reason: "projection rebuild",
    },
    Allowed {
        context: "wipe tool calls",
        reads: "",
        reason: "projection rebuild",
    },
    Allowed {
        context: "wipe approvals",
        reads: "",
        reason: "projection rebuild",
    },
    Allowed {
        context: "wipe approval votes",
        reads: "",
        reason: "projection rebuild",
    },
    Allowed {
        context: "wipe agent versions",
        reads: "",
        reason: "projection rebuild (the foreign-key checks of the wipe)",
    },
];

/// Statements of the hot paths the workload must have run, so that the check cannot pass on a
/// workload that stopped reaching them.
const HOT_PATHS: &[&str] = &[
    "append events",
    "lock stream",
    "project session",
    "project session status",
    "find pending approvals",
    "project approval",
    "project approval decision",
    "list due approvals",
    "read next approval expiry",
    "list sessions whose approval wait was decided",
    "project tool call dispatched",
    "project tool call completed",
    "list sessions to recover",
    "list sessions resting on pending approvals",
    "claim webhook deliveries",
    "read claimed deliveries",
    "queue a user message",
    "take a queued user message",
    "acquire session lease",
    "renew session leases",
];

/// Runs conformance cases, each on a fresh SQLite database: together they create, run, park,
/// approve, expire, cancel and recover sessions, record and dispatch calls, queue user messages,
/// lease and hand off sessions, publish and run bundles, reserve and read history, send
/// webhooks, record shadow decisions, issue tokens and verify and rebuild the log.
async fn drive_workload() {
    macro_rules! workload {
        ($($case:ident),* $(,)?) => {
            $(
                let db = TestDb::new(Backend::Sqlite).await.expect("SQLite is always available");
                // On the heap: dozens of cases inline in one future outgrow a test thread's
                // stack in debug builds.
                Box::pin(crate::cases::$case(&db)).await;
            )*
        };
    }
    workload!(
        session_lifecycle_records_every_transition,
        a_session_opens_with_its_first_events_in_one_transaction,
        a_model_step_commits_its_completion_status_and_calls_together,
        the_calls_of_a_completion_are_recorded_together,
        child_sessions_follow_their_parent,
        live_sessions_per_agent_are_bounded,
        list_sessions_filters_and_paginates_stably,
        tool_calls_follow_the_ledger_state_machine,
        queue_and_dispatch_is_one_write,
        a_late_result_closes_a_recovery_approval,
        outcome_reviews_are_resolved_not_approved,
        a_call_cancelled_after_dispatch_keeps_its_late_result,
        approval_quorum_counts_distinct_actors_and_keeps_edited_args,
        approval_timeouts_apply_their_default,
        approvals_close_when_their_session_ends,
        approvals_list_filters_and_paginates,
        a_pending_approval_survives_a_restart,
        decided_waits_are_found_by_decision_time,
        sessions_resting_on_approvals_are_found_in_one_query,
        sessions_to_recover_are_read_page_by_page,
        retire_and_archive_end_the_sessions_of_their_versions,
        secrets_are_sealed_and_purged_on_terminal_transitions,
        rebuild_reproduces_session_projections_exactly,
        tokens_are_stored_hashed_found_by_hash_and_revoked,
        descriptor_pins_follow_versions_and_refusals_are_audited,
        shadow_decisions_are_recorded_once_indexed_and_verified,
        a_clean_log_verifies_with_the_exact_count,
        a_recomputed_chain_fails_the_sealed_head,
        an_edited_vote_is_a_projection_difference,
        an_existing_log_is_sealed_once_and_keyless_writes_are_caught,
        a_bundle_session_runs_the_root_member_and_lists_by_kind,
        bundle_deploy_rollback_and_history_follow_the_rules,
        history_reservations_commit_release_and_are_idempotent,
        history_window_max_follows_releases_and_results,
        history_prune_keeps_what_a_window_sees_and_reserved_entries,
        webhook_outbox_rows_commit_with_their_event,
        webhook_deliveries_follow_their_state_machine,
        deliveries_of_unconfigured_webhooks_fail_with_their_audit,
        a_session_lease_is_acquired_renewed_expired_and_taken_over,
        a_session_is_handed_to_the_replica_whose_workers_serve_its_tool,
        sessions_leased_elsewhere_answers_a_mixed_page_in_one_read,
        user_messages_queue_for_the_driving_replica_and_are_recorded_once,
    );
}

/// What the plans of one SQL text do that reads a growing table whole.
/// Indexes of growing tables that no statement of the workload reads on SQLite, each with why it
/// is kept: every other index is read by some statement, for an index costs every write of its
/// table an entry (migration 0023 dropped the three the governed path wrote and nothing read).
/// Indexes SQLite makes for a `PRIMARY KEY` or `UNIQUE` constraint enforce it and are not listed.
const UNREAD_INDEXES: &[(&str, &str)] = &[
    (
        "session_metadata_pair",
        "PostgreSQL, with statistics, can drive a selective metadata filter of the session list \
         from it; written only for sessions that carry metadata",
    ),
    (
        "sessions_agent_live",
        "start-up recovery's scan of live sessions and the rebuild's purge of orphan secrets \
         read it once the table has statistics (migration 0020); holds live sessions only",
    ),
];

/// The indexes no explained statement reads are exactly [`UNREAD_INDEXES`].
fn unread_indexes_are_only_the_listed_ones(
    statements: &[StatementPlan],
    table_of_index: &BTreeMap<String, String>,
) {
    let mut read = BTreeSet::new();
    for line in statements
        .iter()
        .filter_map(|text| text.plans.as_ref().ok())
        .flatten()
        .flatten()
    {
        // `SEARCH t USING INDEX i (…)`, `USING COVERING INDEX i`, `SCAN t USING INDEX i`, and
        // `USING INDEX i FOR IN-OPERATOR`.
        for (_, rest) in line
            .match_indices("INDEX ")
            .map(|(at, _)| line.split_at(at + 6))
        {
            if let Some(name) = rest.split_whitespace().next() {
                read.insert(name.to_owned());
            }
        }
    }
    let unread: BTreeSet<&str> = table_of_index
        .iter()
        .filter(|(index, table)| {
            GROWING.contains(&table.as_str())
                && !index.starts_with("sqlite_autoindex_")
                && !read.contains(*index)
        })
        .map(|(index, _)| index.as_str())
        .collect();
    let listed: BTreeSet<&str> = UNREAD_INDEXES.iter().map(|(index, _)| *index).collect();
    assert!(
        unread.is_subset(&listed),
        "indexes of growing tables that no statement reads (each costs every write of its \
         table; drop it or list it in UNREAD_INDEXES with the reason): {:?}",
        unread.difference(&listed).collect::<Vec<_>>()
    );
    assert!(
        listed.is_subset(&unread),
        "indexes in UNREAD_INDEXES that a statement reads now, or that no longer exist: remove \
         them from the list: {:?}",
        listed.difference(&unread).collect::<Vec<_>>()
    );
}

fn findings(text: &StatementPlan, table_of_index: &BTreeMap<String, String>) -> Vec<String> {
    let plans = match &text.plans {
        Ok(plans) => plans,
        Err(error) => return vec![format!("cannot be explained: {error}")],
    };
    let aliases = aliases(&text.sql);
    let mut found = Vec::new();
    for plan in plans {
        let nodes: Vec<(usize, &str)> = plan
            .iter()
            .map(|line| {
                let detail = line.trim_start();
                ((line.len() - detail.len()) / 2, detail)
            })
            .collect();
        for (i, &(depth, detail)) in nodes.iter().enumerate() {
            if let Some(access) = Access::parse(detail, &aliases, table_of_index) {
                if access.scan {
                    found.push(format!("`{detail}` reads every row of {}", access.table));
                } else if access.walks(&text.sql) {
                    found.push(format!(
                        "`{detail}` reads every row of {} in one state",
                        access.table
                    ));
                }
            } else if detail == "USE TEMP B-TREE FOR ORDER BY" {
                // The rows sorted are those its siblings read (the nodes of the same query).
                let unkeyed: Vec<&str> = siblings(&nodes, i, depth)
                    .filter(|sibling| {
                        Access::parse(sibling, &aliases, table_of_index)
                            .is_some_and(|a| !a.keyed(&text.sql))
                    })
                    .collect();
                if !unkeyed.is_empty() {
                    found.push(format!(
                        "`{detail}` sorts every row that `{}` reads",
                        unkeyed.join("`, `")
                    ));
                }
            }
        }
    }
    found
}

/// The details of the nodes at `depth` under the same parent as node `at`, itself excepted.
fn siblings<'a>(
    nodes: &'a [(usize, &'a str)],
    at: usize,
    depth: usize,
) -> impl Iterator<Item = &'a str> {
    let start = nodes[..at]
        .iter()
        .rposition(|&(d, _)| d < depth)
        .map_or(0, |p| p + 1);
    let end = nodes[at..]
        .iter()
        .position(|&(d, _)| d < depth)
        .map_or(nodes.len(), |p| at + p);
    nodes[start..end]
        .iter()
        .enumerate()
        .filter(move |&(i, &(d, _))| d == depth && start + i != at)
        .map(|(_, &(_, detail))| detail)
}

/// A plan node that reads a growing table: `SCAN t …` or `SEARCH t USING … (constraints)`.
struct Access {
    table: String,
    scan: bool,
    /// The constraints of a search (`status=?`, `expires_at>?`); empty for a scan, and for
    /// the one-row seek of a `MIN`/`MAX`.
    constraints: Vec<String>,
}

impl Access {
    fn parse(
        detail: &str,
        aliases: &BTreeMap<String, String>,
        table_of_index: &BTreeMap<String, String>,
    ) -> Option<Self> {
        let (scan, rest) = if let Some(rest) = detail.strip_prefix("SCAN ") {
            (true, rest)
        } else {
            (false, detail.strip_prefix("SEARCH ")?)
        };
        let name = rest.split(' ').next()?;
        let index = ["USING INDEX ", "USING COVERING INDEX "]
            .iter()
            .find_map(|using| rest.split_once(using))
            .and_then(|(_, after)| after.split(' ').next());
        // An index names its table; without one the plan names the table or its alias.
        let table = index
            .and_then(|index| table_of_index.get(index))
            .or_else(|| aliases.get(name))
            .map_or(name, String::as_str);
        if !GROWING.contains(&table) {
            return None;
        }
        let constraints = rest
            .split_once(" (")
            .and_then(|(_, after)| after.split_once(')'))
            .map(|(inside, _)| inside.split(" AND ").map(str::to_owned).collect())
            .unwrap_or_default();
        Some(Self {
            table: table.to_owned(),
            scan,
            constraints,
        })
    }

    /// Whether an equality on a column that is not a state selects the rows (one session's,
    /// one call's): what bounds them. An `IS NULL` test shows as `col=?`: a column the SQL
    /// tests for NULL does not count.
    fn keyed(&self, sql: &str) -> bool {
        !self.scan
            && self.constraints.iter().any(|c| {
                c.strip_suffix("=?").is_some_and(|column| {
                    !STATE_COLUMNS.contains(&column) && !tests_null(sql, column)
                })
            })
    }

    /// Whether the node reads every row of its table, or every row in one state: a scan, or
    /// a search by nothing but states (no key, no range).
    fn walks(&self, sql: &str) -> bool {
        self.scan
            || (!self.constraints.is_empty()
                && !self.keyed(sql)
                && !self
                    .constraints
                    .iter()
                    .any(|c| c.contains('>') || c.contains('<')))
    }
}

/// Whether the SQL compares `column` (alone, or after an alias and a dot) with `IS NULL`.
fn tests_null(sql: &str, column: &str) -> bool {
    let test = format!("{column} IS NULL");
    sql.match_indices(&test)
        .any(|(at, _)| !sql[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
}

/// The tables the SQL names after `FROM`, `JOIN`, `UPDATE` and `INTO`, by their alias (and by
/// their own name), as the plan names them.
fn aliases(sql: &str) -> BTreeMap<String, String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    for c in sql.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            tokens.push(std::mem::take(&mut word));
        }
        if matches!(c, ',' | '(' | ')') {
            tokens.push(c.to_string());
        }
    }
    tokens.extend((!word.is_empty()).then_some(word));
    let name = |t: Option<&String>| {
        t.filter(|t| {
            t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && ![
                    "WHERE",
                    "JOIN",
                    "LEFT",
                    "INNER",
                    "CROSS",
                    "ON",
                    "SET",
                    "ORDER",
                    "GROUP",
                    "LIMIT",
                    "VALUES",
                    "USING",
                    "UNION",
                    "EXCEPT",
                    "SELECT",
                    "AS",
                    "DEFAULT",
                    "RETURNING",
                    "WITH",
                ]
                .contains(&t.to_ascii_uppercase().as_str())
        })
        .cloned()
    };
    let mut map = BTreeMap::new();
    let mut i = 0;
    while i < tokens.len() {
        let names_tables =
            ["FROM", "JOIN", "UPDATE", "INTO"].contains(&tokens[i].to_ascii_uppercase().as_str());
        i += 1;
        if !names_tables {
            continue;
        }
        // `table [AS] [alias]`, then more after a comma.
        while let Some(table) = name(tokens.get(i)) {
            map.insert(table.clone(), table.clone());
            i += 1;
            if tokens.get(i).is_some_and(|t| t.eq_ignore_ascii_case("AS")) {
                i += 1;
            }
            if let Some(alias) = name(tokens.get(i)) {
                map.insert(alias, table);
                i += 1;
            }
            if tokens.get(i).is_some_and(|t| t == ",") {
                i += 1;
            } else {
                break;
            }
        }
    }
    map
}

/// Every SQL statement the ledger ran on SQLite through a broad workload — sessions created,
/// driven, parked, approved, expired, cancelled and recovered, calls recorded, dispatched and
/// completed, user messages queued and taken, leases acquired, renewed, taken over and handed
/// off, bundles, history, webhooks, shadow decisions, tokens, the audit and the rebuild — is
/// explained, and none reads a table that grows with use whole (a `SCAN`, a `SEARCH` keyed only
/// by a state such as `status=?`, or a `USE TEMP B-TREE FOR ORDER BY` over the rows of such a
/// read or of a range), except the allowed statements below, each with its reason (operators'
/// listings, the metrics scrape, start-up recovery's own set, hourly prunes, the audit and the
/// rebuild), and each allowed only with the index it names. A sort of one key's rows (a
/// session's approvals) and a partial sort (`… FOR LAST TERM OF ORDER BY`, rows streamed in an
/// index's order) are not findings.
///
/// SQLite only: SQLite's planner has no statistics here, so a plan seen on a small database is
/// the plan at scale; PostgreSQL chooses by its statistics, and a plan seen on an empty
/// database says nothing about a full one (its statements are checked where it matters, e.g.
/// `history_reads_do_not_scan_the_group_for_the_calls_own_entry` after `ANALYZE`).
///
/// Without migration 0021 it names the approval timer's `list due approvals` and
/// `read next approval expiry` (every pending approval read and sorted), start-up recovery's
/// `list sessions to recover` (every session ever created walked) and the webhook sender's
/// `read claimed deliveries` (every delivery scanned inside the claim's write).
pub(crate) async fn no_hot_path_statement_scans_a_growing_table(db: &TestDb) {
    let ledger = db.migrated().await;
    drive_workload().await;
    let explained = ledger.explain_prepared_statements().await.unwrap();
    assert_eq!(explained.unrecorded, 0, "texts were left out of the record");

    // Every table of the schema is classified, so a new one is a decision, not a miss.
    let schema = db
        .raw_strings(
            "SELECT type, name, tbl_name FROM sqlite_schema WHERE type IN ('table', 'index')",
        )
        .await;
    let mut table_of_index = BTreeMap::new();
    for row in &schema {
        let (kind, name, table) = (
            row[0].clone().unwrap(),
            row[1].clone().unwrap(),
            row[2].clone().unwrap(),
        );
        if kind == "index" {
            table_of_index.insert(name, table);
        } else if !name.starts_with("sqlite_") && !name.starts_with('_') {
            assert!(
                GROWING.contains(&name.as_str()) || NOT_GROWING.contains(&name.as_str()),
                "table {name} is neither GROWING nor NOT_GROWING: decide which"
            );
        }
    }

    let recorded: BTreeSet<&str> = explained.statements.iter().map(|s| s.context).collect();
    let missing: Vec<&&str> = HOT_PATHS
        .iter()
        .filter(|c| !recorded.contains(**c))
        .collect();
    assert!(missing.is_empty(), "the workload never ran {missing:?}");

    let mut used = BTreeSet::new();
    let mut report = String::new();
    let mut offending = 0;
    for text in &explained.statements {
        let found = findings(text, &table_of_index);
        if found.is_empty() {
            continue;
        }
        if let Some(allowed) = ALLOWED
            .iter()
            .find(|a| a.context == text.context && found.iter().all(|f| f.contains(a.reads)))
        {
            used.insert(allowed.context);
            continue;
        }
        offending += 1;
        report.push_str(&format!("\n{}: {}\n", text.context, text.sql));
        if let Ok(plans) = &text.plans {
            for line in plans.iter().flatten() {
                report.push_str(&format!("    {line}\n"));
            }
        }
        for finding in found {
            report.push_str(&format!("  -> {finding}\n"));
        }
    }
    assert!(
        offending == 0,
        "{offending} statements read a growing table whole:\n{report}"
    );
    unread_indexes_are_only_the_listed_ones(&explained.statements, &table_of_index);
    let stale: Vec<String> = ALLOWED
        .iter()
        .filter(|a| !used.contains(a.context))
        .map(|a| format!("{} ({})", a.context, a.reason))
        .collect();
    assert!(
        stale.is_empty(),
        "allowed statements that no longer read a growing table whole, or that the workload no \
         longer runs: remove them from ALLOWED: {stale:#?}"
    );
}

/// Every statement that joins a column holding an id with the key it refers to
/// (`phrony_ledger::id_join_statements`) reaches the joined rows through an index on the join
/// key, on both databases. On PostgreSQL the keys (`sessions.id`, `tool_invocations.call_id`)
/// are `COLLATE "C"` and the columns referring to them are not, so such an equality compares in
/// "C", which the columns' own indexes cannot serve: before migration 0022 start-up recovery's
/// resting-sessions query scanned the calls and the approvals once per waiting session (56 s to
/// restart with 1,000 parked) and a session's timeline read every session once per level of its
/// tree. Sequential scans are priced out for the check, as on tables too big to scan, so the plan
/// shows whether an index can serve the join at all.
pub(crate) async fn id_joins_are_served_by_indexes(db: &TestDb) {
    db.migrated().await;
    for (name, sql) in phrony_ledger::id_join_statements() {
        let binds: &[&str] = if sql.contains("$1") {
            &["run_00000000-0000-4000-8000-000000000000"]
        } else {
            &[]
        };
        let plan = db.explain_without_seqscan(&sql, binds).await;
        // Each join of the statement, as the plan shows it served by an index on the join key.
        let served: &[&str] = match (db.kind, name) {
            (Backend::Sqlite, "session subtree (timeline)") => {
                &["SEARCH c USING INDEX sessions_parent (parent_session_id=?)"]
            }
            (Backend::Sqlite, _) => &[
                "INDEX tool_invocations_session (session_id=? AND status=?)",
                "SEARCH a USING INDEX approvals_call (call_id=?)",
            ],
            (Backend::Postgres, "session subtree (timeline)") => &[
                "Index Scan using sessions_parent_c on sessions c",
                "Index Cond: ((parent_session_id)::text = t.id)",
            ],
            (Backend::Postgres, _) => &[
                "using tool_invocations_session_c on tool_invocations",
                "Index Cond: (session_id = s.id)",
                "Index Scan Backward using approvals_call_c on approvals a",
                "Index Cond: (call_id = c",
            ],
        };
        for fragment in served {
            assert!(
                plan.iter().any(|line| line.contains(fragment)),
                "{name}: no plan line contains {fragment:?}:\n{}",
                plan.join("\n")
            );
        }
        for line in &plan {
            let scan = line.trim_start();
            assert!(
                !scan.starts_with("Seq Scan")
                    && !scan.starts_with("SCAN c")
                    && !scan.starts_with("SCAN a"),
                "{name}: {scan:?} reads a table whole:\n{}",
                plan.join("\n")
            );
        }
    }
}
