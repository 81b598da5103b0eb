-- Episodic memory becomes one table, like semantic and procedural memory.
--
-- The monthly partitions of 0001 gave every month its own HNSW graph per
-- model, so one search walked as many graphs as there were months with
-- memories, and that walk was the vector leg's main cost. They bought
-- nothing back: a month holds rows of every retention class, so no month
-- could ever be dropped whole, and expired rows leave through the retention
-- sweep's batched deletes on `episodic_expires` either way.
--
-- The rows are copied into a plain table with the same columns, the
-- partitioned table and its partitions are dropped, and every index is built
-- again under its old name once the rows are in (faster than maintaining it
-- row by row), including the HNSW index of each registered embedding model.
-- The primary key becomes `id` alone (it had to include the partition key).
-- This runs in the migration's transaction: episodic memory is locked
-- against writes until it ends, which on a large table is a while. Plan it
-- like any table rewrite.

ALTER TABLE episodic_memory RENAME TO episodic_memory_by_month;

CREATE TABLE episodic_memory
    (LIKE episodic_memory_by_month INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED);

-- Every stored column by name (generated columns are computed again).
DO $$
DECLARE
    cols text;
BEGIN
    SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO cols
      FROM pg_attribute
     WHERE attrelid = 'episodic_memory_by_month'::regclass
       AND attnum > 0 AND NOT attisdropped AND attgenerated = '';
    EXECUTE format('INSERT INTO episodic_memory (%s) SELECT %s FROM episodic_memory_by_month', cols, cols);
END
$$;

-- Drops the partitions and their indexes with it.
DROP TABLE episodic_memory_by_month;
DROP FUNCTION engram_ensure_episodic_partitions(date, integer);

ALTER TABLE episodic_memory ADD CONSTRAINT episodic_memory_pkey PRIMARY KEY (id);
CREATE INDEX episodic_tenant_agent_created ON episodic_memory (tenant_id, agent_id, created_at DESC, id DESC);
CREATE INDEX episodic_tenant_agent_session ON episodic_memory (tenant_id, agent_id, session_id, created_at DESC);
CREATE INDEX episodic_tenant_user ON episodic_memory (tenant_id, user_id) WHERE user_id IS NOT NULL;
CREATE INDEX episodic_tenant_created ON episodic_memory (tenant_id, created_at DESC, id DESC);
CREATE INDEX episodic_tenant_id ON episodic_memory (tenant_id, id);
CREATE INDEX episodic_search_tsv ON episodic_memory USING gin (search_tsv);
CREATE INDEX episodic_expires ON episodic_memory (expires_at) WHERE expires_at IS NOT NULL;

-- One HNSW index per registered model, named as the server names it
-- (`store::postgres::index_name`: the table, "_hnsw_", 12 hex digits of the
-- model name's SHA-256) and built with the server's parameters.
DO $$
DECLARE
    m record;
BEGIN
    FOR m IN SELECT model, dimensions FROM embedding_models ORDER BY model LOOP
        EXECUTE format(
            'CREATE INDEX %I ON episodic_memory USING hnsw ((embedding::vector(%s)) vector_cosine_ops) '
            'WITH (m = 16, ef_construction = 200) WHERE embedding_model = %L',
            'episodic_memory_hnsw_' || left(encode(sha256(convert_to(m.model, 'UTF8')), 'hex'), 12),
            m.dimensions, m.model);
    END LOOP;
END
$$;
