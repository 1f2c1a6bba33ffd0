-- phrony ledger schema: every column that holds a session id, a call id or a stream name compares
-- in the "C" collation, like the keys it refers to (issue #14).
--
-- `sessions.id`, `tool_invocations.call_id` and `streams.stream` were declared COLLATE "C"; the
-- columns below, which hold the same ids, took the database's default collation. An equality
-- between the two (`c.session_id = s.id`, `a.call_id = c.call_id`) is compared in "C", which an
-- index built in another collation cannot serve: PostgreSQL joined them by filtering whole index
-- or table scans. Start-up recovery's `sessions_resting_on_approvals` (three correlated
-- subqueries per waiting session) then grew with the product of the waiting sessions, their calls
-- and the approvals: 56 s to restart with 1,000 sessions parked on a database without
-- statistics. In "C" the indexes on these columns (`tool_invocations_session`, `approvals_call`,
-- `approvals_session`, …) serve the joins.
--
-- Changing only the collation of a `text` column rewrites no table row; the indexes holding the
-- column are rebuilt. Ids are ASCII, so no comparison result changes.
ALTER TABLE tool_invocations ALTER COLUMN session_id TYPE text COLLATE "C";
ALTER TABLE approvals ALTER COLUMN session_id TYPE text COLLATE "C";
ALTER TABLE approvals ALTER COLUMN call_id TYPE text COLLATE "C";
ALTER TABLE events ALTER COLUMN call_id TYPE text COLLATE "C";
ALTER TABLE session_secrets ALTER COLUMN session_id TYPE text COLLATE "C";
ALTER TABLE sessions ALTER COLUMN parent_session_id TYPE text COLLATE "C";
ALTER TABLE sessions ALTER COLUMN root_session_id TYPE text COLLATE "C";
ALTER TABLE chain_heads ALTER COLUMN stream TYPE text COLLATE "C";
