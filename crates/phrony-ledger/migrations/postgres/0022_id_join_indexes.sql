-- phrony ledger schema: indexes that serve the joins of an id column with the key it refers to
-- (issue #14).
--
-- `sessions.id` and `tool_invocations.call_id` are COLLATE "C"; the columns that refer to them
-- (`tool_invocations.session_id`, `approvals.call_id`, `sessions.parent_session_id`, …) took the
-- database's default collation. An equality between the two (`c.session_id = s.id`) compares in
-- "C" (the only explicit collation of the pair), which an index built in another collation
-- cannot serve: PostgreSQL answered such a join by scanning. Start-up recovery's
-- `sessions_resting_on_approvals` (three correlated subqueries per waiting session, one more per
-- open call) grew with the product of the waiting sessions, their calls and the approvals: 56 s
-- to restart with 1,000 sessions parked on a database without statistics. A session's timeline
-- read every session once per level of its tree.
--
-- Each index below keys the column in "C", beside the existing one (which keeps serving the
-- equalities with a bound parameter, compared in the column's own collation). Changing the
-- columns' collation instead would change the result type of every cached statement reading
-- them, which a replica of the previous version fails on ("cached plan must not change result
-- type") during a rolling upgrade; it would also let the decided-waits sweep be planned from the
-- waiting sessions instead of the decided approvals. The conformance case
-- `id_joins_are_served_by_indexes` checks each join's plan.
--
-- tool_invocations_session_c: a session's calls by status (the recovery query's three EXISTS).
-- approvals_call_c: a call's latest approval (`ORDER BY created_at DESC, id DESC LIMIT 1`).
-- sessions_parent_c: a session's children (the timeline's recursive tree).
CREATE INDEX tool_invocations_session_c ON tool_invocations (session_id COLLATE "C", status);
CREATE INDEX approvals_call_c ON approvals (call_id COLLATE "C", created_at, id);
CREATE INDEX sessions_parent_c ON sessions (parent_session_id COLLATE "C");
