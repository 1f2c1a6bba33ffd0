-- phrony ledger schema: a live-session counter per agent, for RUNTIME_MAX_SESSIONS_PER_AGENT
-- (issue #14: 100,000 sessions parked while the daemon keeps going).
--
-- Before this migration every session create counted the agent's live sessions with a
-- `COUNT(*)` over the partial index `sessions_agent_live` (migration 0009): a cost that grew
-- with the number of live sessions (≈ 6 ms at 100,000) inside the create's transaction. Now
-- the count is `SUM(live)` over this table's rows of the agent: at most 16 rows, whatever the
-- number of sessions.
--
-- Maintained by triggers on `sessions`, so every path that changes a row (a create, a status
-- change, the cascades that end children or the sessions of an archived agent or a retired
-- version, the projection rebuild's wipe and replay, any delete) moves the counter in its own
-- transaction: it cannot drift from `COUNT(*)`. Live is `status NOT IN ('completed',
-- 'failed', 'cancelled')`, the predicate of migration 0009. Every transition is handled: a
-- live row inserted (+1) or deleted (-1), live → ended (-1), ended → live (+1), and a live
-- row moved to another agent (-1 for the old agent, +1 for the new one); no path does the
-- last two today.
--
-- The partial index `sessions_agent_live` stays: no count reads it any more, but it holds
-- exactly the live sessions, and the projection rebuild's purge of orphan secrets (`SELECT id
-- FROM sessions WHERE status NOT IN …`) reads it on both backends, as does start-up
-- recovery's scan of live sessions on SQLite once the table has statistics.
--
-- Shards. A single row per agent would be locked by every session end of that agent until
-- its transaction commits, serialising all ends of an agent (the PostgreSQL target is 5,000
-- governed calls/s). So an agent has up to 16 rows (`shard` 0–15) and a change goes to the
-- row chosen by its TRANSACTION: `txid_current() % 16`. Concurrent transactions have nearby
-- transaction ids, so they land on different rows; one transaction touches one row per
-- agent whatever number of sessions it ends. A shard chosen from the session id would make
-- a cascade that ends several sessions of one agent lock several of its rows in the order
-- it visits them, and two such cascades could deadlock (detected only after
-- `deadlock_timeout`, then retried); per-transaction shards cannot, within an agent (two
-- transactions ending sessions of the same two agents in opposite orders still can when
-- their shards coincide, 1 in 16; the ledger retries a deadlock as a `Conflict`). The
-- price: a session's +1 and its -1 may land in different rows, so a single row means
-- nothing (it may be negative); only the sum over the agent's rows does, and every reader
-- sums (`sessions::count_live_sessions`).
--
-- The bound stays race-free: creates of one agent are serialised by an advisory lock held
-- to commit (`sessions::lock_agent_sessions`), and a create is the only way a count grows,
-- so each create's sum (read committed: a fresh snapshot per statement, taken after the
-- lock) includes every earlier create; an end not yet committed is not subtracted yet,
-- which can only refuse a create, never admit one too many — as the `COUNT(*)` did.
-- Kept equivalent to migrations/sqlite/0020_agent_live_sessions.sql (there every change goes
-- to shard 0: SQLite has one writer, so no row is contended).
CREATE TABLE agent_live_sessions (
    agent_namespace text COLLATE "C" NOT NULL,
    agent_name      text COLLATE "C" NOT NULL,
    shard           smallint NOT NULL CHECK (shard >= 0 AND shard < 16),
    live            bigint NOT NULL,
    PRIMARY KEY (agent_namespace, agent_name, shard)
) WITH (fillfactor = 50); -- room on each page for the in-place (HOT) updates every change makes

-- One row trigger for the three operations; the WHEN clauses below call it only when a
-- row's liveness or agent changes (a live → live status change, the common update, costs
-- nothing). PL/pgSQL caches the plans of its statements (a SQL-language helper would be
-- planned again on every call).
CREATE FUNCTION phrony_sessions_live_count() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    tx_shard smallint := (txid_current() % 16)::smallint;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        IF OLD.status NOT IN ('completed', 'failed', 'cancelled') THEN
            INSERT INTO agent_live_sessions AS c (agent_namespace, agent_name, shard, live)
            VALUES (OLD.agent_namespace, OLD.agent_name, tx_shard, -1)
            ON CONFLICT (agent_namespace, agent_name, shard) DO UPDATE SET live = c.live - 1;
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        IF NEW.status NOT IN ('completed', 'failed', 'cancelled') THEN
            INSERT INTO agent_live_sessions AS c (agent_namespace, agent_name, shard, live)
            VALUES (NEW.agent_namespace, NEW.agent_name, tx_shard, 1)
            ON CONFLICT (agent_namespace, agent_name, shard) DO UPDATE SET live = c.live + 1;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER sessions_live_count_insert AFTER INSERT ON sessions
    FOR EACH ROW WHEN (NEW.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION phrony_sessions_live_count();
CREATE TRIGGER sessions_live_count_delete AFTER DELETE ON sessions
    FOR EACH ROW WHEN (OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION phrony_sessions_live_count();
CREATE TRIGGER sessions_live_count_update
    AFTER UPDATE OF status, agent_namespace, agent_name ON sessions
    FOR EACH ROW WHEN (
        (OLD.status NOT IN ('completed', 'failed', 'cancelled'))
            <> (NEW.status NOT IN ('completed', 'failed', 'cancelled'))
        OR OLD.agent_namespace <> NEW.agent_namespace
        OR OLD.agent_name <> NEW.agent_name)
    EXECUTE FUNCTION phrony_sessions_live_count();
-- Row triggers do not see a TRUNCATE (nothing truncates `sessions` today; its foreign keys
-- would need CASCADE): the counter empties with it.
CREATE FUNCTION phrony_sessions_live_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM agent_live_sessions;
    RETURN NULL;
END
$$;
CREATE TRIGGER sessions_live_count_truncate AFTER TRUNCATE ON sessions
    FOR EACH STATEMENT EXECUTE FUNCTION phrony_sessions_live_truncate();

-- Backfill: the sessions live now, in shard 0.
INSERT INTO agent_live_sessions (agent_namespace, agent_name, shard, live)
SELECT agent_namespace, agent_name, 0, COUNT(*) FROM sessions
    WHERE status NOT IN ('completed', 'failed', 'cancelled')
    GROUP BY agent_namespace, agent_name;
