-- phrony ledger schema: the largest amount of each history time bucket (issue #18).
--
-- `history_buckets.top`: the largest amount (micro-units) of the entries counted in the bucket
-- (NULL: none has one), so a windowed `max` is answered from the same bucket rows as its count
-- and sum instead of walking the amount index. Raised with each reservation and commit, in
-- their transactions; recomputed when an amount falls or an entry is released (the second
-- bucket from its entries, each wider bucket from the narrower ones inside it).
-- Filled here from the entries of each bucket (those written with a window: `visible_until`).
-- `history_groups_by_bucketed_since`: finds the windowed groups from before migration 0016
-- (`bucketed_since` after the epoch) whose unbucketed entries `Ledger::prune_history` deletes.
-- Kept column-for-column identical to migrations/postgres/0018_history_bucket_tops.sql.
ALTER TABLE history_buckets ADD COLUMN top BIGINT;
UPDATE history_buckets SET top = (
    SELECT MAX(e.amount) FROM history_entries e
    WHERE e.query_key = history_buckets.query_key AND e.scope_key = history_buckets.scope_key
      AND e.group_key = history_buckets.group_key AND e.visible_until IS NOT NULL
      AND e.at >= strftime('%Y-%m-%dT%H:%M:%S.000000Z', history_buckets.start, 'unixepoch')
      AND e.at < strftime('%Y-%m-%dT%H:%M:%S.000000Z', history_buckets.start + history_buckets.width,
                          'unixepoch'));
CREATE INDEX history_groups_by_bucketed_since ON history_groups (bucketed_since);
