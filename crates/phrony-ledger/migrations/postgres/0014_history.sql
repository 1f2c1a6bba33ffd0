-- phrony ledger schema: the indexed state of history-aware policy conditions (issue #18).
--
-- `history_entries`: one row per (call, history query) the call contributes to: its scope key
-- (session id, `namespace/name` of the agent, or `*`), group key (the values of the query's
-- `same` arguments), amount (micro-units; NULL for count/exists, or until the result is known
-- for `of: result.<path>`), state `reserved` (decided: allowed, waiting for approval, in flight,
-- or of indeterminate outcome) or `committed` (succeeded), and the decision time. A failed,
-- denied, rejected or cancelled call's rows are deleted (released).
-- `history_groups`: per (query, scope, group) the reserved/committed counts and sums (answers
-- unwindowed count and sum in O(1)) and a `version` every change bumps: a reservation is written
-- only if the version the decision read is still current (optimistic concurrency).
-- Both are written in the transaction of the event that causes the change (commit/release with the
-- call's outcome event); not projections the rebuild replays (applying an outcome twice is a no-op).
-- Kept column-for-column identical to migrations/sqlite/0014_history.sql.
CREATE TABLE history_groups (
    query_key       text COLLATE "C" NOT NULL,
    scope_key       text COLLATE "C" NOT NULL,
    group_key       text COLLATE "C" NOT NULL,
    version         BIGINT NOT NULL DEFAULT 0,
    reserved_count  BIGINT NOT NULL DEFAULT 0,
    reserved_sum    BIGINT NOT NULL DEFAULT 0,
    committed_count BIGINT NOT NULL DEFAULT 0,
    committed_sum   BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (query_key, scope_key, group_key)
);
CREATE TABLE history_entries (
    call_id     text COLLATE "C" NOT NULL,
    query_key   text COLLATE "C" NOT NULL,
    scope_key   text COLLATE "C" NOT NULL,
    group_key   text COLLATE "C" NOT NULL,
    session_id  text COLLATE "C" NOT NULL,
    amount      BIGINT,
    result_path text COLLATE "C",
    state       text COLLATE "C" NOT NULL CHECK (state IN ('reserved', 'committed')),
    at          timestamptz NOT NULL,
    PRIMARY KEY (call_id, query_key)
);
CREATE INDEX history_entries_by_time
    ON history_entries (query_key, scope_key, group_key, at);
CREATE INDEX history_entries_by_amount
    ON history_entries (query_key, scope_key, group_key, amount);
