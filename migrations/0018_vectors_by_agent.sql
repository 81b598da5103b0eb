-- Each tier's vectors move into a narrow table of their own, hash-partitioned
-- by tenant and agent, where the vector leg searches them.
--
-- With one HNSW graph per table and model, an agent holding a tenth of the
-- rows walked the graph past about nine rows of other agents for each of its
-- own, and a small agent (1 % of the rows) far more; reading each candidate's
-- vector from TOAST beside its long text row made an exact scan of a small
-- agent slower still. Here:
--
--   * `{tier}_vectors` holds (tenant, agent, id, model, vector), the vector
--     kept in the row (STORAGE MAIN: no TOAST while it fits a page), so
--     reading an agent's vectors reads a few narrow pages.
--   * 32 hash partitions on (tenant_id, agent_id): a search names both, so it
--     walks one partition's graph, shared with about 1/32 of the other agents.
--   * The per-model HNSW indexes (`store::postgres::index_name` of the vector
--     table) are built on the vector tables; those of the memory tables go.
--   * The primary key (tenant_id, agent_id, id) deletes a row and counts an
--     agent's rows, which the search uses to choose an exact scan for agents
--     too small for a graph walk to pay (`store::postgres::search`).
--
-- The memory tables keep their `embedding` column and stay the record: the
-- vector tables are derived from them by the triggers below, in the writing
-- transaction, so every insert, re-embedding, move and delete (erasure,
-- retention, consolidation) reaches them with no code of its own.
--
-- Copying the vectors and building the graphs runs in the migration's
-- transaction and takes a while on a large database (the build is most of
-- it); writes to the memory tables wait until it ends.

SET LOCAL maintenance_work_mem = '512MB';

DO $$
DECLARE
    tier text;
    p int;
    m record;
BEGIN
    FOREACH tier IN ARRAY ARRAY['episodic', 'semantic', 'procedural'] LOOP
        EXECUTE format(
            'CREATE TABLE %I (tenant_id text NOT NULL, agent_id text NOT NULL, id uuid NOT NULL, '
            'embedding_model text NOT NULL, embedding vector NOT NULL, '
            'PRIMARY KEY (tenant_id, agent_id, id)) PARTITION BY HASH (tenant_id, agent_id)',
            tier || '_vectors');
        EXECUTE format('ALTER TABLE %I ALTER COLUMN embedding SET STORAGE MAIN', tier || '_vectors');
        FOR p IN 0..31 LOOP
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES WITH (MODULUS 32, REMAINDER %s)',
                           tier || '_vectors_p' || lpad(p::text, 2, '0'), tier || '_vectors', p);
        END LOOP;

        EXECUTE format(
            'INSERT INTO %I (tenant_id, agent_id, id, embedding_model, embedding) '
            'SELECT tenant_id, agent_id, id, embedding_model, embedding FROM %I WHERE embedding IS NOT NULL',
            tier || '_vectors', tier || '_memory');

        -- The memory table's graphs (named as `index_name` names them) go,
        -- and each registered model gets one on the vector table.
        FOR m IN SELECT model, dimensions FROM embedding_models ORDER BY model LOOP
            EXECUTE format('DROP INDEX IF EXISTS %I',
                tier || '_memory_hnsw_' || left(encode(sha256(convert_to(m.model, 'UTF8')), 'hex'), 12));
            EXECUTE format(
                'CREATE INDEX %I ON %I USING hnsw ((embedding::vector(%s)) vector_cosine_ops) '
                'WITH (m = 16, ef_construction = 200) WHERE embedding_model = %L',
                tier || '_vectors_hnsw_' || left(encode(sha256(convert_to(m.model, 'UTF8')), 'hex'), 12),
                tier || '_vectors', m.dimensions, m.model);
        END LOOP;

        -- The trigger keeps the vector row equal to the memory row's vector:
        -- removed with the row or its old vector, written with the new one.
        EXECUTE format($f$
            CREATE FUNCTION %I() RETURNS trigger LANGUAGE plpgsql AS $body$
            BEGIN
                IF TG_OP <> 'INSERT' THEN
                    DELETE FROM %I
                     WHERE tenant_id = OLD.tenant_id AND agent_id = OLD.agent_id AND id = OLD.id;
                END IF;
                IF TG_OP <> 'DELETE' AND NEW.embedding IS NOT NULL THEN
                    INSERT INTO %I (tenant_id, agent_id, id, embedding_model, embedding)
                    VALUES (NEW.tenant_id, NEW.agent_id, NEW.id, NEW.embedding_model, NEW.embedding);
                END IF;
                RETURN NULL;
            END
            $body$ $f$, 'engram_' || tier || '_vectors_sync', tier || '_vectors', tier || '_vectors');
        EXECUTE format(
            'CREATE TRIGGER %I AFTER INSERT OR DELETE OR UPDATE OF tenant_id, agent_id, embedding, embedding_model '
            'ON %I FOR EACH ROW EXECUTE FUNCTION %I()',
            tier || '_vectors_sync', tier || '_memory', 'engram_' || tier || '_vectors_sync');
    END LOOP;
END
$$;

-- Statistics for the new partitions now: without them the planner takes
-- every agent for a handful of rows and sorts a large agent's vectors
-- instead of walking the graph, until autovacuum gets to them.
ANALYZE episodic_vectors, semantic_vectors, procedural_vectors;
