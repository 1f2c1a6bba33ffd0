-- phrony ledger schema: the webhook outbox (issue #19, notifications).
--
-- One `webhook_outbox` row per event that notifies (approval required/decided/expired/escalated,
-- session failed; the rule is `phrony_ledger::notification`), inserted by the append path in the
-- event's own transaction, so a committed event always has its row and a rolled-back append has
-- none. One `webhook_deliveries` row per (outbox row, configured webhook whose `events` list the
-- kind), written in the same transaction. The event itself (hash-chained) is the record; these
-- rows are delivery state, outside the chain: delivered rows older than the retention bound
-- (`WEBHOOK_RETENTION`, 7 days) are pruned, with outbox rows left without a delivery.
-- `claim_token`/`next_attempt_at` hold a claimed attempt: a sender that dies mid-attempt leaves
-- the row pending, due again when the lease ends (at-least-once).
-- Kept column-for-column identical to migrations/postgres/0013_webhooks.sql.
CREATE TABLE webhook_outbox (
    id         TEXT NOT NULL PRIMARY KEY,
    stream     TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (stream, seq)
);
CREATE TABLE webhook_deliveries (
    id              TEXT NOT NULL PRIMARY KEY,
    outbox_id       TEXT NOT NULL REFERENCES webhook_outbox (id) ON DELETE CASCADE,
    webhook         TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at TEXT NOT NULL,
    claim_token     TEXT,
    last_error      TEXT,
    delivered_at    TEXT,
    updated_at      TEXT NOT NULL,
    UNIQUE (outbox_id, webhook)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (webhook, status, next_attempt_at);
CREATE INDEX webhook_deliveries_by_status ON webhook_deliveries (status, updated_at);
