-- phrony ledger schema: PostgreSQL's migration 0022 adds indexes keyed in the "C" collation for
-- the joins of an id column with the key it refers to, which its indexes in the database's
-- default collation could not serve. SQLite compares every text column with BINARY, so its
-- existing indexes serve those joins already (conformance `id_joins_are_served_by_indexes`):
-- nothing to change. The migration exists so both backends keep the same numbering (conformance
-- `both_backends_ship_the_same_gap_free_migrations`).
SELECT 1;
