-- phrony ledger schema, version 4: API tokens.
--
-- One row per token created with `phrony-runtime tokens create`. The secret is never stored:
-- secret_hash is the hex SHA-256 of it, which the daemon looks the presented bearer token up by
-- on every RPC (so a revocation or an expiry takes effect on the next call). Names are unique
-- case-insensitively (they are the recorded principal, and actor names that differ only in case
-- are the same actor). roles, routes and tools are JSON arrays of strings. Creation and
-- revocation are also events of the `tokens` stream (without the secret or its hash). This is
-- not a projection: the hash is in no event, so rebuilding projections leaves the table alone.
-- Kept identical on SQLite and PostgreSQL but for the timestamp type.
CREATE TABLE api_tokens (
    name        TEXT PRIMARY KEY NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE CHECK (length(secret_hash) = 64),
    roles       TEXT NOT NULL,
    routes      TEXT NOT NULL,
    tools       TEXT NOT NULL,
    created_at  timestamptz NOT NULL,
    created_by  TEXT NOT NULL,
    expires_at  timestamptz,
    revoked_at  timestamptz,
    revoked_by  TEXT
);
CREATE UNIQUE INDEX api_tokens_name_ci ON api_tokens (lower(name));
