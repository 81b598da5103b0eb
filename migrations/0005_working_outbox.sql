-- The working-memory entries of committed batches that working memory
-- (Redis) may not have yet. A batch's persistent memories, its idempotency
-- record and these rows commit in one transaction; the entries are written
-- to working memory after the commit and their rows deleted then. A crash
-- between the two leaves the rows here: a retry with the same
-- Idempotency-Key writes them before it replays the response, and the
-- outbox job writes what is left. Working memory is written by id, so
-- writing an entry twice leaves one entry.
CREATE TABLE working_outbox (
    tenant_id        text        NOT NULL,
    id               uuid        NOT NULL,
    -- The batch's key, so a retry finds its own entries (none: no key).
    idempotency_key  text,
    -- The memory as working memory stores it (JSON text, written back as is).
    entry            text        NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX working_outbox_key ON working_outbox (tenant_id, idempotency_key);
CREATE INDEX working_outbox_created ON working_outbox (created_at);
