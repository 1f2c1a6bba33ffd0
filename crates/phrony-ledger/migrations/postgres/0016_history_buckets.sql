-- phrony ledger schema: bounded history windows (issue #18).
--
-- A windowed history query (`within:`) is answered from time buckets instead of a scan of its
-- entries: per (query, scope, group) and per width (1 s, 60 s, 3600 s, 86400 s, aligned on the
-- Unix epoch; `start` in Unix seconds) a `history_buckets` row keeps the count (`n`), amount sum (`total`, micro-units) and
-- committed count (`done`) of the entries decided in that bucket, written with the entries
-- (reserve) and the call's outcome event (commit/release), in the same transactions. A window
-- `[since, ∞)` reads at most 59 second, 59 minute and 23 hour buckets and the day buckets after
-- them, plus the entries of the one partial second at its start (exact to the microsecond).
-- `history_groups.window_secs`: the query's window (NULL: unwindowed, no buckets).
-- `history_groups.bucketed_since`: from when every entry of the group has its buckets (the Unix
-- epoch for a group created with them; the first bucketed reservation's time for a group created
-- before this migration); a window starting earlier is read from the entries.
-- `visible_until` (entries and buckets): the last instant a window can see the row (its time or
-- its bucket's end, plus the window); NULL: unwindowed. Committed entries and buckets past it are
-- pruned in bounded batches (`Ledger::prune_history`); reserved entries never are.
-- Kept column-for-column identical to migrations/sqlite/0016_history_buckets.sql.
ALTER TABLE history_groups ADD COLUMN window_secs BIGINT;
ALTER TABLE history_groups ADD COLUMN bucketed_since timestamptz;
ALTER TABLE history_entries ADD COLUMN visible_until timestamptz;
CREATE INDEX history_entries_expiry ON history_entries (visible_until)
    WHERE visible_until IS NOT NULL;
CREATE TABLE history_buckets (
    query_key     text COLLATE "C" NOT NULL,
    scope_key     text COLLATE "C" NOT NULL,
    group_key     text COLLATE "C" NOT NULL,
    width         BIGINT NOT NULL,
    start         BIGINT NOT NULL,
    n             BIGINT NOT NULL DEFAULT 0,
    total         BIGINT NOT NULL DEFAULT 0,
    done          BIGINT NOT NULL DEFAULT 0,
    visible_until timestamptz NOT NULL,
    PRIMARY KEY (query_key, scope_key, group_key, width, start)
);
CREATE INDEX history_buckets_expiry ON history_buckets (visible_until);
