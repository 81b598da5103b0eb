-- Erasure (the right to be forgotten) and the audit log.
--
-- An erasure request is stored before it is acknowledged, so a restart
-- resumes it. Accepting it claims the subject's rows in `erasure_items` and
-- sets their expires_at to the request time in the same transaction: every
-- read path already hides expired rows, so from the acknowledgement on
-- nothing of the subject is returned, and the erasure job deletes the
-- claimed rows right after. A row claimed by one erasure is not claimed by
-- another (the primary key), so two erasures of one subject never count a
-- row twice. Claims are removed when their erasure ends; the erasure row
-- keeps the receipt (counts and verification, never content).
CREATE TABLE erasures (
    id            uuid        PRIMARY KEY,
    tenant_id     text        NOT NULL,
    -- {"user_id", "agent_id"?} or {"memory_ids": [...]}, as JSON text.
    selector      text        NOT NULL,
    -- The id of the API key that asked (never the key).
    requested_by  text        NOT NULL,
    state         text        NOT NULL
                  CHECK (state IN ('pending', 'running', 'retrying', 'completed', 'failed')),
    attempts      integer     NOT NULL DEFAULT 0,
    -- Why the last attempt stopped (no memory content).
    last_error    text,
    -- Counts, verification and the audit entry's hash, as JSON text.
    receipt       text,
    requested_at  timestamptz NOT NULL,
    completed_at  timestamptz,
    updated_at    timestamptz NOT NULL
);
CREATE INDEX erasures_unfinished ON erasures (requested_at) WHERE state IN ('pending', 'running', 'retrying');
CREATE INDEX erasures_tenant ON erasures (tenant_id, requested_at);

CREATE TABLE erasure_items (
    tenant_id   text NOT NULL,
    id          uuid NOT NULL,
    erasure_id  uuid NOT NULL,
    tier        text NOT NULL CHECK (tier IN ('episodic', 'semantic', 'procedural')),
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX erasure_items_erasure ON erasure_items (erasure_id);

-- Finding a subject's rows, and the facts derived from its episodes,
-- without scanning a tenant (episodic has its user index since 0001).
CREATE INDEX semantic_tenant_user ON semantic_memory (tenant_id, user_id) WHERE user_id IS NOT NULL;
CREATE INDEX procedural_tenant_user ON procedural_memory (tenant_id, user_id) WHERE user_id IS NOT NULL;
CREATE INDEX semantic_tenant_source_episode ON semantic_memory (tenant_id, source_episode_id)
    WHERE source_episode_id IS NOT NULL;

-- The audit log: who erased, exported or imported what, and how much;
-- never content. One hash chain per tenant: each entry's hash covers its
-- fields and the previous entry's hash, so an edited, removed or reordered
-- entry breaks the chain from there on (`engram audit verify` names it).
-- Fields are text as hashed, so the database cannot re-encode them.
CREATE TABLE audit_log (
    seq        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id  text        NOT NULL,
    at         timestamptz NOT NULL,
    actor      text        NOT NULL,
    operation  text        NOT NULL,
    target     text        NOT NULL,
    counts     text        NOT NULL,
    prev_hash  text        NOT NULL,
    hash       text        NOT NULL
);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, seq);

-- Append-only by construction: no row is ever updated or deleted, and the
-- table is never truncated, whoever asks (a superuser can still disable
-- the triggers; the hash chain shows what was changed then).
CREATE FUNCTION engram_audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END
$$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION engram_audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION engram_audit_log_append_only();
