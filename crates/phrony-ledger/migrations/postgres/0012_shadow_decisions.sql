-- phrony ledger schema: shadow decisions (`mode: shadow` policies, stream `shadow:<namespace>/<name>`).
--
-- One row per `policy.shadow` event: what a shadow policy would have changed about one call. The
-- event (in the policy's own stream, hash-chained) is the record; this table is its index, written
-- in the event's transaction: the report reads one policy's rows by time without scanning the log,
-- and the primary key makes a re-decided call (after a crash) record its shadow outcome once. Not a
-- projection the rebuild replays: events are never removed, so the index never goes stale.
-- Kept column-for-column identical to migrations/sqlite/0012_shadow_decisions.sql.
CREATE TABLE shadow_decisions (
    call_id          text COLLATE "C" NOT NULL,
    policy_ref       text COLLATE "C" NOT NULL,
    policy_namespace text COLLATE "C" NOT NULL,
    policy_name      text COLLATE "C" NOT NULL,
    session_id       text COLLATE "C" NOT NULL,
    stream           text COLLATE "C" NOT NULL,
    seq              BIGINT NOT NULL,
    recorded_at      timestamptz NOT NULL,
    PRIMARY KEY (call_id, policy_ref)
);
CREATE INDEX shadow_decisions_by_policy
    ON shadow_decisions (policy_namespace, policy_name, recorded_at, seq);
