-- Legal holds: while a hold on a user is active, an erasure of that user
-- (or of any memory of that user, or anything an erasure would follow to
-- from it) is refused, and the retention sweep (expiry and decay) leaves
-- the user's memories alone. Working memory is outside holds: it is a
-- scratchpad with a time to live, not a record.
--
-- A hold is released by setting released_at; the row stays, so what was
-- held, by whom and for how long remains on record (the audit log has the
-- same story, hash-chained). Placing a hold and accepting an erasure of the
-- same user are serialised by a transaction-scoped advisory lock on
-- (tenant, user), so neither can slip past the other's check.
--
-- The number 0007 is left free for a migration developed alongside.
CREATE TABLE legal_holds (
    id           uuid        PRIMARY KEY,
    tenant_id    text        NOT NULL,
    user_id      text        NOT NULL,
    -- Why (a case number, say); never memory content.
    reason       text        CHECK (reason IS NULL OR char_length(reason) <= 1000),
    -- The id of the API key that placed it (never the key).
    placed_by    text        NOT NULL,
    placed_at    timestamptz NOT NULL,
    released_by  text,
    released_at  timestamptz,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    CHECK ((released_at IS NULL) = (released_by IS NULL))
);

-- The question every sweep batch and every erasure asks: does this
-- (tenant, user) have an active hold? Released holds are not in the index.
CREATE INDEX legal_holds_active ON legal_holds (tenant_id, user_id) WHERE released_at IS NULL;
-- A tenant's holds, newest first.
CREATE INDEX legal_holds_tenant ON legal_holds (tenant_id, placed_at);
