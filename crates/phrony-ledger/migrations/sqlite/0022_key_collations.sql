-- phrony ledger schema: PostgreSQL's migration 0022 gives every column holding a session id, a
-- call id or a stream name the "C" collation of the keys it refers to, so that its indexes serve
-- joins on them. SQLite compares every text column with BINARY already: nothing to change. The
-- migration exists so both backends keep the same numbering (conformance
-- `both_backends_ship_the_same_gap_free_migrations`).
SELECT 1;
