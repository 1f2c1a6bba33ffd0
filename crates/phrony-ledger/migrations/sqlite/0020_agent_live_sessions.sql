-- phrony ledger schema: a live-session counter per agent, for RUNTIME_MAX_SESSIONS_PER_AGENT
-- (issue #14: 100,000 sessions parked while the daemon keeps going).
--
-- Before this migration every session create counted the agent's live sessions with a
-- `COUNT(*)` over the partial index `sessions_agent_live` (migration 0009): a cost that grew
-- with the number of live sessions (≈ 6 ms at 100,000), and on SQLite it was spent inside the
-- group-commit writer, stalling every session's writes. Now the count is `SUM(live)` over
-- this table's rows of the agent, whatever the number of sessions.
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
-- Same table and same reader (the sum over the agent's rows) as PostgreSQL, whose migration
-- explains the shards: there a change goes to the row of its transaction's shard so that
-- concurrent session ends of one agent do not queue on one row. SQLite has one writer (every
-- write goes through the group-commit writer, `BEGIN IMMEDIATE`), so no row is contended and
-- every change goes to shard 0. Kept equivalent to migrations/postgres/0020_agent_live_sessions.sql.
CREATE TABLE agent_live_sessions (
    agent_namespace TEXT NOT NULL,
    agent_name      TEXT NOT NULL,
    shard           INTEGER NOT NULL CHECK (shard >= 0 AND shard < 16),
    live            INTEGER NOT NULL,
    PRIMARY KEY (agent_namespace, agent_name, shard)
) WITHOUT ROWID;

CREATE TRIGGER sessions_live_count_insert AFTER INSERT ON sessions
    WHEN NEW.status NOT IN ('completed', 'failed', 'cancelled')
BEGIN
    INSERT INTO agent_live_sessions (agent_namespace, agent_name, shard, live)
    VALUES (NEW.agent_namespace, NEW.agent_name, 0, 1)
    ON CONFLICT (agent_namespace, agent_name, shard) DO UPDATE SET live = live + 1;
END;

CREATE TRIGGER sessions_live_count_delete AFTER DELETE ON sessions
    WHEN OLD.status NOT IN ('completed', 'failed', 'cancelled')
BEGIN
    INSERT INTO agent_live_sessions (agent_namespace, agent_name, shard, live)
    VALUES (OLD.agent_namespace, OLD.agent_name, 0, -1)
    ON CONFLICT (agent_namespace, agent_name, shard) DO UPDATE SET live = live - 1;
END;

-- A live row that ends or moves to another agent: one fewer for its old agent.
CREATE TRIGGER sessions_live_count_update_old
    AFTER UPDATE OF status, agent_namespace, agent_name ON sessions
    WHEN OLD.status NOT IN ('completed', 'failed', 'cancelled')
        AND (NEW.status IN ('completed', 'failed', 'cancelled')
            OR NEW.agent_namespace <> OLD.agent_namespace
            OR NEW.agent_name <> OLD.agent_name)
BEGIN
    INSERT INTO agent_live_sessions (agent_namespace, agent_name, shard, live)
    VALUES (OLD.agent_namespace, OLD.agent_name, 0, -1)
    ON CONFLICT (agent_namespace, agent_name, shard) DO UPDATE SET live = live - 1;
END;

-- A row that becomes live or moves, live, to another agent: one more for its new agent.
CREATE TRIGGER sessions_live_count_update_new
    AFTER UPDATE OF status, agent_namespace, agent_name ON sessions
    WHEN NEW.status NOT IN ('completed', 'failed', 'cancelled')
        AND (OLD.status IN ('completed', 'failed', 'cancelled')
            OR NEW.agent_namespace <> OLD.agent_namespace
            OR NEW.agent_name <> OLD.agent_name)
BEGIN
    INSERT INTO agent_live_sessions (agent_namespace, agent_name, shard, live)
    VALUES (NEW.agent_namespace, NEW.agent_name, 0, 1)
    ON CONFLICT (agent_namespace, agent_name, shard) DO UPDATE SET live = live + 1;
END;

-- Backfill: the sessions live now.
INSERT INTO agent_live_sessions (agent_namespace, agent_name, shard, live)
SELECT agent_namespace, agent_name, 0, COUNT(*) FROM sessions
    WHERE status NOT IN ('completed', 'failed', 'cancelled')
    GROUP BY agent_namespace, agent_name;
