-- phrony ledger schema: the live sessions of an agent, for RUNTIME_MAX_SESSIONS_PER_AGENT.
--
-- A session counts against its agent's bound from creation until it is completed, failed or
-- cancelled. `Ledger::create_session_within` counts them in the create's own transaction with
-- exactly this predicate, so the count reads only the agent's live sessions (a partial index:
-- ended sessions, the bulk of a long history, are not in it). Kept identical on SQLite and
-- PostgreSQL.
CREATE INDEX sessions_agent_live ON sessions (agent_namespace, agent_name)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');
