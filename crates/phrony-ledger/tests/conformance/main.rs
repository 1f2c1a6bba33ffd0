//! One conformance suite, run against every backend: SQLite (a temporary file) always, and
//! PostgreSQL (a fresh database per test on `PHRONY_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`). PostgreSQL tests fail when the server is
//! unreachable unless `PHRONY_TEST_SKIP_POSTGRES=1`. A few cases hold on SQLite only
//! (`sqlite_only::<case>`, each saying why). The ledger's other integration tests
//! (`connect`: what `Ledger::connect` says about bad URLs) share this binary.

#![allow(
    clippy::too_many_lines,
    reason = "a test scenario reads top to bottom as one story; splitting it would hide its steps"
)]
#![allow(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a panic there is a failed assertion"
)]

mod approval_properties;
mod audit_cases;
mod bundle_cases;
mod cases;
mod commit_cases;
mod connect;
mod harness;
mod history_cases;
mod inbox_cases;
mod lease_cases;
mod outage;
mod plan_cases;
mod session_cases;
mod shadow_cases;
mod token_cases;
mod webhook_cases;

/// Generates `$module::<case>` tests on SQLite for every case.
macro_rules! sqlite_tests {
    ($module:ident: $($case:ident),* $(,)?) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let db = crate::harness::TestDb::new(phrony_ledger::Backend::Sqlite)
                        .await
                        .expect("SQLite is always available");
                    crate::cases::$case(&db).await;
                }
            )*
        }
    };
}

/// Generates `sqlite::<case>` and `postgres::<case>` tests for every case.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        sqlite_tests!(sqlite: $($case),*);
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let Some(db) =
                        crate::harness::TestDb::new(phrony_ledger::Backend::Postgres).await
                    else {
                        return;
                    };
                    crate::cases::$case(&db).await;
                }
            )*
        }
    };
}

// Cases that hold on SQLite only, each saying why.
sqlite_tests!(sqlite_only: no_hot_path_statement_scans_a_growing_table);

conformance!(
    a_commit_listener_hears_committed_appends_as_a_read_returns_them,
    events_record_the_attribution_and_the_chain_covers_it,
    separation_of_duties_refuses_a_verified_starter_unless_the_policy_opts_out,
    a_quorum_counts_distinct_verified_principals,
    a_route_restricted_approver_votes_only_on_its_routes,
    migrations_are_idempotent_and_versioned,
    publish_creates_agent_and_immutable_version,
    republish_is_idempotent_only_for_identical_content,
    publish_rejects_bad_input,
    publish_updates_owner_and_labels_of_the_agent,
    deploy_activates_versions_and_records_history,
    deploy_refuses_retired_and_deprecated_versions,
    rollback_checks_every_branch,
    deprecate_and_retire_follow_the_rules,
    archive_freezes_the_agent,
    runnable_version_requires_a_healthy_active_deployment,
    every_change_appends_exactly_one_audit_event,
    session_events_form_a_hash_chain,
    event_log_refuses_update_and_delete,
    verify_detects_edits,
    verify_detects_a_rehashed_edit,
    verify_detects_deletions,
    verify_detects_reordering,
    concurrent_appends_are_gap_free_across_pools,
    concurrent_lifecycle_writes_are_serialised,
    concurrent_writes_share_commits_and_a_refusal_fails_only_its_caller,
    rebuild_reproduces_projections_exactly,
    rebuild_refuses_a_tampered_log_and_changes_nothing,
    committed_data_survives_reopening,
    session_lifecycle_records_every_transition,
    a_completion_and_its_message_commit_together,
    a_completion_records_the_tools_policy_hid,
    child_sessions_follow_their_parent,
    a_change_from_a_status_the_session_is_not_in_writes_nothing,
    live_sessions_per_agent_are_bounded,
    concurrent_creates_never_exceed_the_live_session_bound,
    creates_crossing_from_shared_to_exclusive_never_exceed_the_bound,
    creates_far_from_the_bound_share_the_agents_lock,
    the_live_session_counter_equals_the_live_sessions_of_every_agent,
    the_live_session_bound_reads_the_counter,
    the_live_session_counter_is_backfilled_by_its_migration,
    list_sessions_filters_and_paginates_stably,
    tool_calls_follow_the_ledger_state_machine,
    the_result_closing_the_last_open_call_resumes_its_session,
    queue_and_dispatch_is_one_write,
    each_dispatch_names_the_manifest_of_its_calls_version,
    a_late_result_closes_a_recovery_approval,
    outcome_reviews_are_resolved_not_approved,
    a_call_cancelled_after_dispatch_keeps_its_late_result,
    approval_quorum_counts_distinct_actors_and_keeps_edited_args,
    approval_reject_vetoes_and_comprehension_is_required,
    approval_timeouts_apply_their_default,
    approvals_close_when_their_session_ends,
    retire_and_archive_end_the_sessions_of_their_versions,
    approvals_list_filters_and_paginates,
    a_pending_approval_survives_a_restart,
    decided_waits_are_found_by_decision_time,
    a_session_opens_with_its_first_events_in_one_transaction,
    a_model_step_commits_its_completion_status_and_calls_together,
    sessions_resting_on_approvals_are_found_in_one_query,
    the_calls_of_a_completion_are_recorded_together,
    sessions_to_recover_are_read_page_by_page,
    secrets_are_sealed_and_purged_on_terminal_transitions,
    writes_to_a_missing_session_are_not_found_and_write_nothing,
    rebuild_reproduces_session_projections_exactly,
    cancelled_writes_never_leave_the_database_locked,
    tokens_are_stored_hashed_found_by_hash_and_revoked,
    descriptor_pins_follow_versions_and_refusals_are_audited,
    shadow_decisions_are_recorded_once_indexed_and_verified,
    token_names_are_unique_and_bad_requests_are_named,
    a_clean_log_verifies_with_the_exact_count,
    a_recomputed_chain_fails_the_sealed_head,
    an_edited_vote_is_a_projection_difference,
    a_dropped_trigger_alone_is_reported,
    an_existing_log_is_sealed_once_and_keyless_writes_are_caught,
    audit_events_are_typed_and_the_log_still_verifies,
    a_stream_deleted_with_its_sealed_head_is_detected,
    a_log_sealed_before_the_stream_set_gets_it_at_start,
    a_log_sealed_in_one_row_gets_its_stream_set_sharded_at_start,
    a_moved_or_deleted_stream_set_shard_is_detected,
    audit_checks_beside_live_writers_report_no_false_problem,
    replicas_starting_at_once_seal_the_log_once_beside_writers,
    a_verification_completes_beside_an_open_write,
    repeated_verifications_between_writes_fold_into_their_shadows,
    a_session_never_outlives_the_retire_or_archive_of_its_agent,
    a_batch_append_is_ordered_chained_and_all_or_nothing,
    a_batch_append_seals_its_head_and_joins_the_stream_set,
    a_write_of_several_appends_seals_its_last_head,
    a_bundle_publish_vendors_its_members_and_is_immutable,
    an_external_bundle_member_names_a_published_version,
    bundle_deploy_rollback_and_history_follow_the_rules,
    a_bundle_session_runs_the_root_member_and_lists_by_kind,
    rebuild_reproduces_bundle_projections_exactly,
    history_reservations_commit_release_and_are_idempotent,
    history_windows_are_exact_at_the_edges,
    history_groups_from_before_buckets_read_their_entries,
    history_prune_keeps_what_a_window_sees_and_reserved_entries,
    history_prune_takes_entries_from_before_buckets,
    history_prune_runs_drain_groups_from_before_buckets,
    history_window_max_follows_releases_and_results,
    history_reads_do_not_scan_the_group_for_the_calls_own_entry,
    a_session_end_reads_only_its_own_pending_approvals,
    id_joins_are_served_by_indexes,
    concurrent_deciders_never_pass_a_cap_only_some_fit,
    webhook_outbox_rows_commit_with_their_event,
    webhook_deliveries_follow_their_state_machine,
    concurrent_claimers_never_claim_the_same_delivery,
    deliveries_of_unconfigured_webhooks_fail_with_their_audit,
    a_session_lease_is_acquired_renewed_expired_and_taken_over,
    a_replica_reacquiring_its_own_lease_fences_its_older_driver,
    renewals_beside_acquisitions_never_free_or_lose_a_held_lease,
    a_session_is_handed_to_the_replica_whose_workers_serve_its_tool,
    votes_are_recorded_whatever_the_recording_replicas_lease,
    a_write_between_a_release_and_the_next_acquisition_is_not_fenced,
    user_messages_queue_for_the_driving_replica_and_are_recorded_once,
    replicas_racing_for_an_expired_lease_get_one_epoch_each,
    replicas_racing_to_expire_an_approval_expire_it_once,
    sessions_leased_elsewhere_answers_a_mixed_page_in_one_read,
    a_takeover_withdraws_the_dead_replicas_published_handlers,
    a_session_created_with_its_lease_is_fenced_from_its_first_write,
    a_session_end_releases_the_lease_of_the_replica_that_ends_it,
    an_end_that_does_not_commit_keeps_the_lease,
);
