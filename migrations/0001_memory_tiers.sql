-- engram schema, first version.
--
-- Three persistent tiers (working memory lives in Redis). Decisions that hold
-- for every table:
--   * tenant_id comes first in every unique key and B-tree index, and every
--     query filters on it: two tenants never see or touch each other's rows,
--     and each tenant's rows are contiguous in every index.
--   * Vectors go in a dimensionless `vector` column next to `embedding_model`.
--     One HNSW index per model is created when the model is first used, as a
--     partial expression index: (embedding::vector(D)) ... WHERE
--     embedding_model = 'm'. Queries filter on the model, so vectors of two
--     models are never compared, and a model change needs no migration.
--   * `search_tsv` is a generated tsvector (GIN-indexed) for the full-text leg
--     of hybrid recall.
--   * `occurred_at` is when the remembered thing happened (client-given);
--     `created_at` is when engram ingested it; `expires_at` is created_at plus
--     the retention's duration (NULL = permanent). Rows past expires_at are
--     treated as gone by every read, before any sweep deletes them.

CREATE EXTENSION IF NOT EXISTS vector;

-- Episodic memory: what happened. Range-partitioned by ingest time so that
-- retention can drop whole months; the DEFAULT partition catches rows whose
-- month has no partition yet (the server creates partitions ahead, see
-- engram_ensure_episodic_partitions).
CREATE TABLE episodic_memory (
    id               uuid        NOT NULL,
    tenant_id        text        NOT NULL,
    agent_id         text        NOT NULL,
    user_id          text,
    session_id       text,
    event_type       text        NOT NULL DEFAULT 'conversation'
                     CHECK (event_type IN ('conversation', 'action', 'observation', 'outcome')),
    content          text        NOT NULL,
    content_hash     text        NOT NULL,
    outcome          text        CHECK (outcome IN ('success', 'failure', 'partial', 'unknown')),
    importance       real        NOT NULL CHECK (importance >= 0 AND importance <= 1),
    embedding        vector,
    embedding_model  text,
    access_count     integer     NOT NULL DEFAULT 0,
    last_accessed_at timestamptz,
    retention        text        NOT NULL
                     CHECK (retention IN ('transient', 'session', 'short_term', 'medium_term', 'long_term', 'permanent')),
    private          boolean     NOT NULL DEFAULT false,
    metadata         jsonb       NOT NULL DEFAULT '{}',
    occurred_at      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    expires_at       timestamptz,
    search_tsv       tsvector    GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    -- A vector always says which model made it.
    CHECK ((embedding IS NULL) = (embedding_model IS NULL)),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

CREATE TABLE episodic_memory_default PARTITION OF episodic_memory DEFAULT;

-- Listing and "recent episodes of this agent": keyset order (created_at, id).
CREATE INDEX episodic_tenant_agent_created ON episodic_memory (tenant_id, agent_id, created_at DESC, id DESC);
-- Session continuity: the last episodes of one session.
CREATE INDEX episodic_tenant_agent_session ON episodic_memory (tenant_id, agent_id, session_id, created_at DESC);
-- Per-user scope (listing by user, erasure).
CREATE INDEX episodic_tenant_user ON episodic_memory (tenant_id, user_id) WHERE user_id IS NOT NULL;
-- Listing a whole tenant.
CREATE INDEX episodic_tenant_created ON episodic_memory (tenant_id, created_at DESC, id DESC);
-- Lookup by id without knowing the month.
CREATE INDEX episodic_tenant_id ON episodic_memory (tenant_id, id);
CREATE INDEX episodic_search_tsv ON episodic_memory USING gin (search_tsv);

-- Semantic memory: facts. `content` is the fact. Deduplicated per (tenant,
-- agent, namespace, content_hash) among currently valid facts; a newer fact
-- about the same (subject, predicate) stamps valid_until on the old one and
-- records it in `supersedes`, so beliefs change without losing their history.
CREATE TABLE semantic_memory (
    id                uuid        PRIMARY KEY,
    tenant_id         text        NOT NULL,
    agent_id          text        NOT NULL,
    user_id           text,
    session_id        text,
    namespace         text        NOT NULL,
    content           text        NOT NULL,
    content_hash      text        NOT NULL,
    subject           text,
    predicate         text,
    object            text,
    confidence        real        NOT NULL DEFAULT 0.7 CHECK (confidence >= 0 AND confidence <= 1),
    source_episode_id uuid,
    supersedes        uuid,
    valid_from        timestamptz NOT NULL,
    valid_until       timestamptz,
    importance        real        NOT NULL CHECK (importance >= 0 AND importance <= 1),
    embedding         vector,
    embedding_model   text,
    access_count      integer     NOT NULL DEFAULT 0,
    last_accessed_at  timestamptz,
    retention         text        NOT NULL
                      CHECK (retention IN ('transient', 'session', 'short_term', 'medium_term', 'long_term', 'permanent')),
    private           boolean     NOT NULL DEFAULT false,
    metadata          jsonb       NOT NULL DEFAULT '{}',
    occurred_at       timestamptz NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    expires_at        timestamptz,
    search_tsv        tsvector    GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    CHECK ((embedding IS NULL) = (embedding_model IS NULL))
);

-- Write-time dedup among valid facts only: re-asserting a superseded fact
-- creates a new row that supersedes its successor.
CREATE UNIQUE INDEX semantic_dedup ON semantic_memory (tenant_id, agent_id, namespace, content_hash)
    WHERE valid_until IS NULL;
-- Contradiction lookup: the valid fact about a (subject, predicate).
CREATE INDEX semantic_subject_predicate ON semantic_memory (tenant_id, agent_id, namespace, subject, predicate)
    WHERE valid_until IS NULL;
CREATE INDEX semantic_tenant_agent_created ON semantic_memory (tenant_id, agent_id, created_at DESC, id DESC);
CREATE INDEX semantic_tenant_namespace ON semantic_memory (tenant_id, namespace);
CREATE INDEX semantic_tenant_created ON semantic_memory (tenant_id, created_at DESC, id DESC);
-- Walking a supersede chain forwards.
CREATE INDEX semantic_tenant_supersedes ON semantic_memory (tenant_id, supersedes) WHERE supersedes IS NOT NULL;
CREATE INDEX semantic_search_tsv ON semantic_memory USING gin (search_tsv);

-- Procedural memory: skills. Upserted by (tenant, agent, skill_name); each
-- reported outcome moves the counters, and success_rate is generated so that
-- ranking by reliability never recomputes it.
CREATE TABLE procedural_memory (
    id               uuid        PRIMARY KEY,
    tenant_id        text        NOT NULL,
    agent_id         text        NOT NULL,
    user_id          text,
    session_id       text,
    skill_name       text        NOT NULL,
    content          text        NOT NULL,
    content_hash     text        NOT NULL,
    trigger_pattern  text,
    policy           jsonb,
    tool_sequence    jsonb,
    success_count    integer     NOT NULL DEFAULT 0,
    failure_count    integer     NOT NULL DEFAULT 0,
    success_rate     real        GENERATED ALWAYS AS (
                         CASE WHEN success_count + failure_count = 0 THEN 0.0
                              ELSE success_count::real / (success_count + failure_count) END
                     ) STORED,
    reward_count     integer     NOT NULL DEFAULT 0,
    avg_reward       real        NOT NULL DEFAULT 0,
    version          integer     NOT NULL DEFAULT 1,
    importance       real        NOT NULL CHECK (importance >= 0 AND importance <= 1),
    embedding        vector,
    embedding_model  text,
    access_count     integer     NOT NULL DEFAULT 0,
    last_accessed_at timestamptz,
    retention        text        NOT NULL
                     CHECK (retention IN ('transient', 'session', 'short_term', 'medium_term', 'long_term', 'permanent')),
    private          boolean     NOT NULL DEFAULT false,
    metadata         jsonb       NOT NULL DEFAULT '{}',
    occurred_at      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    expires_at       timestamptz,
    search_tsv       tsvector    GENERATED ALWAYS AS (
                         to_tsvector('english', skill_name || ' ' || content || ' ' || coalesce(trigger_pattern, ''))
                     ) STORED,
    CHECK ((embedding IS NULL) = (embedding_model IS NULL)),
    CONSTRAINT procedural_skill UNIQUE (tenant_id, agent_id, skill_name)
);

-- "The most reliable skills of this agent", without a sort.
CREATE INDEX procedural_tenant_agent_rank ON procedural_memory (tenant_id, agent_id, success_rate DESC, avg_reward DESC);
CREATE INDEX procedural_tenant_agent_created ON procedural_memory (tenant_id, agent_id, created_at DESC, id DESC);
CREATE INDEX procedural_tenant_created ON procedural_memory (tenant_id, created_at DESC, id DESC);
CREATE INDEX procedural_search_tsv ON procedural_memory USING gin (search_tsv);

-- The embedding models ever used, with their vector size: the registry of
-- per-model HNSW indexes (and, later, of background re-embedding).
CREATE TABLE embedding_models (
    model      text        PRIMARY KEY,
    dimensions integer     NOT NULL CHECK (dimensions > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Idempotency keys: the first response to a (tenant, key), remembered with
-- the hash of its request body. Written in the same transaction as the
-- memories, so a replay can never disagree with what was stored.
CREATE TABLE idempotency_keys (
    tenant_id     text        NOT NULL,
    key           text        NOT NULL,
    request_hash  text        NOT NULL,
    status        smallint    NOT NULL,
    response      jsonb       NOT NULL,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX idempotency_tenant_created ON idempotency_keys (tenant_id, created_at);

-- Creates the monthly partitions of episodic_memory from `from_month` for
-- `months` months (idempotent). Rows that already sit in the DEFAULT
-- partition for a new month are moved into it, so a late partition never
-- fails to attach.
CREATE FUNCTION engram_ensure_episodic_partitions(from_month date, months integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    created integer := 0;
    m date;
    part text;
BEGIN
    FOR i IN 0 .. months LOOP
        m := date_trunc('month', from_month)::date + make_interval(months => i);
        part := format('episodic_memory_%s', to_char(m, 'YYYY_MM'));
        IF to_regclass(part) IS NULL THEN
            EXECUTE format('CREATE TABLE %I (LIKE episodic_memory INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED)', part);
            EXECUTE format(
                'WITH moved AS (DELETE FROM episodic_memory_default WHERE created_at >= %L AND created_at < %L RETURNING *)
                 INSERT INTO %I SELECT id, tenant_id, agent_id, user_id, session_id, event_type, content, content_hash,
                     outcome, importance, embedding, embedding_model, access_count, last_accessed_at, retention,
                     private, metadata, occurred_at, created_at, updated_at, expires_at FROM moved',
                m, (m + interval '1 month')::date, part);
            EXECUTE format('ALTER TABLE episodic_memory ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                part, m, (m + interval '1 month')::date);
            created := created + 1;
        END IF;
    END LOOP;
    RETURN created;
END
$$;
