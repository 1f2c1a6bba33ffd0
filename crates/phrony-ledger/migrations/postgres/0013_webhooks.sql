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
-- the row pending, due again when the lease ends (at-least-once). Replicas claim with
-- `FOR UPDATE SKIP LOCKED`.
-- Kept column-for-column identical to migrations/sqlite/0013_webhooks.sql.
CREATE TABLE webhook_outbox (
    id         uuid NOT NULL PRIMARY KEY,
    stream     text COLLATE "C" NOT NULL,
    seq        BIGINT NOT NULL,
    kind       text COLLATE "C" NOT NULL,
    created_at timestamptz NOT NULL,
    UNIQUE (stream, seq)
);
CREATE TABLE webhook_deliveries (
    id              uuid NOT NULL PRIMARY KEY,
    outbox_id       uuid NOT NULL REFERENCES webhook_outbox (id) ON DELETE CASCADE,
    webhook         text COLLATE "C" NOT NULL,
    status          text COLLATE "C" NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    claim_token     uuid,
    last_error      text,
    delivered_at    timestamptz,
    updated_at      timestamptz NOT NULL,
    UNIQUE (outbox_id, webhook)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (webhook, status, next_attempt_at);
CREATE INDEX webhook_deliveries_by_status ON webhook_deliveries (status, updated_at);
