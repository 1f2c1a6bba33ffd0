-- phrony ledger schema: drops three indexes that every governed call wrote and no statement reads
-- (issue #14).
--
-- Every event appended wrote an entry into `events_type (type, stream)` and, for the events of a
-- tool call, `events_call_id (call_id)`, besides the table and its primary key `(stream, seq)`:
-- twelve events per governed call, each entry at a random place of its index (keyed by a random
-- session or call id), so on SQLite every one dirtied a page of its own that the group commit
-- then wrote to the WAL. Every session created wrote `sessions_root (root_session_id)`, as
-- random. No statement of the ledger reads them: every read of the log names its stream (the
-- primary key's prefix), a call's events are read through its session's stream, a call's state
-- is its `tool_invocations` row, and a session's tree is walked by `parent_session_id`. The
-- conformance case `no_hot_path_statement_scans_a_growing_table` explains every statement the
-- ledger runs, checks that none reads a growing table whole without them, and that every index
-- of a growing table is read by some statement (or is listed with why it is kept).
--
-- Kept identical on SQLite and PostgreSQL.
DROP INDEX events_call_id;
DROP INDEX events_type;
DROP INDEX sessions_root;
